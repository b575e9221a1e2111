"""Data files encoded as the lake's Parquet options ask (``CALL lake.set_option(...)`` in DuckDB), read back by
DuckDB: codec and row groups, lake-wide, per schema and per table; DuckLake's defaults without options."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import sqlalchemy as sa

from etl.errors import DestinationError
from etl.schema import ColumnSchema, TableName, TableSchema
from etl.testing.copies import published_plan
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.ducklake.catalog import engine_for


def in_duckdb(lake: Any, *statements: str) -> None:
    """Run ``statements`` in DuckDB, the lake attached as ``lake`` (DuckDB creates it when it is new)."""
    con = lake.duckdb_bare()
    try:
        con.execute(f"ATTACH 'ducklake:{lake.duckdb_target}' AS lake (DATA_PATH '{lake.data_path}')")
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()


def set_options(lake: Any, *calls: str) -> None:
    """Run ``CALL lake.set_option(...)`` with each of ``calls`` as its arguments."""
    in_duckdb(lake, *(f"CALL lake.set_option({call})" for call in calls))


def file_layout(lake: Any, schema: str, table: str) -> list[tuple[str, list[int]]]:
    """Each data file of the table: its codec and its row groups' row counts, as DuckDB reads them (sorted)."""
    con = lake.duckdb()
    try:
        files = con.execute(
            "SELECT data_file FROM ducklake_list_files('lake', ?, schema => ?)", [table, schema]
        ).fetchall()
        layout = []
        for (path,) in files:
            groups = con.execute(
                "SELECT row_group_id, any_value(row_group_num_rows), list(DISTINCT compression)"
                " FROM parquet_metadata(?) GROUP BY row_group_id ORDER BY row_group_id",
                [path],
            ).fetchall()
            (codec,) = {codec for _, _, codecs in groups for codec in codecs}
            layout.append((codec, [rows for _, rows, _ in groups]))
        return sorted(layout)
    finally:
        con.close()


def numbered(name: TableName, table_id: int) -> TableSchema:
    return TableSchema(table_id, name, (ColumnSchema("id", 23, primary_key=True), ColumnSchema("name", 25)))


def rows(count: int, start: int = 0) -> pa.Table:
    ids = pa.array(range(start, start + count), pa.int32())
    return pa.table({"id": ids, "name": pc.binary_join_element_wise("n", ids.cast(pa.string()), "")})


def test_without_options_files_get_ducklakes_default_codec_and_row_groups(lake: Any, kit: Any) -> None:
    """DuckLake's defaults: snappy, row groups of 122,880 rows."""
    destination = kit.make_destination(lake)
    destination.write_table_rows(numbered(TableName("public", "plain"), 16500), rows(250_000))
    assert file_layout(lake, "public", "plain") == [("SNAPPY", [122_880, 122_880, 4_240])]
    assert lake.query("SELECT count(*), count(DISTINCT id) FROM lake.public.plain") == [(250_000, 250_000)]


def test_a_copy_cuts_row_groups_at_the_lakes_size_across_its_ranges(
    pg_database: TestDatabase, lake: Any, kit: Any
) -> None:
    """Each copy task's ranges arrive as batches of about 2,500 rows; its file's row groups hold exactly the
    lake's ``parquet_row_group_size`` rows (the last one fewer), in the lake's codec."""
    setup = (
        "CREATE TABLE items (id int PRIMARY KEY, name text);"
        " INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 20000) g;"
        " CREATE PUBLICATION pub FOR TABLE items;"
    )
    plan = published_plan(pg_database, setup, 8)
    assert len(plan.ranges) == 8
    set_options(lake, "'parquet_row_group_size', 3000", "'parquet_compression', 'zstd'")

    destination = kit.make_destination(lake)
    assert destination.copy_table(plan, threading.Event()) == 20_000

    layout = file_layout(lake, "public", "items")
    assert len(layout) == 2  # a task per core
    for codec, groups in layout:
        assert codec == "ZSTD"
        assert set(groups[:-1]) == {3000} and 0 < groups[-1] <= 3000, groups
    assert sum(sum(groups) for _, groups in layout) == 20_000
    assert lake.query("SELECT count(*), min(id), max(id), count(DISTINCT name) FROM lake.public.items") == [
        (20_000, 1, 20_000, 20_000)
    ]


def data_file_bytes(lake: Any, schema: str, table: str) -> list[int]:
    return [
        size
        for (size,) in lake.query(
            "SELECT data_file_size_bytes FROM ducklake_list_files('lake', ?, schema => ?)", [table, schema]
        )
    ]


