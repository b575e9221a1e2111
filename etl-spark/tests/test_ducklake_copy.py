"""Copied rows written into a DuckLake lake, read back by real DuckDB: types, values, statistics, empty tables."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from etl.destination.base import WriteResult
from etl.errors import TableError
from etl.postgres.codecs import decode_text_column
from etl.schema import ColumnSchema, TableName, TableSchema

NUMERIC_10_2 = ((10 << 16) | 2) + 4

ALL_TYPES = TableSchema(
    id=16400,
    name=TableName("public", "all_types"),
    columns=(
        ColumnSchema("id", 23, nullable=False, primary_key=True),
        ColumnSchema("name", 25),
        ColumnSchema("amount", 1700, NUMERIC_10_2),
        ColumnSchema("big", 1700),
        ColumnSchema("ts", 1184),
        ColumnSchema("local_ts", 1114),
        ColumnSchema("day", 1082),
        ColumnSchema("clock", 1083),
        ColumnSchema("span", 1186),
        ColumnSchema("doc", 3802, type_name="jsonb"),
        ColumnSchema("uid", 2950),
        ColumnSchema("raw", 17),
        ColumnSchema("nums", 1007, type_name="integer[]"),
        ColumnSchema("ratio", 701),
        ColumnSchema("flag", 16),
        ColumnSchema("small", 21),
        ColumnSchema("large", 20),
    ),
)

UTC = dt.UTC


def sample_rows() -> list[dict[str, Any]]:
    return [
        {
            "id": 1,
            "name": "alpha",
            "amount": Decimal("12.34"),
            "big": "123456789012345678901234567890.123456789",
            "ts": dt.datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
            "local_ts": dt.datetime(2024, 5, 1, 12, 30, 0, 5),
            "day": dt.date(2024, 5, 1),
            "clock": dt.time(10, 0, 0, 500000),
            "span": pa.MonthDayNano([14, 3, 14706000007000]),
            "doc": '{"a": [1, 2]}',
            "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "raw": b"\x00\xff",
            "nums": [1, None, 3],
            "ratio": 0.25,
            "flag": True,
            "small": -3,
            "large": 2**40,
        },
        {"id": 2, "name": "beta", "amount": Decimal("-0.50"), "ts": dt.datetime(2020, 1, 1, tzinfo=UTC), "nums": []},
        {"id": 3, "name": None},
    ]


def test_copy_types_and_values_read_back_by_duckdb(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    destination.write_table_rows(ALL_TYPES, kit.rows_table(ALL_TYPES, sample_rows()))

    types = dict(lake.query("SELECT column_name, column_type FROM (DESCRIBE lake.public.all_types)"))
    assert types == {
        "id": "INTEGER",
        "name": "VARCHAR",
        "amount": "DECIMAL(10,2)",
        "big": "VARCHAR",
        "ts": "TIMESTAMP WITH TIME ZONE",
        "local_ts": "TIMESTAMP",
        "day": "DATE",
        "clock": "TIME",
        "span": "INTERVAL",
        "doc": "JSON",
        "uid": "UUID",
        "raw": "BLOB",
        "nums": "INTEGER[]",
        "ratio": "DOUBLE",
        "flag": "BOOLEAN",
        "small": "SMALLINT",
        "large": "BIGINT",
    }
    row = lake.query(
        "SELECT id, name, amount, big, epoch_us(ts), local_ts, day, clock,"
        " span = INTERVAL '14 months 3 days 14706000007 microseconds', doc, uid::VARCHAR, raw, nums, ratio, flag,"
        " small, large FROM lake.public.all_types WHERE id = 1"
    )
    first = sample_rows()[0]
    assert row == [
        (
            1,
            "alpha",
            first["amount"],
            first["big"],
            int(first["ts"].timestamp() * 1_000_000),
            first["local_ts"],
            first["day"],
            first["clock"],
            True,
            first["doc"],
            first["uid"],
            first["raw"],
            [1, None, 3],
            0.25,
            True,
            -3,
            2**40,
        )
    ]
    assert lake.query("SELECT id, name, nums FROM lake.public.all_types WHERE id > 1 ORDER BY id") == [
        (2, "beta", []),
        (3, None, None),
    ]


def test_filtered_queries_use_true_statistics(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    schema = ALL_TYPES
    # Three copy chunks: three data files whose bounds the table statistics must all cover.
    for chunk in range(3):
        rows = [
            {
                "id": chunk * 10 + i,
                "name": f"n{chunk}{i}",
                "amount": Decimal(f"{chunk}.{i}0"),
                "ts": dt.datetime(2024, 1, 1 + chunk, i, tzinfo=UTC),
                "day": dt.date(2000 + chunk, 1, 1 + i),
                "uid": f"00000000-0000-0000-0000-00000000{chunk}{i:03d}",
            }
            for i in range(5)
        ]
        destination.write_table_rows(schema, kit.rows_table(schema, rows))
    assert lake.query("SELECT count(*) FROM lake.public.all_types WHERE id = 24") == [(1,)]
    assert lake.query("SELECT count(*) FROM lake.public.all_types WHERE id > 9") == [(10,)]
    assert lake.query("SELECT count(*) FROM lake.public.all_types WHERE name >= 'n2'") == [(5,)]
    assert lake.query("SELECT count(*) FROM lake.public.all_types WHERE amount < 1") == [(5,)]
    assert lake.query(
        "SELECT count(*) FROM lake.public.all_types WHERE ts >= TIMESTAMPTZ '2024-01-03 00:00:00+00'"
    ) == [(5,)]
    assert lake.query("SELECT count(*) FROM lake.public.all_types WHERE day = DATE '2001-01-03'") == [(1,)]
    assert lake.query(
        "SELECT count(*) FROM lake.public.all_types WHERE uid = '00000000-0000-0000-0000-000000002004'"
    ) == [(1,)]
    bounds = lake.query(
        "SELECT c.column_name, s.min_value, s.max_value FROM __ducklake_metadata_lake.ducklake_table_column_stats s"
        " JOIN __ducklake_metadata_lake.ducklake_column c USING (table_id, column_id)"
        " WHERE c.column_name IN ('id', 'day') ORDER BY 1"
    )
    assert bounds == [("day", "2000-01-01", "2002-01-05"), ("id", "0", "24")]


def test_empty_table_is_created(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    destination.write_table_rows(ALL_TYPES, kit.rows_table(ALL_TYPES, []))
    assert lake.query("SELECT count(*) FROM lake.public.all_types") == [(0,)]


NUMERIC_38_10 = ((38 << 16) | 10) + 4
EXTREMES = (
    ColumnSchema("id", 23, primary_key=True),
    ColumnSchema("tz", 1184),
    ColumnSchema("ts", 1114),
    ColumnSchema("d", 1082),
    ColumnSchema("f8", 701),
    ColumnSchema("f4", 700),
    ColumnSchema("n38", 1700, NUMERIC_38_10),
    ColumnSchema("num", 1700),
)
# Each column's extremes as Postgres prints them (ids 1-6, the last all NULL). DuckDB prints a timestamptz near its
# maximum through ICU, which loses the microseconds: that one has none.
EXTREME_TEXTS = {
    "tz": ["infinity", "-infinity", "4714-11-24 00:00:00+00 BC", "294246-12-31 23:59:59+00",
           "0044-03-15 01:02:03.456789+00 BC"],
    "ts": ["infinity", "-infinity", "4714-11-24 00:00:00 BC", "294246-12-31 23:59:59.999999",
           "0044-03-15 01:02:03.456789 BC"],
    "d": ["infinity", "-infinity", "4714-11-24 BC", "5874897-12-31", "0044-03-15 BC"],
    "f8": ["NaN", "-Infinity", "5e-324", "1.7976931348623157e+308", "-0"],
    "f4": ["Infinity", "-Infinity", "1e-45", "3.4028235e+38", "-0"],
    "n38": ["9999999999999999999999999999.9999999999", "-9999999999999999999999999999.9999999999",
            "-0.0000000001", "0.0000000000", "0.0000000001"],
    "num": ["NaN", "-Infinity", "0.00000000000000000001", "123456789012345678901234567890.123456789", "Infinity"],
}  # fmt: skip
# What DuckDB reads of them, as text.
EXTREME_READS = [
    (1, "infinity", "infinity", "infinity", "nan", "inf",
     "9999999999999999999999999999.9999999999", "NaN"),
    (2, "-infinity", "-infinity", "-infinity", "-inf", "-inf",
     "-9999999999999999999999999999.9999999999", "-Infinity"),
    (3, "4714-11-24 (BC) 00:00:00+00", "4714-11-24 (BC) 00:00:00", "4714-11-24 (BC)", "5e-324", "1e-45",
     "-0.0000000001", "0.00000000000000000001"),
    (4, "294246-12-31 23:59:59+00", "294246-12-31 23:59:59.999999", "5874897-12-31",
     "1.7976931348623157e+308", "3.4028235e+38", "0.0000000000", "123456789012345678901234567890.123456789"),
    (5, "0044-03-15 (BC) 01:02:03.456789+00", "0044-03-15 (BC) 01:02:03.456789", "0044-03-15 (BC)", "-0.0",
     "-0.0", "0.0000000001", "Infinity"),
    (6, None, None, None, None, None, None, None),
]  # fmt: skip


def extreme_rows() -> list[dict[str, Any]]:
    """The rows of ``EXTREME_TEXTS`` decoded as copies and streams decode them; dates and timestamps as their
    storage integers, which Python's types cannot hold."""
    columns: dict[str, list[Any]] = {"id": list(range(1, 7))}
    for column in EXTREMES[1:]:
        decoded = decode_text_column(column, pa.array([*EXTREME_TEXTS[column.name], None]))
        storage = (
            {pa.date32(): pa.int32()}.get(decoded.type, pa.int64()) if column.type_oid in (1082, 1114, 1184) else None
        )
        columns[column.name] = (decoded.cast(storage) if storage is not None else decoded).to_pylist()
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def test_extreme_values_read_the_same_from_files_and_inlined_rows(lake: Any, kit: Any) -> None:
    """Infinities, BC and far dates, the widest numerics, NaN and infinite floats: copied (a data file), streamed
    (inlined into the catalog, one row updated with unchanged TOAST values read back from the catalog) and
    flushed, DuckDB reads each as the source holds it."""
    copied = TableSchema(16401, TableName("public", "copied"), EXTREMES)
    streamed = TableSchema(16404, TableName("public", "streamed"), EXTREMES)
    rows = extreme_rows()
    destination = kit.make_destination(lake)
    destination.write_table_rows(copied, kit.rows_table(copied, rows))
    b = kit.BatchBuilder().commit()
    for row in rows:
        b.insert(streamed, row)
    destination.write_events(b.build())
    destination.write_events(
        kit.BatchBuilder(lsn=0x2000).commit().update(streamed, rows[2], missing=("tz", "d")).build()
    )
    quoted = ", ".join(["id", *(f"{c.name}::varchar" for c in EXTREMES[1:])])

    def read(table: str) -> Any:
        return lake.query(f"SELECT {quoted} FROM lake.public.{table} ORDER BY id")

    assert lake.query("SELECT count(*) FROM ducklake_list_files('lake', 'streamed', schema => 'public')") == [(0,)]
    assert read("copied") == read("streamed") == EXTREME_READS
    assert lake.query("SELECT id FROM lake.public.streamed WHERE tz = '-infinity'::TIMESTAMPTZ AND isinf(d)") == [(2,)]
    destination.flush_inlined(destination.catalog.handle(streamed.id).table)
    assert lake.query("SELECT count(*) FROM ducklake_list_files('lake', 'streamed', schema => 'public')") == [(1,)]
    assert read("streamed") == EXTREME_READS


