"""Small batches are inlined into the catalog (DuckLake data inlining), then flushed to Parquet.

Real DuckDB reads every state (inlined only, mixed, after this writer's flush, after DuckDB's own
flush), at the current snapshot and by time travel, and its rows equal the memory destination fed
the same batches.
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import uuid
from contextlib import closing
from datetime import UTC, date, datetime
from datetime import time as clock
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from etl.destination.memory import MemoryDestination, sort_rows
from etl.postgres.codecs import decode_text_column
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl.testing.pipelines import poll
from etl_spark.ducklake import inline_flush
from etl_spark.ducklake.catalog import inlined
from etl_spark.ducklake.catalog.model import LakeColumn
from etl_spark.ducklake.plan import inline_limits
from etl_spark.ducklake.reader import connect_duckdb
from etl_spark.ducklake.storage import LakeStorage
from etl_spark.ducklake.types import Form

NUMERIC_12_3 = ((12 << 16) | 3) + 4
KINDS = TableSchema(
    16900,
    TableName("public", "kinds"),
    (
        ColumnSchema("id", 20, nullable=False, primary_key=True, attnum=1),
        ColumnSchema("label", 25, attnum=2),
        ColumnSchema("flag", 16, attnum=3),
        ColumnSchema("ratio", 701, attnum=4),
        ColumnSchema("amount", 1700, NUMERIC_12_3, attnum=5),
        ColumnSchema("day", 1082, attnum=6),
        ColumnSchema("seen_at", 1184, attnum=7),
        ColumnSchema("local_at", 1114, attnum=8),
        ColumnSchema("clock", 1083, attnum=9),
        ColumnSchema("token", 2950, attnum=10),
        ColumnSchema("raw", 17, attnum=11),
        ColumnSchema("doc", 3802, attnum=12),
        ColumnSchema("small", 21, attnum=13),
    ),
)
PAIRS = TableSchema(
    16901,
    TableName("public", "pairs"),
    (ColumnSchema("a", 25), ColumnSchema("b", 23)),
    replica_identity=ReplicaIdentity.FULL,
)


def kind_row(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "label": f"label {i}, with 'quotes' and ünïcode",
        "flag": i % 2 == 0,
        "ratio": [float("nan"), float("inf"), -0.5, 1 / 3][i % 4],
        "amount": Decimal(f"{i}.125"),
        "day": date(2024, 1, 1 + i % 28),
        "seen_at": datetime(2024, 5, 6, 7, 8, 9, i, tzinfo=UTC),
        "local_at": datetime(2020, 2, 29, 23, 59, 59, 999999 - i),
        "clock": clock(i % 24, 30, 15, i),
        "token": str(uuid.UUID(int=i)),
        "raw": bytes([0, i % 256, 255]),
        "doc": f'{{"n": {i}}}',
        "small": -i,
    }


def lake_rows(lake: Any, schema: TableSchema, version: int | None = None) -> list[dict[str, Any]]:
    at = f" AT (VERSION => {version})" if version is not None else ""
    names = schema.column_names
    quoted = ", ".join(f'"{n}"' for n in names)
    rows = lake.query(f"SELECT {quoted} FROM lake.public.{schema.name.name}{at}")
    return sort_rows(comparable(dict(zip(names, r, strict=True))) for r in rows)


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """Values as DuckDB and the memory destination both give them (uuid and json as text, NaN as a string)."""
    out = dict(row)
    for name, value in row.items():
        if isinstance(value, uuid.UUID):
            out[name] = str(value)
        elif isinstance(value, float) and math.isnan(value):
            out[name] = "nan"
        elif name == "doc" and value is not None:
            out[name] = value.replace(" ", "")
    return out


def expected(reference: MemoryDestination, schema: TableSchema) -> list[dict[str, Any]]:
    return sort_rows(comparable(r) for r in reference.rows(str(schema.name)))


def snapshot(lake: Any) -> int:
    return int(lake.query("SELECT max(snapshot_id) FROM lake.snapshots()")[0][0])


def catalog_count(lake: Any, table: str, where: str = "") -> int:
    return int(lake.query(f"SELECT count(*) FROM __ducklake_metadata_lake.{table} {where}")[0][0])


def inlined_rows(lake: Any, live: bool = True) -> int:
    names = lake.query("SELECT table_name FROM __ducklake_metadata_lake.ducklake_inlined_data_tables")
    where = "WHERE end_snapshot IS NULL" if live else ""
    return sum(catalog_count(lake, name, where) for (name,) in names)


@pytest.mark.slow
def test_small_batches_are_inlined_updated_deleted_and_flushed(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    b.commit()
    for i in range(1, 9):
        b.insert(KINDS, kind_row(i))
    b.insert(PAIRS, {"a": "x", "b": 1}).insert(PAIRS, {"a": "x", "b": 1}).insert(PAIRS, {"a": "y", "b": 2})
    states: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for batch in (
        b.build(),
        b.commit()
        .update(KINDS, {**kind_row(2), "label": "second", "ratio": 2.5})
        .update(KINDS, {**kind_row(3), "id": 30}, old={"id": 3})
        .delete(KINDS, {"id": 4})
        .update(KINDS, {**kind_row(5), "label": None}, missing=("raw",))  # unchanged TOAST: from the inlined row
        .delete(PAIRS, {"a": "x", "b": 1})
        .build(),
        b.commit().update(KINDS, {**kind_row(2), "label": "third"}).insert(KINDS, kind_row(9)).build(),
    ):
        for target in (destination, reference):
            target.write_events(batch)
        states[snapshot(lake)] = {s.name.name: expected(reference, s) for s in (KINDS, PAIRS)}
        for schema in (KINDS, PAIRS):
            assert lake_rows(lake, schema) == expected(reference, schema)
    assert catalog_count(lake, "ducklake_data_file") == 0  # no Parquet file, no Spark job for the rows
    assert inlined_rows(lake) == 8 + 2  # 9 kinds rows (one deleted), pairs: one of the two x rows deleted
    assert {r["raw"] for r in lake_rows(lake, KINDS) if r["id"] == 5} == {kind_row(5)["raw"]}

    feed_sql = (
        "SELECT snapshot_id, rowid, change_type, id, label FROM ducklake_table_changes('lake', 'public', 'kinds', 0, ?)"
    )
    feed = sorted(lake.query(feed_sql, [snapshot(lake)]))
    assert len(feed) > 9
    destination.flush_inlined(destination.catalog.handle(KINDS.id).table)
    assert sorted(lake.query(feed_sql, [snapshot(lake) - 1])) == feed  # the change feed reads the same
    assert inlined_rows(lake, live=False) == 3  # only the pairs rows are left inlined
    files = lake.query("SELECT data_file, delete_file FROM ducklake_list_files('lake', 'kinds', schema => 'public')")
    assert len(files) == 1 and files[0][1] is not None  # the ended rows are deleted by a delete file
    columns = pq.read_schema(files[0][0]).names
    assert columns[-2:] == ["_ducklake_internal_row_id", "_ducklake_internal_snapshot_id"]
    for version, state in states.items():  # time travel reads what it read before the flush
        for schema in (KINDS, PAIRS):
            assert lake_rows(lake, schema, version) == state[schema.name.name]

    batch = b.commit().delete(KINDS, {"id": 1}).update(KINDS, {**kind_row(9), "label": "after flush"}).build()
    for target in (destination, reference):
        target.write_events(batch)
    assert lake_rows(lake, KINDS) == expected(reference, KINDS)
    destination.shutdown()


@pytest.mark.parametrize("lake", ["sqlite"], indirect=True)  # two copies of one catalog: a file copy
def test_our_flush_writes_what_duckdbs_flush_writes(lake: Any, kit: Any, tmp_path: Path) -> None:
    destination = kit.make_destination(lake)
    b = kit.BatchBuilder()
    for batch in (
        b.commit().insert(KINDS, kind_row(1)).insert(KINDS, kind_row(2)).insert(KINDS, kind_row(3)).build(),
        b.commit().delete(KINDS, {"id": 2}).insert(KINDS, kind_row(4)).build(),
    ):
        destination.write_events(batch)
    destination.shutdown()
    catalog = Path(lake.url.removeprefix("sqlite:///"))
    twin = tmp_path / "twin.sqlite"
    shutil.copy(catalog, twin)
    con = lake.duckdb_bare()
    con.execute(f"ATTACH 'ducklake:sqlite:{twin}' AS twin")
    con.execute("CALL ducklake_flush_inlined_data('twin')")
    con.close()
    destination = kit.make_destination(lake)
    destination.flush_inlined(destination.catalog.handle(KINDS.id).table)
    destination.shutdown()

    def entries(path: Path) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(path)) as db:
            data = db.execute(
                "SELECT begin_snapshot, end_snapshot, record_count, row_id_start, partial_max FROM ducklake_data_file"
            ).fetchall()
            deletes = db.execute(
                "SELECT begin_snapshot, end_snapshot, delete_count FROM ducklake_delete_file"
            ).fetchall()
            changes = db.execute(
                "SELECT changes_made FROM ducklake_snapshot_changes ORDER BY snapshot_id DESC"
            ).fetchone()
            stats = db.execute("SELECT record_count, next_row_id FROM ducklake_table_stats").fetchall()
            (name,) = db.execute("SELECT table_name FROM ducklake_inlined_data_tables").fetchone()
            inlined = db.execute(f"SELECT count(*) FROM {name}").fetchone()
        return [*data, *deletes, changes, *stats, inlined]

    assert entries(catalog) == entries(twin)
    ours = lake.query("SELECT data_file FROM ducklake_list_files('lake', 'kinds', schema => 'public')")[0][0]
    con = lake.duckdb_bare()
    con.execute(f"ATTACH 'ducklake:sqlite:{twin}' AS twin")
    theirs = con.execute("SELECT data_file FROM ducklake_list_files('twin', 'kinds', schema => 'public')").fetchall()
    con.close()
    ours_table, theirs_table = pq.read_table(ours), pq.read_table(theirs[0][0])
    assert ours_table.schema.names == theirs_table.schema.names
    assert [comparable(r) for r in ours_table.to_pylist()] == [comparable(r) for r in theirs_table.to_pylist()]


def test_a_schema_change_flushes_the_inlined_rows_first(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    altered = TableSchema(KINDS.id, KINDS.name, (*KINDS.columns[:12], ColumnSchema("extra", 25, attnum=14)))
    for batch in (
        b.commit().insert(KINDS, kind_row(1)).insert(KINDS, kind_row(2)).build(),
        b.commit().insert(altered, {**kind_row(3), "extra": "e"}).delete(altered, {"id": 1}).build(),
    ):
        for target in (destination, reference):
            target.write_events(batch)
    assert lake_rows(lake, altered) == expected(reference, altered)
    assert [(r["id"], r["extra"]) for r in lake_rows(lake, altered)] == [(2, None), (3, "e")]
    assert inlined_rows(lake, live=False) == 1  # the new row, at the new schema version; the old ones flushed
    assert catalog_count(lake, "ducklake_data_file") == 1
    destination.shutdown()


def test_a_keyless_delete_matches_older_rows_by_an_added_columns_initial_default(lake: Any, kit: Any) -> None:
    """Rows older than a column added with a constant default read it (``initial_default``): in DuckDB, and in
    this writer's match of a keyless delete that comes in the batch adding the column."""
    destination = kit.make_destination(lake)
    b = kit.BatchBuilder()
    old = b.commit().insert(PAIRS, {"a": "x", "b": 1}).insert(PAIRS, {"a": "x", "b": 1})
    destination.write_events(old.insert(PAIRS, {"a": "y", "b": 2}).build())  # inlined, flushed by the change
    added = ColumnSchema("c", 23, nullable=False, missing_value="7")
    altered = TableSchema(PAIRS.id, PAIRS.name, (*PAIRS.columns, added), replica_identity=ReplicaIdentity.FULL)
    batch = b.commit().delete(altered, {"a": "x", "b": 1, "c": 7}).insert(altered, {"a": "z", "b": 3, "c": 8}).build()
    destination.write_events(batch)
    rows = sorted(lake_rows(lake, altered), key=lambda r: (r["a"], r["b"]))
    assert rows == [{"a": "x", "b": 1, "c": 7}, {"a": "y", "b": 2, "c": 7}, {"a": "z", "b": 3, "c": 8}]
    # The column's statistics cover the older rows' value too: a filter on it finds them.
    assert lake.query("SELECT a FROM lake.public.pairs WHERE c = 7 ORDER BY a") == [("x",), ("y",)]
    assert lake.query("SELECT a FROM lake.public.pairs WHERE c < 8 ORDER BY a") == [("x",), ("y",)]
    where = "WHERE column_name = 'c' AND end_snapshot IS NULL"
    assert lake.query(f"SELECT initial_default FROM __ducklake_metadata_lake.ducklake_column {where}") == [("7",)]
    destination.shutdown()


