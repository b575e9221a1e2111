"""The DuckLake catalog against real DuckDB 1.5.5: list columns, column numbering, replace-on-copy, migrations.

The lakes live in real SQLite and Postgres catalogs; data files are written here with pyarrow.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from etl.errors import DestinationError
from etl_spark.ducklake.catalog import (
    Catalog,
    ColumnIds,
    LakeColumn,
    LakeTable,
    NewColumn,
    NewFile,
    Transaction,
    assign_column_ids,
    engine_for,
)
from etl_spark.ducklake.catalog.ddl import COLUMNS_TABLE, STATE_TABLE, VERSION_TABLE
from etl_spark.ducklake.catalog.migrations import LEGACY_COLUMNS_TABLE, MIGRATIONS
from etl_spark.ducklake.types import LIST, LakeType

INT32 = LakeType(name="int32")
INT64 = LakeType(name="int64")
VARCHAR = LakeType(name="varchar")


def list_of(element: LakeType) -> LakeType:
    return LakeType(name=LIST, element=element)


# CREATE TABLE t (a INT, tags VARCHAR[], m INT[][], b INT)
NESTED = [
    NewColumn("a", INT32, True),
    NewColumn("tags", list_of(VARCHAR), True),
    NewColumn("m", list_of(list_of(INT32)), True),
    NewColumn("b", INT32, True),
]
NESTED_DDL = "a INT, tags VARCHAR[], m INT[][], b INT"
ITEMS = [NewColumn("id", INT32, False), NewColumn("label", VARCHAR, True)]
SOURCE = 16700


@pytest.fixture
def spark() -> None:
    """The catalog needs no Spark: this stands in for the session's Spark the ``lake`` fixture asks for."""


@pytest.fixture
def catalog(lake: Any) -> Iterator[Catalog]:
    opened = Catalog(lake.url, lake.data_path, pipeline_id=1)
    opened.open()
    yield opened
    opened.close()