def test_each_handed_over_batch_is_durable_when_written(lake: Any, kit: Any) -> None:
    """Rows an embedder hands over with ``write_table_rows`` are in the lake when the call returns."""
    schema = TableSchema(
        16402, TableName("public", "handed"), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("name", 25))
    )
    empty = TableSchema(16403, TableName("public", "empty"), (ColumnSchema("id", 23, primary_key=True),))

    def batch(start: int) -> pa.Table:
        return kit.rows_table(schema, [{"id": i, "name": f"n{i}"} for i in range(start, start + 100)])

    destination = kit.make_destination(lake)
    assert destination.write_table_rows(schema, batch(0)) is WriteResult.DURABLE
    assert lake.query("SELECT count(*), count(DISTINCT id) FROM lake.public.handed") == [(100, 100)]
    assert destination.write_table_rows(schema, batch(100)) is WriteResult.DURABLE
    assert destination.write_table_rows(empty, kit.rows_table(empty, [])) is WriteResult.DURABLE
    assert lake.query("SELECT count(*), count(DISTINCT id) FROM lake.public.handed") == [(200, 200)]
    assert lake.query("SELECT count(*) FROM ducklake_list_files('lake', 'handed', schema => 'public')") == [(2,)]
    assert lake.query("SELECT count(*) FROM lake.public.empty") == [(0,)]