def test_a_tables_options_override_its_schemas_which_override_the_lakes(lake: Any, kit: Any) -> None:
    set_options(lake, "'parquet_compression', 'zstd'", "'parquet_compression_level', 1")
    in_duckdb(lake, "CREATE SCHEMA lake.wide", "CREATE SCHEMA lake.dense")
    set_options(
        lake,
        "'parquet_compression', 'gzip', schema => 'wide'",
        "'parquet_row_group_size', 5000, schema => 'wide'",
        "'parquet_compression_level', 19, schema => 'dense'",
    )

    destination = kit.make_destination(lake)
    narrow = numbered(TableName("public", "narrow"), 16501)
    broad = numbered(TableName("wide", "broad"), 16502)
    same = numbered(TableName("dense", "same"), 16503)
    destination.write_table_rows(narrow, rows(10_000))
    destination.write_table_rows(broad, rows(12_000))
    destination.write_table_rows(same, rows(10_000))
    assert file_layout(lake, "public", "narrow") == [("ZSTD", [10_000])]
    assert file_layout(lake, "wide", "broad") == [("GZIP", [5000, 5000, 2000])]
    assert file_layout(lake, "dense", "same") == [("ZSTD", [10_000])]
    # The same rows at zstd level 19 take fewer bytes than at level 1.
    assert data_file_bytes(lake, "dense", "same")[0] < data_file_bytes(lake, "public", "narrow")[0]

    # Options are read when the destination starts: tables' own, set now, hold for the next one.
    destination.shutdown()
    set_options(
        lake,
        "'parquet_compression', 'uncompressed', schema => 'public', table_name => 'narrow'",
        "'parquet_compression', 'zstd', schema => 'wide', table_name => 'broad'",
    )
    destination = kit.make_destination(lake)
    destination.write_table_rows(narrow, rows(1000, start=10_000))
    destination.write_table_rows(broad, rows(6000, start=12_000))
    assert file_layout(lake, "public", "narrow") == [("UNCOMPRESSED", [1000]), ("ZSTD", [10_000])]
    # The table's codec, its schema's row groups.
    assert file_layout(lake, "wide", "broad") == [("GZIP", [5000, 5000, 2000]), ("ZSTD", [5000, 1000])]
    assert lake.query("SELECT count(*), count(DISTINCT id) FROM lake.public.narrow") == [(11_000, 11_000)]
    assert lake.query("SELECT count(*), count(DISTINCT id) FROM lake.wide.broad") == [(18_000, 18_000)]


ALLOWED = {
    "parquet_compression": "one of uncompressed, snappy, gzip, zstd, brotli, lz4, lz4_raw",
    "parquet_row_group_size": "an integer from 1 to 2147483647",
    "parquet_compression_level": "an integer from -131072 to 22",
}


def bad_option(lake: Any, key: str, value: str, scope: str, table: str = "kept") -> None:
    """A lake DuckDB made, with ``main.<table>``, and ``key`` set to ``value`` (lake-wide, for schema ``main`` or for
    that table) in the catalog by hand: DuckDB itself refuses such values."""
    in_duckdb(lake, f"CREATE TABLE lake.main.{table} (a int)")
    engine = engine_for(lake.url)
    with engine.begin() as conn:
        table_id = conn.execute(sa.text("SELECT table_id FROM ducklake_table WHERE table_name = :n"), {"n": table})
        scope_id = {"lake": None, "schema": 0, "table": table_id.scalar_one()}[scope]
        conn.execute(
            sa.text("INSERT INTO ducklake_metadata (key, value, scope, scope_id) VALUES (:k, :v, :scope, :id)"),
            {"k": key, "v": value, "scope": None if scope == "lake" else scope, "id": scope_id},
        )
    engine.dispose()


@pytest.mark.parametrize(
    ("key", "value", "scope"),
    [
        ("parquet_compression", "LZO", "lake"),
        ("parquet_row_group_size", "many", "lake"),
        ("parquet_compression_level", "99", "lake"),
        # levels the lake's codec (snappy) would not use: wrong all the same
        ("parquet_compression_level", "99", "schema"),
        ("parquet_compression_level", "-200000", "table"),
    ],
)
def test_an_option_this_writer_cannot_apply_stops_it_at_start(
    lake: Any, kit: Any, key: str, value: str, scope: str
) -> None:
    bad_option(lake, key, value, scope)
    owner = {"lake": "", "schema": " of schema main", "table": " of table main.kept"}[scope]
    call = {"lake": "", "schema": ", schema => 'main'", "table": ", schema => 'main', table_name => 'kept'"}[scope]
    with pytest.raises(DestinationError, match=f"the lake's option {key}{owner} is '{value}'") as raised:
        kit.make_destination(lake)
    hint = raised.value.hint or ""
    assert ALLOWED[key] in hint
    assert f"CALL lake.set_option('{key}', ...{call})" in hint


def test_options_of_a_dropped_table_are_ignored(lake: Any, kit: Any) -> None:
    bad_option(lake, "parquet_compression", "LZO", "table", table="gone")
    in_duckdb(lake, "DROP TABLE lake.main.gone")
    destination = kit.make_destination(lake)
    destination.write_table_rows(numbered(TableName("public", "after"), 16504), rows(100))
    assert file_layout(lake, "public", "after") == [("SNAPPY", [100])]
