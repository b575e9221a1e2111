"""Postgres -> BigQuery column types, the Arrow form values are staged in, and the checks that keep values exact.

Values travel Arrow -> Spark -> Parquet -> a staging table (load job) -> the target (SQL). Each type
has a staging form Spark writes as Parquet, and the SQL expression that turns the staged column into
the target type. Values BigQuery cannot hold (dates and timestamps outside years 1-9999, including
Postgres ``infinity``; arrays with NULL elements; JSON integers beyond 64 bits) raise ``TableError``:
the table goes Errored, nothing is changed silently. Columns BigQuery has no type for (arrays of more
than one dimension; arrays of numeric, time, timestamp, interval, json, jsonb) error the table when
it is created or altered. See docs/destinations/bigquery.md; keep the two in step.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from etl.api import (
    BUILTIN_ARRAYS,
    COMMIT_LSN_COLUMN,
    OLD_COLUMN,
    TX_ORDINAL_COLUMN,
    ColumnSchema,
    TableError,
    TableSchema,
    decode_text_column,
)
from etl_spark.bigquery.names import column_name
from etl_spark.ducklake.types import interval_text, numeric_precision_scale


@dataclass(frozen=True)
class BqType:
    ddl: str
    """The BigQuery column type."""
    staged: pa.DataType
    """The Arrow type handed to Spark (and so the Parquet type of the staging table)."""
    load: str = "{}"
    """SQL turning the staged column (``{}``) into ``ddl``."""


_EXACT_JSON: Final = "PARSE_JSON({})"
"""A JSON number BigQuery cannot store exactly (integers outside [-2**63, 2**64)) becomes FLOAT64 or fails the
statement, depending on ``wide_number_mode``: ``staged`` refuses such values before anything is written."""
_JSON_INTEGERS: Final = (-(2**63), 2**64 - 1)
_LONG_DIGITS: Final = r"[0-9]{19}"
"""Values holding a run of 19 digits may hold an integer beyond 64 bits; only those are parsed."""
_STRING: Final = BqType("STRING", pa.string())
_SCALARS: Final[dict[int, BqType]] = {
    16: BqType("BOOL", pa.bool_()),
    21: BqType("INT64", pa.int64()),
    23: BqType("INT64", pa.int64()),
    20: BqType("INT64", pa.int64()),
    26: BqType("INT64", pa.int64()),  # oid
    700: BqType("FLOAT64", pa.float64()),  # NaN and infinities exist in FLOAT64
    701: BqType("FLOAT64", pa.float64()),
    1082: BqType("DATE", pa.date32()),
    1083: BqType("TIME", pa.string(), "CAST({} AS TIME)"),
    1114: BqType("DATETIME", pa.timestamp("us", tz="UTC"), "DATETIME({}, 'UTC')"),
    1184: BqType("TIMESTAMP", pa.timestamp("us", tz="UTC")),
    17: BqType("BYTES", pa.binary()),
    114: BqType("JSON", pa.string(), _EXACT_JSON),
    3802: BqType("JSON", pa.string(), _EXACT_JSON),
    2950: _STRING,  # uuid
    1186: _STRING,  # interval, as '<m> months <d> days <us> microseconds'
}
_NUMERIC_OID: Final = 1700
_CONVERTED_ELEMENTS: Final = frozenset({_NUMERIC_OID, 1083, 1114, 1186, 114, 3802})
"""numeric, time, timestamp, interval, json and jsonb: their arrays have no mapping (the table errors)."""

# Days and microseconds since 1970-01-01 of 0001-01-01 and of the end of 9999-12-31.
_MIN_DAYS: Final = (dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days
_MAX_DAYS: Final = (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days
_MIN_MICROS: Final = _MIN_DAYS * 86_400_000_000
_MAX_MICROS: Final = (_MAX_DAYS + 1) * 86_400_000_000 - 1


def bq_type(column: ColumnSchema) -> BqType:
    """The BigQuery type of a source column (see the module docstring and the guide)."""
    if column.type_oid == _NUMERIC_OID:
        precision, scale = numeric_precision_scale(column.type_modifier)
        if precision is None or scale < 0:
            return _STRING  # unconstrained: exact text, NaN and infinities included
        if scale <= 9 and precision - scale <= 29:
            return BqType("NUMERIC", pa.string(), "CAST({} AS NUMERIC)")
        if scale <= 38 and precision - scale <= 38:
            return BqType("BIGNUMERIC", pa.string(), "CAST({} AS BIGNUMERIC)")
        return _STRING
    if column.type_oid in _SCALARS:
        return _SCALARS[column.type_oid]
    element = _array_element(column)
    if element is not None and element not in _CONVERTED_ELEMENTS:
        inner = _SCALARS.get(element, _STRING)  # other types (enums, inet, ...) arrive as text
        return BqType(f"ARRAY<{inner.ddl}>", pa.list_(inner.staged))
    return _STRING


def _array_element(column: ColumnSchema) -> int | None:
    """The element type OID of an array column (0 when not built in), ``None`` for other columns."""
    if column.type_oid in BUILTIN_ARRAYS:
        return BUILTIN_ARRAYS[column.type_oid]
    return 0 if column.type_name.endswith("[]") else None


RESERVED_PREFIX: Final = "_etl_"


def check_columns(schema: TableSchema) -> None:
    """Refuse columns BigQuery has no type for: arrays of more than one dimension (no ARRAY<ARRAY<...>>), and
    arrays of numeric, time, timestamp, interval, json or jsonb (their elements need conversions); and names
    starting with ``_etl_``, which the destination's own columns use in its staging tables and statements."""
    for column in schema.columns:
        if column.name.startswith(RESERVED_PREFIX):
            raise TableError(
                f"{schema.name}: column {column.name} starts with {RESERVED_PREFIX}, which the bigquery destination"
                " reserves for its own columns",
                hint="rename the column at the source, or leave it out of the publication (a column list), then"
                " resync the table",
                table_id=schema.id,
            )
        dimensions = column.type_name.count("[]")
        if dimensions > 1:
            problem = f"an array of {dimensions} dimensions; BigQuery has no arrays of arrays"
        elif _array_element(column) in _CONVERTED_ELEMENTS:
            problem = "an array whose elements this destination cannot convert to a BigQuery array"
        else:
            continue
        raise TableError(
            f"{schema.name}: column {column.name} is {column.type_name or column.type_oid}, {problem}",
            hint="leave the column out of the publication (a column list), or make it a one-dimensional array of"
            " another type, text or jsonb at the source, then resync the table",
            table_id=schema.id,
        )


