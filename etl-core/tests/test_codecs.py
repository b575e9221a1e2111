"""Postgres text -> Arrow: a type matrix checked against what Postgres itself reports for the same values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from etl.errors import TableError
from etl.postgres.codecs import (
    BUILTIN_ARRAYS,
    BUILTIN_TYPES,
    DATE_INFINITY,
    DATE_MINUS_INFINITY,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    TIMESTAMP_INFINITY,
    TIMESTAMP_MINUS_INFINITY,
    arrow_field,
    arrow_type,
    decode_text_column,
    parse_array,
    python_values,
)
from etl.schema import ColumnSchema
from etl.testing.pytest_plugin import TestDatabase


@dataclass(frozen=True)
class Case:
    """One column of the matrix: its SQL type, literal values (None is NULL) and how to check it.

    ``expect`` is the SQL expression (``{c}`` is the column) that psycopg loads as the expected
    Python value of each row, ``text`` (the output function's text), or one of the storage checks
    ``days``, ``micros`` and ``interval``.
    """

    sql_type: str
    values: tuple[str | None, ...]
    arrow: pa.DataType
    expect: str = "{c}"


UNICODE = "'ünïcødé ☃ 𝄞'"
TRICKY_TEXT = "E'quote\" back\\\\slash, comma {brace} tab\\t'"
TEXT = "text"
"""Expect the exact text the type's output function writes."""

CASES: dict[str, Case] = {
    "bool": Case("boolean", ("true", "false", None), pa.bool_()),
    "int2": Case("smallint", ("-32768", "32767", "0"), pa.int16()),
    "int4": Case("integer", ("-2147483648", "2147483647", None), pa.int32()),
    "int8": Case("bigint", ("-9223372036854775808", "9223372036854775807", "0"), pa.int64()),
    "oid": Case("oid", ("0", "4294967295", "16384"), pa.int64()),
    "float4": Case(
        "real", ("'NaN'", "'Infinity'", "'-Infinity'", "1.2345679e20", "-0.0", "1.17549435e-38", "3.4028235e38"),
        pa.float32(), "{c}::float8",
    ),
    "float8": Case(
        "double precision",
        ("'NaN'", "'Infinity'", "'-Infinity'", "0.1", "1.7976931348623157e308", "5e-324", "-0.0", None),
        pa.float64(),
    ),
    "numeric_10_2": Case("numeric(10, 2)", ("12345678.91", "-0.01", "0", None), pa.decimal128(10, 2)),
    "numeric_38_0": Case("numeric(38)", ("99999999999999999999999999999999999999", "-1"), pa.decimal128(38, 0)),
    "numeric_60_20": Case(
        "numeric(60, 20)", ("1234567890123456789012345678901234567890.12345678901234567890",), pa.decimal256(60, 20)
    ),
    "numeric_neg_scale": Case("numeric(5, -2)", ("12345", "-99900"), pa.decimal128(5, -2)),
    "numeric": Case(
        "numeric",
        ("'NaN'", "'Infinity'", "'-Infinity'", "1e-1000", "123456789012345678901234567890.123456789", "0.10", None),
        pa.string(), TEXT,
    ),
    "numeric_100": Case("numeric(100, 3)", ("1.5", None), pa.string(), TEXT),
    "text": Case("text", ("''", UNICODE, TRICKY_TEXT, None, "'NULL'"), pa.string()),
    "varchar": Case("varchar(5)", ("'ab'", "''"), pa.string()),
    "bpchar": Case("char(4)", ("'ab'", "''", "'abcd'"), pa.string()),  # padding kept: 'ab  '
    "name": Case("name", ("'pg_class'",), pa.string()),
    "char": Case('"char"', ("'a'", "''"), pa.string()),
    "bytea": Case("bytea", ("'\\x00ff10'", "''", None, "decode(repeat('ab', 3000), 'hex')"), pa.binary()),
    "date": Case(
        "date",
        (
            "'2024-02-29'", "'infinity'", "'-infinity'", "'0044-03-15 BC'", "'0001-01-01'", "'0001-12-31 BC'",
            "'4713-01-01 BC'", "'5874897-12-31'", "'1970-01-01'", "'1969-12-31'", None,
        ),
        pa.date32(), "days",
    ),
    "timestamp": Case(
        "timestamp",
        (
            "'2024-02-29 12:34:56.789012'", "'infinity'", "'-infinity'", "'0044-03-15 12:00:00 BC'",
            "'294246-12-31 23:59:59.999999'", "'4713-01-01 00:00:00 BC'", "'1969-12-31 23:59:59.5'",
            "'2000-01-01'", None,
        ),
        pa.timestamp("us"), "micros",
    ),
    "timestamptz": Case(
        "timestamptz",
        (
            "'2024-02-29 12:34:56.789012+05:30'", "'infinity'", "'-infinity'", "'0044-03-15 12:00:00+00 BC'",
            "'1969-12-31 23:59:59.000001-08'", "'10000-01-01 00:00:00+00'", None,
        ),
        pa.timestamp("us", tz="UTC"), "micros",
    ),
    "time": Case(
        "time", ("'00:00:00'", "'23:59:59.999999'", "'12:34:56.5'", None), pa.time64("us"),
        "(extract(epoch FROM {c}) * 1000000)::bigint",
    ),
    "timetz": Case("timetz", ("'12:34:56.5+05:30'", None), pa.string(), TEXT),
    "interval": Case(
        "interval",
        (
            "'1 year 2 months 3 days 04:05:06.789'", "'-1 days +02:03:00'", "'0'", "'-00:00:01.5'",
            "'178000000 years'", "'-3 mons -100:00:00'", "'1 day -1 microsecond'", None,
        ),
        pa.month_day_nano_interval(), "interval",
    ),
    "uuid": Case("uuid", ("'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", None), pa.string(), TEXT),
    "json": Case("json", ("'{\"b\": 1,   \"a\": [1, 2.50]}'", "'null'", None), pa.string(), TEXT),
    "jsonb": Case("jsonb", ("'{\"b\": 1,   \"a\": [1, 2.50]}'", "'\"☃\"'"), pa.string(), TEXT),
    "inet": Case("inet", ("'192.168.0.1/24'", "'::1'"), pa.string(), TEXT),
    "cidr": Case("cidr", ("'10.0.0.0/8'",), pa.string(), TEXT),
    "macaddr": Case("macaddr", ("'08:00:2b:01:02:03'",), pa.string(), TEXT),
    "macaddr8": Case("macaddr8", ("'08:00:2b:01:02:03:04:05'",), pa.string(), TEXT),
    "money": Case("money", ("'12.34'", "'-1000000.5'"), pa.string(), TEXT),
    "bit": Case("bit(4)", ("B'1010'",), pa.string(), TEXT),
    "varbit": Case("varbit", ("B'101'", "B''"), pa.string(), TEXT),
    "tsvector": Case("tsvector", ("'a fat cat'",), pa.string(), TEXT),
    "point": Case("point", ("'(1.5,2)'",), pa.string(), TEXT),
    "box": Case("box", ("'(1,2),(0,0)'",), pa.string(), TEXT),
    "int4range": Case("int4range", ("'[1,10)'", "'empty'"), pa.string(), TEXT),
    "pg_lsn": Case("pg_lsn", ("'16/B374D848'",), pa.string(), TEXT),
    "enum": Case("mood", ("'happy'",), pa.string(), TEXT),
    "domain": Case("positive", ("42",), pa.string(), TEXT),
    "composite": Case("pair", ("ROW(1, 'x y')::pair", "ROW(NULL, '')::pair"), pa.string(), TEXT),
    "int4_array": Case("integer[]", ("'{1,NULL,3}'", "'{}'", None, "'[0:2]={7,8,9}'"), pa.list_(pa.int32())),
    "text_array": Case(
        "text[]",
        (f"ARRAY[{TRICKY_TEXT}, NULL, 'NULL', '', {UNICODE}, 'a,b', ' lead', 'nul\\l']", "'{}'"),
        pa.list_(pa.string()),
    ),
    "int4_2d": Case("integer[][]", ("'{{1,2},{3,NULL}}'", "'{}'", None), pa.list_(pa.list_(pa.int32()))),
    "numeric_array": Case("numeric(6, 2)[]", ("'{1.5,NULL,-2}'",), pa.list_(pa.decimal128(6, 2))),
    "bool_array": Case("boolean[]", ("'{t,f,NULL}'",), pa.list_(pa.bool_())),
    "float8_array": Case("float8[]", ("'{1.5,Infinity,-0}'",), pa.list_(pa.float64())),
    "bytea_array": Case("bytea[]", ("ARRAY['\\x01'::bytea, NULL, '']",), pa.list_(pa.binary())),
    "date_array": Case("date[]", ("'{2024-02-29,NULL,1970-01-01}'",), pa.list_(pa.date32())),
    "timestamptz_array": Case(
        "timestamptz[]", ("'{\"2024-02-29 12:34:56.5+00\",NULL}'",), pa.list_(pa.timestamp("us", tz="UTC"))
    ),
    "uuid_array": Case("uuid[]", ("'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}'",), pa.list_(pa.string()), "{c}::text[]"),
    "jsonb_array": Case("jsonb[]", ("ARRAY['{\"a\": \"x,}\"}'::jsonb, NULL]",), pa.list_(pa.string()), "{c}::text[]"),
    "box_array": Case("box[]", ("ARRAY['(1,2),(0,0)'::box, '(3,3),(1,1)']",), pa.list_(pa.string()), "{c}::text[]"),
    "enum_array": Case("mood[]", ("'{sad,happy,NULL}'",), pa.list_(pa.string()), "{c}::text[]"),
}  # fmt: skip

INFINITE_INTERVALS = ("'infinity'", "'-infinity'")
"""Postgres 17 and later: added to the interval column of the matrix."""

SETUP = (
    "CREATE TYPE mood AS ENUM ('sad', 'happy');"
    "CREATE DOMAIN positive AS integer CHECK (VALUE > 0);"
    "CREATE TYPE pair AS (a integer, b text);"
)

Conn = psycopg.Connection[Any]


def quote(name: str) -> str:
    return '"' + name + '"'


def output_text(conn: Conn, sql: str) -> list[str | None]:
    """The first column of ``sql`` exactly as the type's output function writes it (as COPY and pgoutput do).

    (A ``::text`` cast is not the same: ``true::text`` is 'true' where the output function writes 't'.)
    """
    cur = conn.execute(sql)
    result = cur.pgresult
    assert result is not None
    return [None if (raw := result.get_value(i, 0)) is None else raw.decode() for i in range(result.ntuples)]


def column_schemas(conn: Conn, table: str) -> dict[str, ColumnSchema]:
    """The columns as a catalog describes them: format_type, with one [] per declared array dimension."""
    rows = conn.execute(
        "SELECT attname, atttypid::int, atttypmod,"
        " format_type(atttypid, atttypmod) || repeat('[]', greatest(attndims - 1, 0))"
        " FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (table,),
    ).fetchall()
    return {name: ColumnSchema(name, oid, typmod, type_name=type_name) for name, oid, typmod, type_name in rows}


@pytest.fixture
def matrix(pg_database: TestDatabase) -> tuple[Conn, dict[str, ColumnSchema], dict[str, tuple[str | None, ...]]]:
    """A table with a column per case and a row per value (NULL where a column has fewer values)."""
    conn = pg_database.connect()  # the engine's text forms, a person's search_path
    conn.execute(SETUP)
    columns = ", ".join(f"{quote(name)} {case.sql_type}" for name, case in CASES.items())
    conn.execute(f"CREATE TABLE matrix (id serial PRIMARY KEY, {columns})")
    values = {name: case.values for name, case in CASES.items()}
    if pg_database.major >= 17:
        values["interval"] += INFINITE_INTERVALS
    for row in range(max(len(v) for v in values.values())):
        names = [n for n, v in values.items() if row < len(v)]
        literals = ", ".join(values[n][row] or "NULL" for n in names)
        conn.execute(f"INSERT INTO matrix ({', '.join(map(quote, names))}) VALUES ({literals})")
    return conn, column_schemas(conn, "matrix"), values


def expected_of(conn: Conn, name: str, case: Case) -> list[Any]:
    """What Postgres says each row holds, in the form ``as_comparable`` gives the decoded column."""
    c = quote(name)
    if case.expect == TEXT:
        return output_text(conn, f"SELECT {c} FROM matrix ORDER BY id")
    if case.expect == "days":
        sql = (
            f"CASE WHEN {c} = 'infinity' THEN {DATE_INFINITY} WHEN {c} = '-infinity' THEN {DATE_MINUS_INFINITY}"
            f" ELSE {c} - DATE '1970-01-01' END"
        )
    elif case.expect == "micros":
        sql = (
            f"CASE WHEN {c} = 'infinity' THEN {TIMESTAMP_INFINITY} WHEN {c} = '-infinity'"
            f" THEN {TIMESTAMP_MINUS_INFINITY}"
            f" ELSE (extract(epoch FROM {c}) * 1000000)::bigint END"
        )
    elif case.expect == "interval":
        sql = (
            f"CASE WHEN {c} IS NULL THEN NULL WHEN isfinite({c}) THEN format('%s %s %s',"
            f" extract(year FROM {c}) * 12 + extract(month FROM {c}), extract(day FROM {c}),"
            f" (extract(hour FROM {c}) * 3600 + extract(minute FROM {c}) * 60) * 1000000"
            f" + extract(microseconds FROM {c})) WHEN {c} > '0' THEN 'infinity' ELSE '-infinity' END"
        )
    else:
        sql = case.expect.format(c=c)
    return [row[0] for row in conn.execute(f"SELECT {sql} FROM matrix ORDER BY id")]


def as_comparable(decoded: pa.Array) -> list[Any]:
    """Dates as days, times and timestamps as microseconds (their storage), intervals as in ``expected_of``."""
    if pa.types.is_date32(decoded.type):
        return decoded.cast(pa.int32()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_timestamp(decoded.type) or pa.types.is_time64(decoded.type):
        return decoded.cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]
    if decoded.type == pa.month_day_nano_interval():
        return [_interval_text(v) for v in decoded.to_pylist()]
    if decoded.type == pa.float32():
        return decoded.cast(pa.float64()).to_pylist()  # type: ignore[no-any-return]
    return decoded.to_pylist()  # type: ignore[no-any-return]


def _interval_text(value: Any) -> str | None:
    if value is None:
        return None
    if (value.months, value.days, value.nanoseconds) == (INT32_MAX, INT32_MAX, INT64_MAX):
        return "infinity"
    if (value.months, value.days, value.nanoseconds) == (INT32_MIN, INT32_MIN, INT64_MIN):
        return "-infinity"
    assert value.nanoseconds % 1000 == 0
    return f"{value.months} {value.days} {value.nanoseconds // 1000}"


def same(a: Any, b: Any) -> bool:
    """Equal values of the same type, NaN equal to NaN, element by element in lists."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, Decimal) and isinstance(b, Decimal) and a.is_nan():
        return b.is_nan()
    return type(a) is type(b) and bool(a == b)


def test_type_matrix_matches_postgres(matrix: tuple[Conn, dict[str, ColumnSchema], Any]) -> None:
    conn, schemas, _ = matrix
    for name, case in CASES.items():
        column = schemas[name]
        texts = output_text(conn, f"SELECT {quote(name)} FROM matrix ORDER BY id")
        decoded = decode_text_column(column, pa.array(texts, pa.string()))
        assert arrow_type(column) == case.arrow == decoded.type, name
        decoded.validate(full=True)
        assert [t is None for t in texts] == decoded.is_null().to_pylist(), f"{name}: nothing becomes NULL"
        expected, got = expected_of(conn, name, case), as_comparable(decoded)
        assert same(got, expected), f"{name}: {got} != {expected}"


def test_python_values_of_dates_outside_python_are_postgres_text(
    matrix: tuple[Conn, dict[str, ColumnSchema], Any],
) -> None:
    conn, schemas, _ = matrix
    for name in ("date", "timestamp", "timestamptz"):
        sql = f"SELECT {quote(name)} FROM matrix ORDER BY id"
        texts = output_text(conn, sql)
        values = python_values(decode_text_column(schemas[name], pa.array(texts, pa.string())))
        in_range_sql = f"SELECT {quote(name)} BETWEEN '0001-01-01' AND '9999-12-31' FROM matrix ORDER BY id"
        in_python_range = [row[0] for row in conn.execute(in_range_sql)]
        for value, text, in_range in zip(values, texts, in_python_range, strict=True):
            if in_range:
                assert not isinstance(value, str)
                loaded = conn.execute(f"SELECT %s::{CASES[name].sql_type}", (text,)).fetchone()
                assert loaded is not None and value == loaded[0], name
            else:
                assert value == text, name  # infinity, BC and far-future values: exactly Postgres's text
    nested = decode_text_column(ColumnSchema("d", 1182), pa.array(["{2024-02-29,infinity,NULL}", None]))
    assert python_values(nested) == [[date(2024, 2, 29), "infinity", None], None]


def test_strings_keep_exact_text(matrix: tuple[Conn, dict[str, ColumnSchema], Any]) -> None:
    conn, schemas, _ = matrix
    for name in ("numeric", "bpchar", "timetz", "json", "jsonb", "money", "uuid", "composite", "enum", "domain"):
        texts = output_text(conn, f"SELECT {quote(name)} FROM matrix ORDER BY id")
        assert decode_text_column(schemas[name], pa.array(texts, pa.string())).to_pylist() == texts
    # uuid comes out canonical lowercase whatever case it went in with
    assert conn.execute("SELECT uuid::text FROM matrix WHERE id = 1").fetchone() == (
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    )


def test_chunked_arrays_and_null_typed_input() -> None:
    column = ColumnSchema("d", 1082)
    chunked = pa.chunked_array([pa.array(["2024-01-01", None]), pa.array(["infinity"])])
    decoded = decode_text_column(column, chunked)
    assert isinstance(decoded, pa.ChunkedArray) and decoded.type == pa.date32()
    assert decoded.cast(pa.int32()).to_pylist() == [19723, None, INT32_MAX]
    assert decode_text_column(ColumnSchema("i", 23), pa.nulls(3)).to_pylist() == [None, None, None]
    big = pa.array(["2024-01-01 00:00:00"] * 3, pa.large_string())
    assert decode_text_column(ColumnSchema("t", 1114), big).type == pa.timestamp("us")


def test_infinities_are_the_extremes_duckdb_reads_as_infinite() -> None:
    """DuckDB's infinite dates and timestamps are the type's maximum and its negation (the minimum is a finite
    date in 5877642 BC to DuckDB)."""
    texts = pa.array(["infinity", "-infinity"])
    assert decode_text_column(ColumnSchema("d", 1082), texts).cast(pa.int32()).to_pylist() == [2**31 - 1, -(2**31 - 1)]
    for oid in (1114, 1184):
        decoded = decode_text_column(ColumnSchema("t", oid), texts)
        assert decoded.cast(pa.int64()).to_pylist() == [2**63 - 1, -(2**63 - 1)]
        assert python_values(decoded) == ["infinity", "-infinity"]
    assert (DATE_INFINITY, DATE_MINUS_INFINITY) == (2**31 - 1, -(2**31 - 1))
    assert (TIMESTAMP_INFINITY, TIMESTAMP_MINUS_INFINITY) == (2**63 - 1, -(2**63 - 1))


def test_arrow_field_carries_postgres_type() -> None:
    column = ColumnSchema("amount", 1700, (10 << 16 | 2) + 4, nullable=False, type_name="numeric(10,2)")
    field = arrow_field(column)
    assert field.name == "amount" and field.type == pa.decimal128(10, 2) and field.nullable
    assert field.metadata == {b"pg.type_oid": b"1700", b"pg.type_name": b"numeric(10,2)", b"pg.typmod": b"655366"}
    assert arrow_field(ColumnSchema("ids", 1016)).metadata[b"pg.type_name"] == b"_int8"
    assert arrow_field(ColumnSchema("x", 987654)).type == pa.string()


def test_builtin_type_tables_match_pg_type(pg_database: TestDatabase) -> None:
    rows = pg_database.execute("SELECT oid::int, typname, typelem::int, typdelim FROM pg_type WHERE oid < 10000")
    catalog = {oid: (name, elem, delim) for oid, name, elem, delim in rows}
    for oid, name in BUILTIN_TYPES.items():
        assert catalog[oid][0] == name
    for oid, element in BUILTIN_ARRAYS.items():
        assert catalog[oid] == ("_" + BUILTIN_TYPES[element], element, catalog[oid][2])
        assert catalog[oid][2] == (";" if oid == 1020 else ",")  # box arrays are the exception


def _text_of(conn: Conn, sql: str) -> pa.Array:
    return pa.array(output_text(conn, sql), pa.string())


def test_values_that_cannot_be_represented_raise(pg_database: TestDatabase) -> None:
    with pg_database.connect() as conn:
        conn.execute("CREATE TABLE bad (n numeric(10, 2), t time, a integer[], ts timestamp)")
        conn.execute("INSERT INTO bad VALUES ('NaN', '24:00:00', '{{1,2},{3,4}}', '294276-12-31 23:59:59.999999')")
        schemas = column_schemas(conn, "bad")
        with pytest.raises(TableError, match=r"'n' \(numeric\(10,2\)\): NaN in a numeric\(10,2\) column") as nan:
            decode_text_column(schemas["n"], _text_of(conn, "SELECT n FROM bad"))
        assert nan.value.hint is not None and "unconstrained numeric" in nan.value.hint
        with pytest.raises(TableError, match="24:00:00 cannot be stored"):
            decode_text_column(schemas["t"], _text_of(conn, "SELECT t FROM bad"))
        with pytest.raises(TableError, match="2-dimensional array in a column of 1-dimensional arrays") as dims:
            decode_text_column(schemas["a"], _text_of(conn, "SELECT a FROM bad"))
        assert dims.value.hint is not None and "[]" in dims.value.hint
        with pytest.raises(TableError, match="outside Arrow's range"):  # Postgres reaches 294276 AD
            decode_text_column(schemas["ts"], _text_of(conn, "SELECT ts FROM bad"))


def test_unpinned_session_settings_are_named(pg_database: TestDatabase) -> None:
    """Text forms other than the pinned ones are rejected with a hint naming the setting, never misread."""
    with pg_database.connect() as conn:
        conn.execute("SET DateStyle = 'German'; SET bytea_output = 'escape'; SET IntervalStyle = 'sql_standard'")
        cases = {
            ColumnSchema("d", 1082): ("SELECT '2024-02-29'::date", "DateStyle"),
            ColumnSchema("t", 1114): ("SELECT '2024-02-29 12:00'::timestamp", "DateStyle"),
            ColumnSchema("b", 17): ("SELECT 'ab'::bytea", "bytea_output"),
            ColumnSchema("i", 1186): ("SELECT '1 year 2 days'::interval", "IntervalStyle"),
        }
        for column, (sql, setting) in cases.items():
            with pytest.raises(TableError) as error:
                decode_text_column(column, _text_of(conn, sql))
            assert error.value.hint is not None and setting in error.value.hint, column.name


def test_parse_array_literals() -> None:
    assert parse_array('{a,"b c",NULL,"NULL","",{}}') == ["a", "b c", None, "NULL", "", []]
    assert parse_array('{"\\\\\\"",x}') == ['\\"', "x"]
    assert parse_array("[1:1][-1:0]={{1,2}}") == [["1", "2"]]
    assert parse_array("{(0,0),(1,1);(2,2),(3,3)}", ";") == ["(0,0),(1,1)", "(2,2),(3,3)"]
    for broken in ("{1,2", "1,2}", "{1}{2}", '{"a}', ""):
        with pytest.raises(ValueError, match="not an array literal"):
            parse_array(broken)


def test_malformed_values_are_rejected_not_misread() -> None:
    cases = {
        ColumnSchema("b", 17): ["\\x0a  0b", "\\x0a0b"],  # hex with blanks would shift the following values
        ColumnSchema("h", 17): ["\\xzz"],
        ColumnSchema("f", 16): ["t", "yes"],
        ColumnSchema("i", 23): ["1.5"],
        ColumnSchema("a", 1007): ["{1,2"],
    }
    for column, values in cases.items():
        with pytest.raises(TableError, match=f"column '{column.name}'"):
            decode_text_column(column, pa.array(values, pa.string()))
