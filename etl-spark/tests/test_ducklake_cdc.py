"""Streamed changes into DuckLake, checked against the memory destination fed the same batches.

Real DuckDB reads the lake: current contents, filtered queries, time travel and the change feed.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import structlog

from etl.destination.memory import MemoryDestination, sort_rows
from etl.errors import TableError, TableErrors
from etl.lsn import Lsn
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl_spark.ducklake import batch_commits
from etl_spark.ducklake import plan as plan_module
from etl_spark.ducklake.catalog import engine_for
from etl_spark.ducklake.catalog.ddl import COLUMNS_TABLE, VERSION_TABLE
from etl_spark.ducklake.catalog.migrations import LEGACY_COLUMNS_TABLE
from etl_spark.ducklake.scan import read_rows
from etl_spark.ducklake.storage import LakeStorage

NUMERIC_10_2 = ((10 << 16) | 2) + 4
ORDERS = TableSchema(
    16500,
    TableName("public", "orders"),
    (
        ColumnSchema("id", 23, nullable=False, primary_key=True, attnum=1),
        ColumnSchema("note", 25, attnum=2),
        ColumnSchema("qty", 23, attnum=3),
        ColumnSchema("amount", 1700, NUMERIC_10_2, attnum=4),
    ),
)
LOG = TableSchema(
    16501,
    TableName("public", "log"),
    (ColumnSchema("a", 25), ColumnSchema("b", 23)),
    replica_identity=ReplicaIdentity.FULL,
)


@pytest.mark.slow
def test_mixed_workload_matches_source(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    reference = MemoryDestination()
    orders = [{"id": i, "note": f"note {i}", "qty": i, "amount": Decimal(f"{i}.50")} for i in range(1, 6)]
    log = [{"a": "x", "b": 1}, {"a": "x", "b": 1}, {"a": "y", "b": 2}]
    for target in (destination, reference):
        target.write_table_rows(ORDERS, kit.rows_table(ORDERS, orders))
        target.write_table_rows(LOG, kit.rows_table(LOG, log))
    before = {r["id"]: r for r in lake.rows(ORDERS)}

    b = kit.BatchBuilder()
    b.commit().insert(ORDERS, {"id": 6, "note": "six", "qty": 6, "amount": Decimal("6.00")})
    b.insert(ORDERS, {"id": 7, "note": "seven", "qty": 7, "amount": None})
    b.update(ORDERS, {**before[2], "qty": 20})
    b.commit().update(ORDERS, {**before[3], "id": 30}, old={"id": 3})
    b.delete(ORDERS, {"id": 4})
    b.update(ORDERS, {**before[5], "qty": 50}, missing=("note",))
    b.update(ORDERS, {"id": 7, "note": "seven again", "qty": 70, "amount": Decimal("7.70")})
    b.commit().delete(LOG, {"a": "x", "b": 1})
    b.insert(LOG, {"a": "z", "b": 3})
    b.update(LOG, {"a": "y", "b": 20}, old={"a": "y", "b": 2})
    batch = b.build()
    for target in (destination, reference):
        target.write_events(batch)
    first = lake.snapshot()
    after_first = {s.name.name: reference.rows(str(s.name)) for s in (ORDERS, LOG)}
    assert lake.rows(ORDERS) == after_first["orders"]
    assert lake.rows(LOG) == after_first["log"]
    assert [r["note"] for r in lake.rows(ORDERS) if r["id"] == 5] == ["note 5"]  # unchanged TOAST kept

    # A replay (after a crash the engine sends the batch again) is skipped exactly: no new snapshot.
    destination.write_events(batch)
    assert lake.snapshot() == first
    assert lake.rows(ORDERS) == after_first["orders"]

    # Schema change mid-stream: rename note -> comment (same attribute), drop qty, add extra; then truncate the log.
    altered = TableSchema(
        ORDERS.id,
        ORDERS.name,
        (ORDERS.columns[0], ColumnSchema("comment", 25, attnum=2), ORDERS.columns[3], ColumnSchema("extra", 25)),
    )
    b.commit().update(altered, {"id": 2, "comment": "renamed", "amount": Decimal("2.50"), "extra": "e"})
    b.insert(altered, {"id": 8, "comment": "eight", "amount": Decimal("8.00"), "extra": None})
    b.delete(altered, {"id": 1})
    b.commit().insert(LOG, {"a": "gone", "b": 0}).truncate(LOG).insert(LOG, {"a": "after", "b": 9})
    batch = b.build()
    for target in (destination, reference):
        target.write_events(batch)
    # A rename keeps the values (the memory destination would null them: it migrates by name only).
    expected = {
        r["id"]: {"id": r["id"], "comment": r["note"], "amount": r["amount"], "extra": None}
        for r in after_first["orders"]
    }
    expected[2] = {"id": 2, "comment": "renamed", "amount": Decimal("2.50"), "extra": "e"}
    expected[8] = {"id": 8, "comment": "eight", "amount": Decimal("8.00"), "extra": None}
    del expected[1]
    assert lake.rows(altered) == sort_rows(expected.values())
    assert lake.rows(LOG) == reference.rows("public.log")
    columns = lake.query(
        "SELECT column_name, column_id FROM __ducklake_metadata_lake.ducklake_column"
        " WHERE end_snapshot IS NULL AND table_id = (SELECT table_id FROM __ducklake_metadata_lake.ducklake_table"
        " WHERE table_name = 'orders' AND end_snapshot IS NULL) ORDER BY column_order"
    )
    assert columns == [("id", 1), ("comment", 2), ("amount", 4), ("extra", 5)]  # ids kept, never reused

    # Time travel to the first batch's snapshot shows the old schema and the old rows.
    assert lake.rows(ORDERS, version=first) == after_first["orders"]
    assert lake.rows(LOG, version=first) == after_first["log"]

    # Filtered queries on columns with statistics.
    assert lake.query("SELECT id FROM lake.public.orders WHERE id = 30") == [(30,)]
    assert lake.query("SELECT id FROM lake.public.orders WHERE id >= 7 ORDER BY id") == [(7,), (8,), (30,)]
    assert lake.query("SELECT id FROM lake.public.orders WHERE amount < 3 ORDER BY id") == [(2,)]

    # The change feed of the first batch: updates are deletes of the old image plus inserts of the new.
    feed = lake.query(
        f"SELECT change_type, id FROM ducklake_table_changes('lake', 'public', 'orders', {first}, {first})"
    )
    updated = [("delete", 2), ("insert", 2), ("delete", 3), ("insert", 30), ("delete", 5), ("insert", 5)]
    assert sorted(feed) == sorted([*updated, ("delete", 4), ("insert", 6), ("insert", 7)])


@pytest.mark.parametrize("lookup", ["driver", "spark"])
def test_files_whose_key_bounds_hold_no_touched_key_are_not_scanned(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch, lookup: str
) -> None:
    """Few candidate rows are searched for the batch's keys on the driver; many, by a Spark job."""
    destination = kit.make_destination(lake)
    for start in (1, 101, 201):  # three data files: ids 1-100, 101-200, 201-300
        rows = [{"id": i, "note": f"n{i}", "qty": i, "amount": Decimal("1.00")} for i in range(start, start + 100)]
        destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, rows))
    files = {
        p for (p,) in lake.query("SELECT data_file FROM ducklake_list_files('lake', 'orders', schema => 'public')")
    }
    scanned: list[str] = []

    def spy(spark: Any, storage: Any, columns: Any, data_paths: list[str]) -> Any:  # records the scan, then runs it
        scanned.extend(data_paths)
        return read_rows(spark, storage, columns, data_paths)

    real_lookup = LakeStorage.positions_of_keys

    def spy_driver(storage: Any, column: Any, candidates: list[Any], keys: Any) -> Any:
        scanned.extend(f.path for f in candidates)
        return real_lookup(storage, column, candidates, keys)

    if lookup == "spark":
        monkeypatch.setattr(plan_module, "DRIVER_LOOKUP_ROWS", 0)
        monkeypatch.setattr(plan_module, "read_rows", spy)
    else:
        monkeypatch.setattr(LakeStorage, "positions_of_keys", spy_driver)
    b = kit.BatchBuilder()
    batch = b.commit().update(ORDERS, {"id": 150, "note": "x", "qty": 0, "amount": Decimal("2.00")}).build()
    destination.write_events(batch)
    batch = b.commit().update(ORDERS, {"id": 1000, "note": "moved", "qty": 0}, old={"id": 250}).build()
    destination.write_events(batch)
    assert len(scanned) == 2 and set(scanned) < files  # one file per batch: the one whose bounds hold the key
    assert lake.query("SELECT id, note FROM lake.public.orders WHERE id IN (150, 250, 1000) ORDER BY id") == [
        (150, "x"),
        (1000, "moved"),
    ]
    assert lake.query("SELECT count(*), count(DISTINCT id) FROM lake.public.orders") == [(300, 300)]