def test_a_truncate_ends_inlined_rows_and_big_batches_write_files(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake, inline_row_limit=5)
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    big = b.commit()
    for i in range(1, 8):
        big.insert(KINDS, kind_row(i))
    for batch in (
        b.commit().insert(PAIRS, {"a": "x", "b": 1}).build(),
        big.build(),
        b.commit().truncate(PAIRS).insert(PAIRS, {"a": "after", "b": 2}).build(),
    ):
        for target in (destination, reference):
            target.write_events(batch)
    for schema in (KINDS, PAIRS):
        assert lake_rows(lake, schema) == expected(reference, schema)
    assert catalog_count(lake, "ducklake_data_file") == 1  # the 7-row batch
    destination.shutdown()


@pytest.mark.parametrize(
    ("changes", "budget", "limits"),
    [
        ([7], 10, [10]),
        ([11], 10, [10]),  # 11 changes may collapse to 10 rows or fewer
        ([4, 3, 5], 8, [5, 8, 1]),  # the fewest changes first, each leaving the budget less its changes
        ([1800] * 20, 10_000, [10_000, 8200, 6400, 4600, 2800, 1000] + [0] * 14),
        ([0, 2], 0, [0, 0]),
    ],
)
def test_a_batch_inlines_its_smallest_tables_within_the_budget(
    changes: list[int], budget: int, limits: list[int]
) -> None:
    assert inline_limits(changes, budget) == limits


