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


def test_infinite_dates_and_timestamps_read_back_infinite(lake: Any, kit: Any) -> None:
    """Postgres's ``infinity`` and ``-infinity``, decoded as copies and streams decode them, are DuckDB's."""
    schema = TableSchema(
        16401,
        TableName("public", "events"),
        (ColumnSchema("id", 23, primary_key=True), ColumnSchema("tz", 1184), ColumnSchema("ts", 1114),
         ColumnSchema("d", 1082)),
    )  # fmt: skip
    texts = pa.array(["infinity", "-infinity", None])
    ids = pa.array([1, 2, 3], pa.int32())
    columns = {c.name: decode_text_column(c, texts) for c in schema.columns[1:]}
    kit.make_destination(lake).write_table_rows(schema, pa.table({"id": ids, **columns}))
    assert lake.query(
        "SELECT id, isinf(tz), isinf(ts), isinf(d), tz > TIMESTAMPTZ '3000-01-01 00:00:00+00', ts::varchar, d::varchar"
        " FROM lake.public.events ORDER BY id"
    ) == [
        (1, True, True, True, True, "infinity", "infinity"),
        (2, True, True, True, False, "-infinity", "-infinity"),
        (3, None, None, None, None, None, None),
    ]
    assert lake.query("SELECT id FROM lake.public.events WHERE tz = '-infinity'::TIMESTAMPTZ") == [(2,)]
    assert lake.query("SELECT id FROM lake.public.events WHERE d = '-infinity'::DATE") == [(2,)]
    assert lake.query("SELECT count(*) FROM lake.public.events WHERE ts < TIMESTAMP '0001-01-01'") == [(1,)]


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