def test_attribute_numbers_an_earlier_writer_version_recorded_still_follow_renames(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, [{"id": 1, "note": "kept", "qty": 1, "amount": None}]))
    destination.shutdown()
    catalog = engine_for(lake.url)
    with catalog.begin() as conn:  # the table as earlier versions had it: attribute numbers only
        conn.exec_driver_sql(
            f"CREATE TABLE {LEGACY_COLUMNS_TABLE} (table_id BIGINT NOT NULL, column_id BIGINT NOT NULL,"
            " attnum BIGINT NOT NULL, PRIMARY KEY (table_id, column_id))"
        )
        conn.exec_driver_sql(
            f"INSERT INTO {LEGACY_COLUMNS_TABLE} SELECT table_id, column_id, attnum FROM {COLUMNS_TABLE}"
        )
        conn.exec_driver_sql(f"DROP TABLE {COLUMNS_TABLE}")
        conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")  # earlier versions had no migration versions

    destination = kit.make_destination(lake)
    # note renamed to comment and qty dropped in one change: only attribute numbers tell which column stayed.
    altered = TableSchema(
        ORDERS.id, ORDERS.name, (ORDERS.columns[0], ColumnSchema("comment", 25, attnum=2), ORDERS.columns[3])
    )
    destination.write_events(
        kit.BatchBuilder().commit().insert(altered, {"id": 2, "comment": "new", "amount": None}).build()
    )
    assert lake.rows(altered) == [
        {"id": 1, "comment": "kept", "amount": None},
        {"id": 2, "comment": "new", "amount": None},
    ]
    with catalog.connect() as conn:
        assert not sa.inspect(conn).has_table(LEGACY_COLUMNS_TABLE)
    catalog.dispose()