def test_tables_past_the_batch_budget_write_files(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake, inline_row_limit=5)
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    b.commit()
    for i in range(1, 5):
        b.insert(KINDS, kind_row(i))
    for i in range(3):
        b.insert(PAIRS, {"a": f"p{i}", "b": i})
    batch = b.build()  # 4 + 3 rows: more than 5 together, so only the 3 of the smaller table are inlined
    for target in (destination, reference):
        target.write_events(batch)
    for schema in (KINDS, PAIRS):
        assert lake_rows(lake, schema) == expected(reference, schema)
    assert inlined_rows(lake) == 3
    assert catalog_count(lake, "ducklake_data_file") == 1
    destination.shutdown()


def test_inlined_rows_are_flushed_at_the_threshold(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake, inline_flush_rows=3, inline_flush_seconds=3600)
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    for batch in (
        b.commit().insert(KINDS, kind_row(1)).insert(KINDS, kind_row(2)).build(),
        b.commit().update(KINDS, {**kind_row(1), "label": "x"}).build(),  # 3 rows with the ended one: flushed
        b.commit().insert(PAIRS, {"a": "x", "b": 1}).build(),
    ):
        for target in (destination, reference):
            target.write_events(batch)
    assert catalog_count(lake, "ducklake_data_file") == 1
    assert inlined_rows(lake, live=False) == 1  # the pairs row, under the threshold
    for schema in (KINDS, PAIRS):
        assert lake_rows(lake, schema) == expected(reference, schema)