def metadata(lake: Any, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a query on the catalog's tables, as DuckDB reads them."""
    return lake.query(sql.replace("ducklake_", "__ducklake_metadata_lake.ducklake_"))


def column_rows(lake: Any, table_name: str) -> list[tuple[Any, ...]]:
    """The table's active ``ducklake_column`` rows, without the table id and snapshot."""
    return metadata(
        lake,
        "SELECT c.column_id, c.column_order, c.column_name, c.column_type, c.initial_default, c.default_value,"
        " c.nulls_allowed, c.parent_column, c.default_value_type, c.default_value_dialect FROM ducklake_column c"
        " JOIN ducklake_table t ON t.table_id = c.table_id AND t.end_snapshot IS NULL"
        f" WHERE t.table_name = '{table_name}' AND c.end_snapshot IS NULL ORDER BY c.column_order",
    )


def describe(lake: Any, table_name: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in lake.query(f"DESCRIBE lake.main.{table_name}")]


def create(catalog: Catalog, name: str, columns: list[NewColumn], source: int = SOURCE) -> LakeTable:
    def build(txn: Transaction) -> LakeTable:
        table = txn.create_table("main", name, columns, source_table_id=source)
        txn.set_watermark(source, table.table_id, (0, 0))
        return table

    return catalog.commit(build)


def write_file(table: LakeTable, name: str, rows: pa.Table) -> NewFile:
    """A Parquet file in the table's directory whose fields (list elements too) carry the table's column ids."""

    def field(column: LakeColumn, value: pa.Field) -> pa.Field:
        kind = value.type
        if column.element is not None:
            kind = pa.list_(field(column.element, pa.field("element", kind.value_type)))
        return pa.field(value.name, kind, metadata={b"PARQUET:field_id": str(column.column_id).encode()})

    schema = pa.schema([field(c, rows.schema.field(c.name)) for c in table.columns])
    path = Path(table.directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows.cast(schema), path)
    data = path.read_bytes()
    return NewFile(name, rows.num_rows, len(data), int.from_bytes(data[-8:-4], "little"))


def add_rows(catalog: Catalog, table: LakeTable, name: str, rows: pa.Table) -> None:
    file = write_file(table, name, rows)
    catalog.commit(lambda txn: txn.add_data_file(table, file))


def test_list_columns_are_recorded_numbered_and_read_as_duckdb_does(lake: Any, catalog: Catalog) -> None:
    table = create(catalog, "w", NESTED)
    lake.query(f"CREATE TABLE lake.main.d ({NESTED_DDL})")

    assert column_rows(lake, "w") == column_rows(lake, "d")
    assert [list(ids) for ids in assign_column_ids(NESTED)] == [[1], [2, 3], [4, 5, 6], [7]]
    assert assign_column_ids(NESTED[1:3], start=10) == [
        ColumnIds(10, ColumnIds(11)),
        ColumnIds(12, ColumnIds(13, ColumnIds(14))),
    ]
    assert describe(lake, "w") == [("a", "INTEGER"), ("tags", "VARCHAR[]"), ("m", "INTEGER[][]"), ("b", "INTEGER")]
    tags, m = table.columns[1], table.columns[2]
    assert tags.element == LakeColumn(3, "element", "varchar", True)
    assert m.element is not None and m.element.element == LakeColumn(6, "element", "int32", True)
    assert [c.column_id for c in m.with_elements()] == [4, 5, 6]
    assert metadata(
        lake,
        f"SELECT column_id, contains_null FROM ducklake_table_column_stats WHERE table_id = {table.table_id}"
        " ORDER BY column_id",
    ) == [(i, False) for i in range(1, 8)]

    rows = pa.table(
        {
            "a": pa.array([1, None], pa.int32()),
            "tags": pa.array([["x", None], None], pa.list_(pa.string())),
            "m": pa.array([[[1, 2], [3]], []], pa.list_(pa.list_(pa.int32()))),
            "b": pa.array([2, 3], pa.int32()),
        }
    )
    add_rows(catalog, table, "rows.parquet", rows)
    stats = f"SELECT column_id FROM ducklake_table_column_stats WHERE table_id = {table.table_id}"
    assert metadata(lake, stats) == []  # the file brought no statistics: the table's bounds are unknown now
    lake.query("INSERT INTO lake.main.w VALUES (9, ['y'], [[9]], 9)")  # DuckDB writes to it too
    assert metadata(lake, stats) == []  # and stay so (known ones would make DuckDB misread b below)
    assert lake.query("SELECT a, tags, m, b FROM lake.main.w ORDER BY b") == [
        (1, ["x", None], [[1, 2], [3]], 2),
        (None, None, [], 3),
        (9, ["y"], [[9]], 9),
    ]


def test_list_columns_are_added_renamed_and_dropped_as_duckdb_does(lake: Any, catalog: Catalog) -> None:
    table = create(catalog, "w", [NewColumn("a", INT32, True)])
    add_rows(catalog, table, "a.parquet", pa.table({"a": pa.array([1], pa.int32())}))
    lake.query("CREATE TABLE lake.main.d (a INT)")

    added = NewColumn("l", list_of(INT64), True)
    (ids,) = assign_column_ids([added], start=catalog.max_column_id(table.table_id) + 1)
    catalog.commit(lambda txn: txn.add_column(txn.table(table.table_id), added, ids.column_id))
    lake.query("ALTER TABLE lake.main.d ADD COLUMN l BIGINT[]")
    assert column_rows(lake, "w") == column_rows(lake, "d")
    assert describe(lake, "w") == [("a", "INTEGER"), ("l", "BIGINT[]")]
    assert lake.query("SELECT a, l FROM lake.main.w") == [(1, None)]
    assert metadata(
        lake,
        f"SELECT column_id, contains_null FROM ducklake_table_column_stats WHERE table_id = {table.table_id}"
        " AND column_id > 1 ORDER BY column_id",
    ) == [(2, True), (3, True)]  # the rows there hold no list

    element = metadata(
        lake, f"SELECT begin_snapshot FROM ducklake_column WHERE column_id = 3 AND table_id = {table.table_id}"
    )
    catalog.commit(lambda txn: txn.rename_column(txn.table(table.table_id), 2, "l2"))
    assert describe(lake, "w") == [("a", "INTEGER"), ("l2", "BIGINT[]")]
    renamed = catalog.table(table.table_id)
    assert renamed is not None and renamed.columns[1] == LakeColumn(
        2, "l2", LIST, True, element=LakeColumn(3, "element", "int64", True)
    )
    assert (
        metadata(
            lake, f"SELECT begin_snapshot FROM ducklake_column WHERE column_id = 3 AND table_id = {table.table_id}"
        )
        == element
    )

    catalog.commit(lambda txn: txn.drop_column(txn.table(table.table_id), 2))
    assert describe(lake, "w") == [("a", "INTEGER")]
    assert [r[0] for r in column_rows(lake, "w")] == [1]
    assert catalog.max_column_id(table.table_id) == 3
    assert lake.query("SELECT * FROM lake.main.w") == [(1,)]


def items(*labels: str) -> pa.Table:
    return pa.table({"id": pa.array(range(len(labels)), pa.int32()), "label": pa.array(labels, pa.string())})


def snapshots(lake: Any) -> int:
    return int(lake.query("SELECT max(snapshot_id) FROM lake.snapshots()")[0][0])


def changes_made(lake: Any, snapshot: int) -> str:
    return str(
        metadata(lake, f"SELECT changes_made FROM ducklake_snapshot_changes WHERE snapshot_id = {snapshot}")[0][0]
    )


def rows_at(lake: Any, snapshot: int) -> list[tuple[Any, ...]]:
    return lake.query(f"SELECT label FROM lake.main.items AT (VERSION => {snapshot}) ORDER BY id")


def tables(lake: Any) -> list[str]:
    return [name for (name,) in lake.query("SHOW TABLES FROM lake.main")]


def test_a_marked_table_stays_readable_until_its_copy_replaces_it_in_one_snapshot(lake: Any, catalog: Catalog) -> None:
    old = create(catalog, "items", ITEMS)
    add_rows(catalog, old, "old.parquet", items("old a", "old b"))
    before = snapshots(lake)

    catalog.mark_for_replacement(SOURCE)
    catalog.mark_for_replacement(SOURCE)
    assert catalog.handle(SOURCE) is None
    assert not catalog.tracked(SOURCE)
    assert snapshots(lake) == before  # readers see no change
    assert rows_at(lake, before) == [("old a",), ("old b",)]

    def copy(txn: Transaction) -> LakeTable:
        table = txn.create_table("main", "items", ITEMS, source_table_id=SOURCE)
        txn.set_watermark(SOURCE, table.table_id, (0, 0))
        txn.add_data_file(table, write_file(table, "new.parquet", items("new")))
        return table

    new = catalog.commit(copy)
    after = snapshots(lake)
    assert after == before + 1
    assert (
        changes_made(lake, after)
        == f'dropped_table:{old.table_id},created_table:"main"."items",inserted_into_table:{new.table_id}'
    )
    assert rows_at(lake, before) == [("old a",), ("old b",)]
    assert rows_at(lake, after) == [("new",)]
    assert tables(lake) == ["items"]  # ended, not parked

    handle = catalog.handle(SOURCE)
    assert handle is not None and handle.table.table_id == new.table_id != old.table_id
    assert catalog.tracked(SOURCE)
    with catalog.engine.connect() as conn:
        assert [bool(r) for r in conn.execute(sa.text(f"SELECT replaced FROM {STATE_TABLE}")).scalars()] == [False]


def test_a_marked_table_is_ended_whatever_its_name_and_not_at_all_once_duckdb_dropped_it(
    lake: Any, catalog: Catalog
) -> None:
    old = create(catalog, "items", ITEMS)
    catalog.mark_for_replacement(SOURCE)
    create(catalog, "renamed", ITEMS)  # the source table was renamed before the copy
    assert tables(lake) == ["renamed"]
    assert catalog.table(old.table_id) is None

    catalog.mark_for_replacement(SOURCE)
    lake.query("DROP TABLE lake.main.renamed")
    again = create(catalog, "renamed", ITEMS)
    assert changes_made(lake, snapshots(lake)) == 'created_table:"main"."renamed"'
    handle = catalog.handle(SOURCE)
    assert handle is not None and handle.table.table_id == again.table_id
    assert tables(lake) == ["renamed"]


def test_catalog_values_are_stored_in_duckdbs_forms(lake: Any, catalog: Catalog) -> None:
    table = create(catalog, "items", ITEMS)
    add_rows(catalog, table, "a.parquet", items("a"))
    if not lake.url.startswith("sqlite"):
        assert lake.query("SELECT count(*) FROM lake.main.items") == [(1,)]  # native types: DuckDB reads them
        return
    with sqlite3.connect(lake.url.removeprefix("sqlite:///")) as conn:
        (time,) = conn.execute("SELECT snapshot_time FROM ducklake_snapshot WHERE snapshot_id = 2").fetchone()
        (table_uuid, relative) = conn.execute("SELECT table_uuid, path_is_relative FROM ducklake_table").fetchone()
        nulls = conn.execute("SELECT DISTINCT typeof(nulls_allowed), nulls_allowed FROM ducklake_column").fetchall()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\+00", time)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", table_uuid)
    assert relative == 1
    assert sorted(nulls) == [("integer", 0), ("integer", 1)]