def test_a_type_change_the_lake_cannot_read_errors_only_its_table(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake, inline_row_limit=0)  # the log's new row becomes a file
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, [{"id": 1, "note": "n", "qty": 1, "amount": None}]))
    destination.write_table_rows(LOG, kit.rows_table(LOG, [{"a": "x", "b": 1}]))
    retyped = TableSchema(
        ORDERS.id, ORDERS.name, (*ORDERS.columns[:2], ColumnSchema("qty", 25, attnum=3), ORDERS.columns[3])
    )
    b = kit.BatchBuilder()
    batch = (
        b.commit().insert(LOG, {"a": "y", "b": 2}).insert(retyped, {"id": 2, "note": "m", "qty": "2", "amount": None})
    )
    with pytest.raises(TableError, match="qty changed type from int32 to varchar") as raised:
        destination.write_events(batch.build())
    assert raised.value.table_id == ORDERS.id  # the engine errors this table and writes the batch without it
    # The log's data file, written before the orders plan failed, was removed: no file outside the catalog.
    listed = lake.query("SELECT data_file FROM ducklake_list_files('lake', 'log', schema => 'public')")
    assert sorted(Path(p).name for (p,) in listed) == sorted(
        p.name for p in Path(lake.data_path).rglob("log/*.parquet")
    )