def is_array(column: ColumnSchema) -> bool:
    """Whether ``column`` is a BigQuery ARRAY: no ``=``, no primary key, no clustering on it."""
    return bq_type(column).ddl.startswith("ARRAY<")


_PRIMARY_KEY_TYPES: Final = frozenset(
    {"BIGNUMERIC", "BOOL", "DATE", "DATETIME", "INT64", "NUMERIC", "STRING", "TIMESTAMP"}
)
"""The types BigQuery allows in a primary key (not ARRAY, BYTES, FLOAT64, JSON, TIME)."""


def table_ddl(schema: TableSchema, *, primary_key: bool = True) -> str:
    """Column definitions and (with ``primary_key``) the primary key of the target table (all columns
    nullable, see the guide). A key with a column of a type BigQuery refuses in a primary key (an array)
    is not declared at all: its other columns alone are not unique, and BigQuery trusts what is declared."""
    check_columns(schema)
    columns = [f"{column_name(c.name)} {bq_type(c).ddl}" for c in schema.columns]
    key = schema.key_columns
    if key and primary_key and all(bq_type(c).ddl in _PRIMARY_KEY_TYPES for c in key):
        columns.append(f"PRIMARY KEY ({', '.join(column_name(c.name) for c in key)}) NOT ENFORCED")
    return ", ".join(columns)


CLUSTER_COLUMNS: Final = 4
"""BigQuery clusters a table by at most four columns."""