# What the writer ran before its migrations were versioned (``STATE_DDL`` at open), and the table of the
# first versions, whose rows the next open moved.
TODAYS_STATE_DDL = (
    f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} (pipeline_id BIGINT NOT NULL, source_table_id BIGINT NOT NULL,"
    " table_id BIGINT NOT NULL, commit_lsn BIGINT NOT NULL, tx_ordinal BIGINT NOT NULL,"
    " PRIMARY KEY (pipeline_id, source_table_id))",
    f"CREATE TABLE IF NOT EXISTS {COLUMNS_TABLE} (table_id BIGINT NOT NULL, column_id BIGINT NOT NULL,"
    " attnum BIGINT, type_oid BIGINT NOT NULL, type_modifier BIGINT NOT NULL, PRIMARY KEY (table_id, column_id))",
    f"CREATE TABLE {LEGACY_COLUMNS_TABLE} (table_id BIGINT NOT NULL, column_id BIGINT NOT NULL,"
    " attnum BIGINT NOT NULL, PRIMARY KEY (table_id, column_id))",
)


def versions(lake: Any) -> list[tuple[Any, ...]]:
    engine = engine_for(lake.url)
    try:
        with engine.connect() as conn:
            return [
                tuple(r)
                for r in conn.execute(sa.text(f"SELECT version, applied_at FROM {VERSION_TABLE} ORDER BY version"))
            ]
    finally:
        engine.dispose()