def test_the_tables_of_a_batch_are_planned_at_the_same_time(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    destination = kit.make_destination(lake)
    reference = MemoryDestination()
    for target in (destination, reference):
        target.write_table_rows(ORDERS, kit.rows_table(ORDERS, [{"id": 1, "note": "n", "qty": 1, "amount": None}]))
        target.write_table_rows(LOG, kit.rows_table(LOG, [{"a": "x", "b": 1}]))
    together = threading.Barrier(2, timeout=60)  # each plan waits for the other: one at a time would time out
    real_plan = batch_commits.plan_changes

    def plan_beside_the_other(lake_: Any, segment: Any, inline_limit: int, state: Any) -> Any:
        together.wait()
        return real_plan(lake_, segment, inline_limit, state)

    monkeypatch.setattr(batch_commits, "plan_changes", plan_beside_the_other)
    b = kit.BatchBuilder()
    batch = (
        b.commit().update(ORDERS, {"id": 1, "note": "m", "qty": 2, "amount": None}).delete(LOG, {"a": "x", "b": 1})
    ).build()
    for target in (destination, reference):
        target.write_events(batch)
    assert lake.rows(ORDERS) == reference.rows("public.orders")
    assert lake.rows(LOG) == reference.rows("public.log") == []
    destination.shutdown()


def test_table_renames_and_schema_moves_are_followed(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    rows = [{"id": i, "note": f"n{i}", "qty": i, "amount": None} for i in (1, 2, 3)]
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, rows))
    destination.write_table_rows(LOG, kit.rows_table(LOG, [{"a": "x", "b": 1}]))
    before = lake.snapshot()

    renamed = replace(ORDERS, name=TableName("public", "orders_v2"))
    b = kit.BatchBuilder()
    destination.write_events(b.commit().update(renamed, {**rows[0], "qty": 10}).build())
    assert lake.query("SELECT id, qty FROM lake.public.orders_v2 ORDER BY id") == [(1, 10), (2, 2), (3, 3)]
    assert lake.query("SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake' ORDER BY 1") == [
        ("log",),
        ("orders_v2",),
    ]
    assert lake.query(f"SELECT count(*) FROM lake.public.orders AT (VERSION => {before})") == [(3,)]

    moved = replace(ORDERS, name=TableName("archive", "orders_v2"))  # ALTER TABLE ... SET SCHEMA archive
    destination.write_events(b.commit().delete(moved, {"id": 2}).insert(moved, {**rows[1], "id": 4}).build())
    destination.write_events(b.commit().update(moved, {**rows[2], "qty": 30}).build())
    assert lake.query("SELECT id, qty FROM lake.archive.orders_v2 ORDER BY id") == [(1, 10), (3, 30), (4, 2)]

    # A swap at the source (orders_v2 -> orders_old, log -> orders_v2): the log's change comes first and takes
    # the name; the table that held it is parked until its own next change names it again. Nothing is lost.
    swapped = replace(LOG, name=TableName("archive", "orders_v2"))
    destination.write_events(b.commit().insert(swapped, {"a": "y", "b": 2}).build())
    parked = f"orders_v2_etl_parked_{ORDERS.id}"
    assert lake.query(f"SELECT count(*) FROM lake.archive.{parked}") == [(3,)]
    assert lake.query("SELECT a, b FROM lake.archive.orders_v2 ORDER BY b") == [("x", 1), ("y", 2)]
    retired = replace(ORDERS, name=TableName("archive", "orders_old"))
    destination.write_events(b.commit().delete(retired, {"id": 4}).build())
    assert lake.query("SELECT id FROM lake.archive.orders_old ORDER BY id") == [(1,), (3,)]

    # A name held by a lake table this pipeline does not keep: only the renamed table errors.
    con = lake.duckdb()
    con.execute("CREATE TABLE lake.main.mine (x int)")
    con.close()
    clash = replace(LOG, name=TableName("main", "mine"))
    with pytest.raises(TableError, match="a table of that name that this pipeline does not keep") as raised:
        destination.write_events(b.commit().insert(clash, {"a": "z", "b": 3}).build())
    assert raised.value.table_id == LOG.id
    assert lake.query("SELECT a, b FROM lake.archive.orders_v2 ORDER BY b") == [("x", 1), ("y", 2)]