def table_options(schema: TableSchema, partition_by: str | None) -> str:
    """``PARTITION BY`` and ``CLUSTER BY`` of a new target table: clustered by its key (its first four
    columns but arrays, which BigQuery cannot cluster by), so a batch's DELETE of touched keys reads only
    their blocks; partitioned by day on ``partition_by`` (a date or timestamp column) when given."""
    options = []
    if partition_by is not None:
        column = next((c for c in schema.columns if c.name == partition_by), None)
        kind = bq_type(column).ddl if column is not None else None
        if kind not in ("DATE", "TIMESTAMP", "DATETIME"):
            raise TableError(
                f"{schema.name}: partition_by names {partition_by!r}, not a date or timestamp column of the table",
                hint="name a date, timestamp or timestamptz column in the destination's partition_by",
                table_id=schema.id,
            )
        name = column_name(partition_by)
        options.append(f"PARTITION BY {name if kind == 'DATE' else f'DATE({name})'}")
    key = [column_name(c.name) for c in schema.key_columns if not is_array(c)][:CLUSTER_COLUMNS]
    if key:
        options.append(f"CLUSTER BY {', '.join(key)}")
    return " ".join(options)


def staged(schema: TableSchema, column: ColumnSchema, values: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    """A source column's values in their staging form, after checking BigQuery can hold each of them."""
    target = bq_type(column)
    chunked = values if isinstance(values, pa.ChunkedArray) else pa.chunked_array([values], values.type)
    kind = chunked.type
    _check_values(schema, column, chunked)
    if pa.types.is_list(kind):
        _check_elements(schema, column, chunked)
    elif target.load == _EXACT_JSON:
        _check_json_integers(schema, column, chunked)
    if kind == target.staged:
        return chunked
    if kind == pa.month_day_nano_interval():
        return interval_text(chunked)
    if pa.types.is_time(kind):
        return pc.cast(pc.cast(chunked, pa.time64("us")), pa.string())
    if pa.types.is_binary(kind) and target.staged == pa.string():
        raise _error(schema, column, "binary values cannot be staged as text")
    return pc.cast(chunked, target.staged)


def _check_values(schema: TableSchema, column: ColumnSchema, values: pa.ChunkedArray) -> None:
    """Dates and timestamps, also as array elements, within years 1 to 9999."""
    kind = values.type
    if pa.types.is_list(kind):
        elements = [pc.list_flatten(chunk) for chunk in values.chunks]
        _check_values(schema, column, pa.chunked_array(elements, kind.value_type))
    elif pa.types.is_date32(kind):
        _check_range(schema, column, pc.cast(values, pa.int32()), _MIN_DAYS, _MAX_DAYS)
    elif pa.types.is_timestamp(kind):
        _check_range(schema, column, pc.cast(values, pa.int64()), _MIN_MICROS, _MAX_MICROS)


def _check_range(schema: TableSchema, column: ColumnSchema, values: pa.ChunkedArray, low: int, high: int) -> None:
    outside = pc.or_(pc.less(values, low), pc.greater(values, high))
    if pc.any(outside).as_py():
        raise _error(
            schema,
            column,
            "holds a value outside BigQuery's range for dates and times (years 1 to 9999; Postgres infinity and"
            " BC dates do not fit)",
        )


def _check_elements(schema: TableSchema, column: ColumnSchema, values: pa.ChunkedArray) -> None:
    if any(pc.list_flatten(chunk).null_count for chunk in values.chunks):
        raise _error(schema, column, "holds an array with a NULL element, which BigQuery arrays cannot hold")


def _check_json_integers(schema: TableSchema, column: ColumnSchema, values: pa.ChunkedArray) -> None:
    low, high = _JSON_INTEGERS

    def exact(text: str) -> int:
        number = int(text)
        if not low <= number <= high:
            raise _error(
                schema,
                column,
                f"holds the JSON integer {text[:12]}... ({len(text.lstrip('-'))} digits), beyond the 64-bit integers"
                " BigQuery's JSON type stores exactly",
                hint="store such numbers as JSON strings at the source (or change the column's type to text),"
                " then resync the table",
            )
        return number

    for chunk in values.chunks:
        suspects = chunk.filter(pc.fill_null(pc.match_substring_regex(chunk, _LONG_DIGITS), False))
        for text in suspects.to_pylist():
            with contextlib.suppress(json.JSONDecodeError):  # not JSON: PARSE_JSON rejects it with its message
                json.loads(text, parse_int=exact)


def _error(schema: TableSchema, column: ColumnSchema, what: str, hint: str = "") -> TableError:
    return TableError(
        f"{schema.name}: column {column.name} {what}",
        hint=hint or "replace the value at the source (or change the column's type to text), then resync the table",
        table_id=schema.id,
    )


def literal(schema: TableSchema, column: ColumnSchema, text: str) -> str:
    """A SQL expression of the target type for one value in Postgres's text form (checked as a staged value is)."""
    target = bq_type(column)
    value = staged(schema, column, decode_text_column(column, pa.array([text], pa.string())))[0].as_py()
    if isinstance(value, list):
        return f"{target.ddl}[{', '.join(_literal(v, target.staged.value_type) for v in value)}]"
    return target.load.format(_literal(value, target.staged))


def _literal(value: object, kind: pa.DataType) -> str:
    """A staged value as SQL."""
    if value is None:
        return "NULL"
    if pa.types.is_boolean(kind):
        return "TRUE" if value else "FALSE"
    if pa.types.is_integer(kind):
        return str(int(value))  # type: ignore[call-overload]
    if pa.types.is_floating(kind):
        return f"CAST('{value!r}' AS FLOAT64)"  # repr round-trips, and spells nan and inf as BigQuery reads them
    if isinstance(value, dt.date):  # dates, and timestamps (datetimes, in UTC)
        return f"{'TIMESTAMP' if isinstance(value, dt.datetime) else 'DATE'} '{value.isoformat()}'"
    if isinstance(value, bytes):
        return f"FROM_BASE64('{base64.b64encode(value).decode()}')"
    return "'" + "".join(_ESCAPES.get(c) or (c if " " <= c <= "~" else f"\\U{ord(c):08x}") for c in str(value)) + "'"


_ESCAPES: Final = {"\\": "\\\\", "'": "\\'"}


def staged_rows(schema: TableSchema, rows: pa.Table, *, changes: bool) -> pa.Table:
    """Arrow rows or changes with row columns in their staging form (checked: columns BigQuery has no type
    for, then values it cannot hold, error the table)."""
    check_columns(schema)
    columns = {c.name: c for c in schema.columns}
    arrays: list[pa.ChunkedArray] = []
    for name in rows.column_names:
        values = rows[name]
        if name in columns:
            values = staged(schema, columns[name], values)
        elif name in (COMMIT_LSN_COLUMN, TX_ORDINAL_COLUMN):
            values = values.cast(pa.int64())  # Spark has no unsigned types
        arrays.append(values)
    table = pa.table(arrays, names=rows.column_names)
    return _with_staged_old(schema, table) if changes else table.select(schema.column_names)


def _with_staged_old(schema: TableSchema, table: pa.Table) -> pa.Table:
    """The ``_etl_old`` struct with its fields in staging form too."""
    old = table[OLD_COLUMN].combine_chunks()
    columns = {c.name: c for c in schema.columns}
    children = [staged(schema, columns[f.name], old.field(i)).combine_chunks() for i, f in enumerate(old.type)]
    mask = pc.invert(old.is_valid()) if old.null_count else None
    struct = pa.StructArray.from_arrays(children, names=[f.name for f in old.type], mask=mask)
    return table.set_column(table.column_names.index(OLD_COLUMN), OLD_COLUMN, struct)


def integer_key_range(schema: TableSchema, collapsed: pa.Table) -> tuple[int, int] | None:
    """The least and greatest touched value of the first key column, when it is an integer one."""
    first = schema.key_columns[0]
    if bq_type(first).ddl != "INT64":
        return None
    bounds = pc.min_max(collapsed[first.name])
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return None if low is None or high is None else (int(low), int(high))