def test_a_catalog_of_the_unversioned_writer_is_upgraded_once(lake: Any) -> None:
    con = lake.duckdb_bare()
    con.execute(f"ATTACH 'ducklake:{lake.duckdb_target}' AS lake (DATA_PATH '{lake.data_path}')")
    con.execute("CREATE TABLE lake.main.items (id INT, label VARCHAR)")
    con.close()
    engine = engine_for(lake.url)
    with engine.begin() as conn:
        for statement in TODAYS_STATE_DDL:
            conn.exec_driver_sql(statement)
        conn.exec_driver_sql(f"INSERT INTO {STATE_TABLE} VALUES (1, {SOURCE}, 1, 100, 2)")
        conn.exec_driver_sql(f"INSERT INTO {LEGACY_COLUMNS_TABLE} VALUES (1, 1, 1), (1, 2, 2)")
        conn.exec_driver_sql(f"INSERT INTO {COLUMNS_TABLE} VALUES (1, 2, 2, 25, -1)")
    engine.dispose()

    catalog = Catalog(lake.url, lake.data_path, pipeline_id=1)
    catalog.open()
    handle = catalog.handle(SOURCE)
    assert handle is not None and handle.watermark == (100, 2)
    assert [(c.attnum, c.source_type) for c in handle.table.columns] == [(1, (0, -1)), (2, (25, -1))]
    catalog.close()
    applied = versions(lake)
    assert [v for v, _ in applied] == [m.version for m in MIGRATIONS]
    engine = engine_for(lake.url)
    with engine.connect() as conn:
        assert not sa.inspect(conn).has_table(LEGACY_COLUMNS_TABLE)
    engine.dispose()

    catalog.open()
    catalog.mark_for_replacement(SOURCE)
    catalog.close()
    catalog.open()  # nothing applied twice
    assert versions(lake) == applied
    assert not catalog.tracked(SOURCE)
    catalog.close()


def test_a_catalog_of_a_newer_writer_is_refused(lake: Any, catalog: Catalog) -> None:
    with catalog.engine.begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO {VERSION_TABLE} (version, description, applied_at) SELECT 99, 'future', applied_at"
            f" FROM {VERSION_TABLE} WHERE version = 1"
        )
    catalog.close()
    with pytest.raises(DestinationError, match="newer etl-spark"):
        catalog.open()