def test_changes_to_a_table_dropped_in_the_lake_error_that_table(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, [{"id": 1, "note": "n", "qty": 1, "amount": None}]))
    con = lake.duckdb()
    con.execute("DROP TABLE lake.public.orders")
    con.close()
    batch = kit.BatchBuilder().commit().insert(ORDERS, {"id": 2, "note": "m", "qty": 2, "amount": None}).build()
    with pytest.raises(TableError, match="its DuckLake table is gone") as raised:  # not a new table with one row
        destination.write_events(batch)
    assert raised.value.table_id == ORDERS.id
    # The resync the hint asks for works.
    destination.drop_table_for_copy(ORDERS)
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, [{"id": 1, "note": "n", "qty": 1, "amount": None}]))
    destination.write_events(batch)
    assert lake.query("SELECT id FROM lake.public.orders ORDER BY id") == [(1,), (2,)]


def test_tables_dropped_in_the_lake_error_together_in_one_write(lake: Any, kit: Any) -> None:
    """Every table that fails to plan is reported at once (``TableErrors``), not the first of them per attempt."""
    destination = kit.make_destination(lake)
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, [{"id": 1, "note": "n", "qty": 1, "amount": None}]))
    destination.write_table_rows(LOG, kit.rows_table(LOG, [{"a": "x", "b": 1}]))
    con = lake.duckdb()
    con.execute("DROP TABLE lake.public.orders; DROP TABLE lake.public.log")
    con.close()
    b = kit.BatchBuilder().commit().insert(ORDERS, {"id": 2, "note": "m", "qty": 2, "amount": None})
    with pytest.raises(TableErrors) as raised:
        destination.write_events(b.insert(LOG, {"a": "y", "b": 2}).build())
    assert {e.table_id for e in raised.value.errors} == {ORDERS.id, LOG.id}
    assert all("its DuckLake table is gone" in e.message for e in raised.value.errors)


def test_a_schema_version_with_no_change_of_its_own_reaches_the_lake(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, [{"id": 1, "note": "n", "qty": 1, "amount": None}]))
    b = kit.BatchBuilder()
    destination.write_events(b.commit().insert(ORDERS, {"id": 2, "note": "m", "qty": 2, "amount": None}).build())
    b.commit()  # ALTER TABLE orders RENAME TO orders2; ALTER TABLE orders2 ADD COLUMN extra text
    altered = replace(
        ORDERS,
        name=TableName("public", "orders2"),
        columns=(*ORDERS.columns, ColumnSchema("extra", 25, attnum=5)),
        snapshot_lsn=Lsn(b.lsn),
    )
    ddl = b.relation(altered).build()
    destination.write_events(ddl)
    assert lake.query("SELECT * FROM lake.public.orders2 ORDER BY id") == [
        (1, "n", 1, None, None),
        (2, "m", 2, None, None),
    ]
    applied = lake.snapshot()
    destination.write_events(ddl)  # a replay: nothing new
    older = kit.BatchBuilder()
    destination.write_events(older.commit().relation(ORDERS.with_snapshot(Lsn(older.lsn))).build())
    assert lake.snapshot() == applied  # an older version replayed cannot roll the lake back

    # The DDL's transaction goes on in the next batch: its changes are not taken for replays.
    destination.write_events(b.insert(altered, {"id": 3, "note": "o", "qty": 3, "amount": None, "extra": "e"}).build())
    assert lake.query("SELECT id, extra FROM lake.public.orders2 ORDER BY id") == [(1, None), (2, None), (3, "e")]


TAGGED = TableSchema(
    16510,
    TableName("public", "tagged"),
    (
        ColumnSchema("path", 1007, nullable=False, primary_key=True, attnum=1, type_name="integer[]"),
        ColumnSchema("kind", 25, nullable=False, primary_key=True, attnum=2),
        ColumnSchema("note", 25, attnum=3),
    ),
)