def test_inlined_rows_are_flushed_on_the_timer_also_after_a_restart(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake, inline_flush_seconds=3600)
    batch = kit.BatchBuilder().commit().insert(PAIRS, {"a": "x", "b": 1}).build()
    destination.write_events(batch)
    destination.shutdown()
    assert inlined_rows(lake) == 1
    destination = kit.make_destination(lake, inline_flush_seconds=1)  # finds the inlined row at start
    # Polled through the writer's own catalog connection: DuckDB's copy of SQLite and Python's do not see each
    # other's locks, so a DuckDB read of the live file while the timer's flush writes it may fail (open_lake)
    poll(
        destination.catalog.tables_with_inlined_rows,
        "the timer to flush the inlined row",
        until=lambda tables: not tables,
        timeout=60,
        least=0.2,
    )
    destination.shutdown()
    assert inlined_rows(lake, live=False) == 0
    assert catalog_count(lake, "ducklake_data_file") == 1
    assert lake.query("SELECT a, b FROM lake.public.pairs") == [("x", 1)]


def three_kinds_inlined(lake: Any, kit: Any, **options: Any) -> tuple[Any, MemoryDestination]:
    """A destination (of ``options``) whose kinds table holds three inlined rows, and the memory destination fed the
    same."""
    destination = kit.make_destination(lake, **options)
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    batch = b.commit().insert(KINDS, kind_row(1)).insert(KINDS, kind_row(2)).insert(KINDS, kind_row(3)).build()
    for target in (destination, reference):
        target.write_events(batch)
    return destination, reference