def test_a_table_copied_under_a_name_another_source_table_holds_parks_that_one(lake: Any, kit: Any) -> None:
    # The source table was dropped and created again (a new OID), or renamed while another took its name.
    before = TableSchema(16410, TableName("public", "reused"), (ColumnSchema("id", 23, primary_key=True),))
    after = TableSchema(16411, before.name, before.columns)
    destination = kit.make_destination(lake)
    destination.write_table_rows(before, kit.rows_table(before, [{"id": 1}, {"id": 2}]))
    destination.write_table_rows(after, kit.rows_table(after, [{"id": 3}]))
    assert lake.query("SELECT id FROM lake.public.reused") == [(3,)]
    assert lake.query("SELECT id FROM lake.public.reused_etl_parked_16410 ORDER BY id") == [(1,), (2,)]


def test_a_table_another_pipeline_keeps_under_the_name_is_left_alone(lake: Any, kit: Any) -> None:
    first = TableSchema(16420, TableName("public", "shared"), (ColumnSchema("id", 23, primary_key=True),))
    second = TableSchema(16421, first.name, first.columns)
    kit.make_destination(lake, pipeline_id=1).write_table_rows(first, kit.rows_table(first, [{"id": 1}]))
    with pytest.raises(TableError, match="pipeline 1 keeps a table of that name") as raised:
        kit.make_destination(lake, pipeline_id=2).write_table_rows(second, kit.rows_table(second, [{"id": 2}]))
    assert "own lake" in (raised.value.hint or "")
    assert lake.query("SELECT id FROM lake.public.shared") == [(1,)]