def test_array_keys_are_compared_as_lists(lake: Any, kit: Any) -> None:
    """A key holding an array (with a text column beside it): inserts, updates (of the key too), deletes and unchanged
    TOAST values reach the lake as the memory destination holds them, and the other table of the batches too."""
    destination = kit.make_destination(lake)
    reference = MemoryDestination()
    copied = [
        {"path": [1, 2], "kind": "a", "note": "one"},
        {"path": [1], "kind": "a", "note": "two"},
        {"path": [], "kind": "a", "note": "empty"},
        {"path": [1, None], "kind": "a", "note": "null element"},
    ]
    for target in (destination, reference):
        target.write_table_rows(TAGGED, kit.rows_table(TAGGED, copied))
    b = kit.BatchBuilder()
    batches = [
        b.commit()
        .insert(TAGGED, {"path": [2, 1], "kind": "a", "note": "three"})
        .update(TAGGED, {"path": [1, 2], "kind": "a", "note": "one again"})
        .update(TAGGED, {"path": [1, 3], "kind": "b", "note": "moved"}, old={"path": [1], "kind": "a"})
        .delete(TAGGED, {"path": [], "kind": "a"})
        .insert(ORDERS, {"id": 1, "note": "beside", "qty": 1, "amount": None})
        .build(),
        b.commit()
        .update(TAGGED, {"path": [1, None], "kind": "a", "note": None}, missing=("note",))
        .delete(TAGGED, {"path": [2, 1], "kind": "a"})
        .insert(TAGGED, {"path": [2, 1], "kind": "b", "note": "four"})
        .update(ORDERS, {"id": 1, "note": "beside again", "qty": 2, "amount": None})
        .build(),
    ]
    for batch in batches:
        for target in (destination, reference):
            target.write_events(batch)
        assert lake.rows(TAGGED) == reference.rows("public.tagged")
        assert lake.rows(ORDERS) == reference.rows("public.orders")
    assert {r["note"] for r in reference.rows("public.tagged")} == {"one again", "moved", "null element", "four"}


def test_deletes_of_a_keyless_table_that_find_fewer_stored_rows_say_so(lake: Any, kit: Any) -> None:
    """A table without a key, whose lake holds one copy of a row where the source held two (written around the
    pipeline, or lost): the deletes of both remove the one, and the log says the lake lacked one, with the fix. Deletes
    that find every copy say nothing."""
    destination = kit.make_destination(lake)
    destination.write_table_rows(LOG, kit.rows_table(LOG, [{"a": "dup", "b": 1}, {"a": "kept", "b": 2}]))
    b = kit.BatchBuilder()
    with structlog.testing.capture_logs() as logs:
        destination.write_events(b.commit().delete(LOG, {"a": "kept", "b": 2}).build())
        destination.write_events(b.commit().delete(LOG, {"a": "dup", "b": 1}).delete(LOG, {"a": "dup", "b": 1}).build())
    assert lake.rows(LOG) == []
    (warning,) = [e for e in logs if e["log_level"] == "warning" and e.get("table") == "public.log"]
    assert (warning["removes"], warning["found"]) == (2, 1)
    assert "etl resync" in warning["hint"] and "lacked rows" in warning["event"]


@pytest.mark.parametrize("inline_row_limit", [0, 100], ids=["files", "inlined"])
def test_inserts_into_a_keyless_table_are_written_on_the_driver(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch, inline_row_limit: int
) -> None:
    """A batch that only inserts into a table without a key (a log, a history) adds its rows, repeated ones as
    repeated copies, as data files or inlined rows, with no Spark job: no stored row changes."""
    destination = kit.make_destination(lake, inline_row_limit=inline_row_limit)
    reference = MemoryDestination()
    for target in (destination, reference):
        target.write_table_rows(LOG, kit.rows_table(LOG, [{"a": "dup", "b": 1}, {"a": "kept", "b": 2}]))

    def no_spark(self: Any, table: Any, columns: Any) -> Any:
        raise AssertionError("a batch of inserts into a keyless table went through Spark")

    monkeypatch.setattr(type(destination.lake), "to_spark", no_spark)
    b = kit.BatchBuilder()
    batches = [
        b.commit()
        .insert(LOG, {"a": "dup", "b": 1})
        .insert(LOG, {"a": "dup", "b": 1})
        .insert(LOG, {"a": None, "b": 3})
        .build(),
        b.commit().insert(LOG, {"a": "kept", "b": 2}).commit().insert(LOG, {"a": "new", "b": None}).build(),
    ]
    for batch in batches:
        for target in (destination, reference):
            target.write_events(batch)
        assert lake.rows(LOG) == reference.rows("public.log")
    assert len(lake.rows(LOG)) == 7
    inlined = lake.query("SELECT count(*) FROM ducklake_list_files('lake', 'log', schema => 'public')")[0][0]
    assert (inlined > 1) == (inline_row_limit == 0)  # the copy's file, and one per batch when not inlined