def test_a_flush_that_finds_its_rows_changed_starts_over_and_loses_nothing(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    destination, reference = three_kinds_inlined(lake, kit)
    real_write = inline_flush.write_flush
    writes = []

    def write_then_another_writer_changes_the_rows(lake_: Any, table: Any, name: str, driver_rows: int) -> Any:
        flush = real_write(lake_, table, name, driver_rows)
        writes.append(flush)
        if len(writes) == 1:  # another writer ends row 2 and inlines a row after the flush read the rows
            later = kit.BatchBuilder(lsn=0x9000).commit().delete(KINDS, {"id": 2}).insert(KINDS, kind_row(4)).build()
            with monkeypatch.context() as patched:
                patched.setattr(inline_flush, "write_flush", real_write)
                other = kit.make_destination(lake, pipeline_id=1)
                other.write_events(later)
                other.shutdown()
            reference.write_events(later)
        return flush

    monkeypatch.setattr(inline_flush, "write_flush", write_then_another_writer_changes_the_rows)
    destination.flush_inlined(destination.catalog.handle(KINDS.id).table)
    assert len(writes) == 2  # the first flush found the rows changed and was written again
    assert lake_rows(lake, KINDS) == expected(reference, KINDS)
    listed = lake.query("SELECT data_file FROM ducklake_list_files('lake', 'kinds', schema => 'public')")
    on_disk = {p.name for p in Path(lake.data_path).rglob("kinds/ducklake-*.parquet") if "delete" not in p.name}
    assert {Path(p).name for (p,) in listed} == on_disk  # the first attempt's file was removed


def test_a_flushs_rows_go_from_the_catalog_to_the_file_in_a_spark_task(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush of more than ``driver_flush_max_rows`` rows: the driver reads only the rows' ids and snapshots; the
    task reads their values from the catalog."""
    destination = kit.make_destination(lake, driver_flush_max_rows=0)
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    batch = b.commit().insert(KINDS, kind_row(1)).insert(KINDS, kind_row(2)).delete(KINDS, {"id": 1}).build()
    for target in (destination, reference):
        target.write_events(batch)
    real_read = inlined.read
    read_on_driver: list[list[str]] = []

    def recorded(conn: Any, name: str, columns: Any, *args: Any, **kwargs: Any) -> Any:
        read_on_driver.append([c.name for c in columns])
        return real_read(conn, name, columns, *args, **kwargs)

    monkeypatch.setattr(inlined, "read", recorded)
    jobs = flush_jobs(destination)
    assert read_on_driver == [[]]  # row ids and snapshots only
    assert len(jobs) == 1  # one Spark job
    assert inlined_rows(lake, live=False) == 0
    assert lake_rows(lake, KINDS) == expected(reference, KINDS)


def flush_jobs(destination: Any) -> list[int]:
    """Flush the kinds table's inlined rows; the Spark jobs the flush ran."""
    context = destination.lake.spark.sparkContext
    group = f"flush-{uuid.uuid4()}"
    context.setJobGroup(group, "the flush under test")
    try:
        destination.flush_inlined(destination.catalog.handle(KINDS.id).table)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return list(context.statusTracker().getJobIdsForGroup(group))


def test_a_small_flush_is_written_on_the_driver_with_no_spark_job(lake: Any, kit: Any) -> None:
    """Up to ``driver_flush_max_rows`` rows are read from the catalog and written on the driver: no Spark job (a task
    costs seconds, and a flush inside a batch makes the stream wait for it)."""
    destination, reference = three_kinds_inlined(lake, kit)
    assert flush_jobs(destination) == []
    assert inlined_rows(lake, live=False) == 0
    assert lake_rows(lake, KINDS) == expected(reference, KINDS)


@pytest.mark.parametrize("where", ["spark", "driver"])
def test_rows_gone_before_the_flush_read_them_start_the_flush_over(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """DuckDB flushes the rows after the driver read their ids, before their values are read (by the Spark task,
    or on the driver): fewer rows are written than the driver read (none), so the flush starts over, and finds
    none left to flush."""
    destination, reference = three_kinds_inlined(lake, kit, driver_flush_max_rows=0 if where == "spark" else 10)
    tasks = []

    def duckdb_flushes(*args: Any) -> None:
        tasks.append(args)
        con = lake.duckdb()
        con.execute("CALL ducklake_flush_inlined_data('lake')")
        con.close()

    if where == "spark":  # before the task is handed its rows to read
        real_job = LakeStorage.write_job

        def job(storage: LakeStorage, *args: Any) -> Any:
            duckdb_flushes(*args)
            return real_job(storage, *args)

        monkeypatch.setattr(LakeStorage, "write_job", job)
    else:  # before the driver reads their values
        real_read = inline_flush.FlushRows.__call__

        def read(rows: inline_flush.FlushRows, index: int) -> Any:
            duckdb_flushes(index)
            return real_read(rows, index)

        monkeypatch.setattr(inline_flush.FlushRows, "__call__", read)
    destination.flush_inlined(destination.catalog.handle(KINDS.id).table)
    assert len(tasks) == 1  # the second attempt found no inlined rows left
    assert inlined_rows(lake, live=False) == 0
    assert lake_rows(lake, KINDS) == expected(reference, KINDS)
    listed = lake.query("SELECT data_file FROM ducklake_list_files('lake', 'kinds', schema => 'public')")
    on_disk = {p.name for p in Path(lake.data_path).rglob("kinds/ducklake-*.parquet")}
    assert {Path(p).name for (p,) in listed} == on_disk  # DuckDB's file only


def test_unchanged_toast_values_and_keyless_deletes_find_rows_in_files_and_inlined_alike(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    first = b.commit().insert(KINDS, kind_row(1)).insert(PAIRS, {"a": "x", "b": 1}).insert(PAIRS, {"a": "y", "b": 2})
    batch = first.build()
    for target in (destination, reference):
        target.write_events(batch)
    for schema in (KINDS, PAIRS):
        destination.flush_inlined(destination.catalog.handle(schema.id).table)  # into files
    batch = b.commit().insert(KINDS, kind_row(2)).insert(PAIRS, {"a": "x", "b": 1}).build()  # inlined
    for target in (destination, reference):
        target.write_events(batch)
    third = (
        b.commit()
        .update(KINDS, {**kind_row(1), "label": "file row"}, missing=("raw", "doc"))
        .update(KINDS, {**kind_row(2), "label": "inlined row"}, missing=("raw", "doc"))
        .delete(PAIRS, {"a": "x", "b": 1})
        .delete(PAIRS, {"a": "x", "b": 1})  # one occurrence in a file, one inlined
        .delete(PAIRS, {"a": "y", "b": 2})
        .build()
    )
    for target in (destination, reference):
        target.write_events(third)
    for schema in (KINDS, PAIRS):
        assert lake_rows(lake, schema) == expected(reference, schema)
    assert {r["id"]: r["raw"] for r in lake_rows(lake, KINDS)} == {1: kind_row(1)["raw"], 2: kind_row(2)["raw"]}
    assert lake_rows(lake, PAIRS) == []


def test_rows_duckdb_inlined_are_updated_deleted_and_flushed(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    b = kit.BatchBuilder()
    destination.write_events(b.commit().insert(KINDS, kind_row(1)).insert(KINDS, kind_row(2)).build())
    con = lake.duckdb()
    con.execute("CALL lake.set_option('data_inlining_row_limit', 100)")  # DuckDB inlines its own rows too
    con.execute(
        "INSERT INTO lake.public.kinds VALUES"
        " (7, 'from duckdb', true, 2.5, 7.125, DATE '2024-02-03', TIMESTAMPTZ '2024-05-06 07:08:09.123456+00',"
        " TIMESTAMP '2020-01-01 00:00:00.5', TIME '01:02:03.000004', '00000000-0000-0000-0000-000000000007',"
        " '\\x00\\x07'::BLOB, '{\"n\": 7}', -7),"
        " (8, NULL, false, 'nan'::DOUBLE, -0.001, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    con.execute("CALL lake.set_option('data_inlining_row_limit', 0)")
    con.close()
    assert inlined_rows(lake) == 4 and catalog_count(lake, "ducklake_data_file") == 0
    stored = {r["id"]: r for r in lake_rows(lake, KINDS)}

    batch = (
        b.commit()
        .update(KINDS, {**stored[7], "label": "changed by the pipeline"})  # found by its key among DuckDB's rows
        .delete(KINDS, {"id": 8})
        .delete(KINDS, {"id": 1})
        .build()
    )
    destination.write_events(batch)
    stored[7] = {**stored[7], "label": "changed by the pipeline"}
    del stored[8], stored[1]
    assert lake_rows(lake, KINDS) == sort_rows(stored.values())
    destination.flush_inlined(destination.catalog.handle(KINDS.id).table)  # decodes DuckDB's values exactly
    assert inlined_rows(lake, live=False) == 0
    assert lake_rows(lake, KINDS) == sort_rows(stored.values())


def test_names_with_quotes_and_percent_signs_are_inlined(lake: Any, kit: Any) -> None:
    odd = TableSchema(
        16902,
        TableName("public", 'odd "100%"'),
        (ColumnSchema("id", 20, nullable=False, primary_key=True), ColumnSchema("share %s", 25)),
    )
    destination = kit.make_destination(lake)
    destination.write_events(kit.BatchBuilder().commit().insert(odd, {"id": 1, "share %s": "50%"}).build())
    assert lake.query('SELECT id, "share %s" FROM lake.public."odd ""100%"""') == [(1, "50%")]
    assert inlined_rows(lake) == 1


def test_dates_and_timestamps_duckdb_inlined_read_back_exactly(tmp_path: Path) -> None:
    """This writer reads DuckDB's own text of inlined extremes (infinities, BC and far years; timestamptz from a
    session in another time zone) as the values Postgres's text of them decodes to, and writes the same text."""
    columns = [LakeColumn(1, "d", "date", True), LakeColumn(2, "ts", "timestamp", True),
               LakeColumn(3, "tz", "timestamptz", True)]  # fmt: skip
    duckdb_texts = [  # what DuckDB is given, and what Postgres prints of the same values
        (("infinity", "infinity", "infinity"), ("infinity", "infinity", "infinity")),
        (("-infinity", "-infinity", "-infinity"), ("-infinity", "-infinity", "-infinity")),
        (("4714-11-24 (BC)", "4714-11-24 (BC) 00:00:00", "4714-11-24 (BC) 00:00:00"),
         ("4714-11-24 BC", "4714-11-24 00:00:00 BC", "4714-11-24 00:00:00+00 BC")),
        (("0044-03-15 (BC)", "0044-03-15 (BC) 01:02:03.456789", "0044-03-15 (BC) 01:02:03.456789"),
         ("0044-03-15 BC", "0044-03-15 01:02:03.456789 BC", "0044-03-15 01:02:03.456789+00 BC")),
        (("5874897-12-31", "294246-12-31 23:59:59.999999", "294246-12-31 23:59:59"),
         ("5874897-12-31", "294246-12-31 23:59:59.999999", "294246-12-31 23:59:59+00")),
        (("2024-02-29", "2024-02-29 12:34:56.5", "2024-02-29 12:34:56.5"),
         ("2024-02-29", "2024-02-29 12:34:56.5", "2024-02-29 12:34:56.5+00")),
        ((None, None, None), (None, None, None)),
    ]  # fmt: skip
    con = connect_duckdb("sqlite")
    con.execute(f"ATTACH 'ducklake:sqlite:{tmp_path}/c.sqlite' AS lake (DATA_PATH '{tmp_path}/data/')")
    con.execute("CREATE TABLE lake.t (d date, ts timestamp, tz timestamptz)")
    con.execute("SET TimeZone = 'Asia/Kolkata'")
    rows = ", ".join("(?, ?, ?::timestamp AT TIME ZONE 'UTC')" for _ in duckdb_texts)
    con.execute(f"INSERT INTO lake.t VALUES {rows}", [v for given, _ in duckdb_texts for v in given])  # inlined
    con.close()
    engine = sa.create_engine(f"sqlite:///{tmp_path}/c.sqlite")
    with engine.begin() as conn:
        (name,) = conn.execute(sa.text("SELECT table_name FROM ducklake_inlined_data_tables")).one()
        stored = inlined.read(conn, name, columns, Form.FILE, live=True)
        theirs = conn.execute(sa.text(f"SELECT d, ts, tz FROM {name} ORDER BY row_id")).all()
        inlined.create(conn, 1, 99, columns)
        inlined.insert(conn, inlined.table_name(1, 99), columns, stored, row_id_start=0, snapshot=1)
        ours = conn.execute(sa.text("SELECT d, ts, tz FROM ducklake_inlined_data_1_99 ORDER BY row_id")).all()
    engine.dispose()
    assert ours == theirs
    for i, (column, oid) in enumerate(zip(columns, (1082, 1114, 1184), strict=True)):
        postgres = pa.array([printed[i] for _, printed in duckdb_texts], pa.string())
        assert stored[column.name].combine_chunks() == decode_text_column(ColumnSchema("c", oid), postgres)