def toasted(key_type: int) -> TableSchema:
    return TableSchema(
        16520 + key_type,
        TableName("public", f"toasted_{key_type}"),
        (
            ColumnSchema("id", key_type, nullable=False, primary_key=True),
            ColumnSchema("note", 25),
            ColumnSchema("body", 25),
            ColumnSchema("tags", 1007),  # int[]: an array is TOASTed as any large value
        ),
    )


@pytest.mark.parametrize("key_type", [pytest.param(20, id="bigint-key"), pytest.param(2950, id="uuid-key")])
def test_unchanged_toast_values_come_from_the_row_they_stem_from(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch, key_type: int
) -> None:
    """Values an update left unchanged (TOAST) come from the stored row the key's row stems from: in a file (of
    several row groups) or inlined, under the same key or one an update moved the row from, or from an earlier
    change of the batch, through a moved key too. A one-column integer or text key reads them on the driver, with
    no Spark job; another key (a uuid) joins the stored rows in Spark."""
    con = lake.duckdb_bare()
    try:  # the stored rows in several row groups (DuckDB creates the lake)
        con.execute(f"ATTACH 'ducklake:{lake.duckdb_target}' AS lake (DATA_PATH '{lake.data_path}')")
        con.execute("CALL lake.set_option('parquet_row_group_size', 2)")
    finally:
        con.close()
    schema = toasted(key_type)
    key = (lambda i: i) if key_type == 20 else (lambda i: f"00000000-0000-0000-0000-{i:012d}")
    destination = kit.make_destination(lake)
    reference = MemoryDestination()

    def row(i: int, note: str, body: str | None = None) -> dict[str, Any]:
        return {"id": key(i), "note": note, "body": body, "tags": None if body is None else [i, len(body)]}

    stored = [row(i, "stored", f"body {i}") for i in (1, 2, 3, 4, 6)]
    for target in (destination, reference):
        target.write_table_rows(schema, kit.rows_table(schema, stored))  # a data file
    b = kit.BatchBuilder()
    inlined = b.commit().insert(schema, row(7, "inlined", "body 7")).insert(schema, row(8, "inlined", "body 8")).build()
    for target in (destination, reference):
        target.write_events(inlined)
    if key_type == 20:

        def no_spark(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("unchanged TOAST values of an integer key were filled in Spark")

        monkeypatch.setattr(type(destination.lake), "to_spark", no_spark)
        monkeypatch.setattr(plan_module, "read_rows", no_spark)
        monkeypatch.setattr(plan_module, "live_rows", no_spark)
    unchanged = ("body", "tags")
    changes = (
        b.commit()
        .update(schema, row(1, "same key, from a file"), missing=unchanged)
        .update(schema, row(40, "moved, from a file"), old={"id": key(4)}, missing=unchanged)
        .update(schema, row(40, "moved, then updated"), missing=unchanged)
        .update(schema, row(7, "same key, inlined"), missing=unchanged)
        .update(schema, row(80, "moved, inlined"), old={"id": key(8)}, missing=unchanged)
        .commit()
        .insert(schema, row(5, "inserted", "body 5"))
        .update(schema, row(50, "inserted, then moved"), old={"id": key(5)}, missing=unchanged)
        .update(schema, row(6, "new body", "body 6b"))
        .update(schema, row(6, "new body kept"), missing=unchanged)
        .build()
    )
    for target in (destination, reference):
        target.write_events(changes)

    def by_id(rows: list[dict[str, Any]]) -> dict[str, tuple[str, str, list[int]]]:
        return {str(r["id"]): (r["note"], r["body"], r["tags"]) for r in rows}

    assert by_id(lake.rows(schema)) == by_id(reference.rows(str(schema.name)))
    bodies = {i: body for i, (_, body, _) in by_id(lake.rows(schema)).items()}
    expected = {1: "body 1", 2: "body 2", 3: "body 3", 40: "body 4", 7: "body 7", 80: "body 8", 50: "body 5"}
    assert bodies == {str(key(i)): body for i, body in (expected | {6: "body 6b"}).items()}
