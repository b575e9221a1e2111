"""Maintenance while the pipeline runs (``[destination.maintenance]``): merge, rewrite, expire, clean up.

Real DuckDB reads the lake before and after each step: the latest snapshot equals the memory
destination fed the same batches, every earlier snapshot reads what it read before, and the change
feed is unchanged. Expiry is compared with DuckDB's own on a copy of the catalog.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
import uuid
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from etl.destination.memory import MemoryDestination, sort_rows
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.ducklake.compaction import merge_small_files, rewrite_deleted
from etl_spark.ducklake.config import DuckLakeConfig
from etl_spark.ducklake.destination import DuckLakeDestination
from etl_spark.ducklake.maintenance import Maintenance, MaintenanceConfig

ITEMS = TableSchema(
    17100,
    TableName("public", "items"),
    (
        ColumnSchema("id", 20, nullable=False, primary_key=True, attnum=1),
        ColumnSchema("label", 25, attnum=2),
        ColumnSchema("token", 2950, attnum=3),
        ColumnSchema("tags", 1009, attnum=4),
    ),
)
NAMES = ITEMS.column_names
UPDATE = ("update_preimage", "update_postimage")


def item(i: int, label: str = "") -> dict[str, Any]:
    return {"id": i, "label": label or f"item {i}", "token": str(uuid.UUID(int=i)), "tags": [f"t{i}", "x"]}


def rows_at(lake: Any, version: int | None = None) -> list[dict[str, Any]]:
    at = f" AT (VERSION => {version})" if version is not None else ""
    found = lake.query(f"SELECT id, label, token::VARCHAR, tags FROM lake.public.items{at}")
    return sort_rows(dict(zip(NAMES, r, strict=True)) for r in found)


def expected(reference: MemoryDestination) -> list[dict[str, Any]]:
    return sort_rows(reference.rows(str(ITEMS.name)))


def latest(lake: Any) -> int:
    return int(lake.query("SELECT max(snapshot_id) FROM lake.snapshots()")[0][0])


def history(lake: Any) -> dict[int, list[dict[str, Any]]]:
    """What every snapshot since the table's creation reads."""
    first = int(lake.query("SELECT min(begin_snapshot) FROM __ducklake_metadata_lake.ducklake_table")[0][0])
    return {v: rows_at(lake, v) for v in range(first, latest(lake) + 1)}


def changes(lake: Any, since: int) -> list[tuple[Any, ...]]:
    feed = lake.query(
        "SELECT snapshot_id, change_type, id, label FROM ducklake_table_changes('lake', 'public', 'items', ?, ?)",
        [since, latest(lake)],
    )
    return sorted(feed)


def active_files(lake: Any) -> int:
    return len(lake.query("SELECT data_file FROM ducklake_list_files('lake', 'items', schema => 'public')"))


def feed(destination: DuckLakeDestination, reference: MemoryDestination, kit: Any, batches: int, start: int) -> None:
    """``batches`` batches, each inserting rows and updating and deleting rows of earlier batches."""
    b = kit.BatchBuilder(lsn=0x1000 + start * 0x1000)
    for n in range(start, start + batches):
        b.commit()
        for i in range(n * 10, n * 10 + 10):
            b.insert(ITEMS, item(i))
        if n:
            b.update(ITEMS, item((n - 1) * 10 + 1, f"updated in {n}")).delete(ITEMS, {"id": (n - 1) * 10 + 2})
        batch = b.build()
        destination.write_events(batch)
        reference.write_events(batch)


def files_only(kit: Any, lake: Any, **options: Any) -> DuckLakeDestination:
    """A destination that writes every batch as files (no inlining), to have many small files."""
    return kit.make_destination(lake, inline_row_limit=0, **options)


def test_merge_keeps_every_snapshot_and_the_change_feed(lake: Any, kit: Any) -> None:
    destination, reference = files_only(kit, lake), MemoryDestination()
    feed(destination, reference, kit, batches=6, start=0)
    before, feed_before = history(lake), changes(lake, 0)
    assert active_files(lake) == 6

    table = destination.catalog.handle(ITEMS.id).table
    assert merge_small_files(destination.lake, table, below_bytes=1 << 30, min_files=2) == 6
    assert active_files(lake) == 1
    assert rows_at(lake) == expected(reference)
    assert {v: rows for v, rows in history(lake).items() if v in before} == before  # time travel unchanged
    assert changes(lake, 0) == feed_before  # so is the change feed
    scheduled = lake.query("SELECT count(*) FROM __ducklake_metadata_lake.ducklake_files_scheduled_for_deletion")
    assert scheduled[0][0] == 6 + 5  # the six data files and the delete files of five of them

    feed(destination, reference, kit, batches=2, start=6)  # updates and deletes reach rows of the merged file
    assert rows_at(lake) == expected(reference)
    assert merge_small_files(destination.lake, table, below_bytes=1 << 30, min_files=2) == 3
    assert rows_at(lake) == expected(reference)

    con = lake.duckdb()  # DuckDB compacts between our batches, and reads what we merged
    con.execute("CALL ducklake_merge_adjacent_files('lake')")
    con.close()
    feed(destination, reference, kit, batches=1, start=8)
    assert rows_at(lake) == expected(reference)


def test_merge_waits_for_enough_small_files_and_leaves_big_ones(lake: Any, kit: Any) -> None:
    destination, reference = files_only(kit, lake), MemoryDestination()
    feed(destination, reference, kit, batches=3, start=0)
    table = destination.catalog.handle(ITEMS.id).table
    assert merge_small_files(destination.lake, table, below_bytes=1 << 30, min_files=4) == 0
    assert merge_small_files(destination.lake, table, below_bytes=100, min_files=2) == 0  # none is that small
    assert active_files(lake) == 3


def test_rewrite_drops_deleted_rows_and_time_travel_still_reads_them(lake: Any, kit: Any) -> None:
    destination, reference = files_only(kit, lake), MemoryDestination()
    feed(destination, reference, kit, batches=2, start=0)
    b = kit.BatchBuilder(lsn=0x100000).commit()
    for i in range(3, 10):  # 7 of the first file's 10 rows (9 with the batch before)
        b.delete(ITEMS, {"id": i})
    batch = b.build()
    for target in (destination, reference):
        target.write_events(batch)
    before, feed_before = history(lake), changes(lake, 0)

    table = destination.catalog.handle(ITEMS.id).table
    assert rewrite_deleted(destination.lake, table, ratio=0.8) == 1  # only the first file
    assert rows_at(lake) == expected(reference)
    assert {v: rows for v, rows in history(lake).items() if v in before} == before
    # As after DuckDB's own rewrite, the feed shows the rewritten file's live row as updated to itself.
    assert changes(lake, 0) == sorted([*feed_before, *((latest(lake), kind, 0, "item 0") for kind in UPDATE)])
    files = lake.query(
        "SELECT data_file, delete_file FROM ducklake_list_files('lake', 'items', schema => 'public') ORDER BY 1"
    )
    assert [f[1] for f in files] == [None, None]  # the rewritten file has no deletes, nor had the other
    assert sorted(pq.ParquetFile(f[0]).metadata.num_rows for f in files) == [1, 11]  # one live row of ten left
    feed(destination, reference, kit, batches=1, start=2)
    assert rows_at(lake) == expected(reference)


@pytest.mark.parametrize("lake", ["sqlite"], indirect=True)  # two copies of one catalog: a file copy
def test_expiry_removes_what_duckdbs_expiry_removes_and_cleanup_deletes_the_files(
    lake: Any, kit: Any, tmp_path: Path
) -> None:
    destination, reference = files_only(kit, lake), MemoryDestination()
    feed(destination, reference, kit, batches=4, start=0)
    table = destination.catalog.handle(ITEMS.id).table
    assert rewrite_deleted(destination.lake, table, ratio=0.1) > 0  # ended files, for expiry to remove
    feed(destination, reference, kit, batches=1, start=4)
    destination.shutdown()
    catalog = Path(lake.url.removeprefix("sqlite:///"))
    twin = tmp_path / "twin.sqlite"
    shutil.copy(catalog, twin)
    now = datetime.now(UTC)
    con = lake.duckdb_bare()
    con.execute(f"ATTACH 'ducklake:sqlite:{twin}' AS twin")
    con.execute("CALL ducklake_expire_snapshots('twin', older_than => ?)", [now])
    con.close()

    destination = files_only(kit, lake)
    maintenance = Maintenance(MaintenanceConfig(cleanup_after_seconds=0), destination.metrics)
    assert destination.catalog.expire_snapshots(now) > 0

    def entries(path: Path) -> list[Any]:
        with closing(sqlite3.connect(path)) as db:
            return [
                db.execute(f"SELECT {key} FROM {table} ORDER BY 1").fetchall()
                for table, key in (
                    ("ducklake_snapshot", "snapshot_id"),
                    ("ducklake_data_file", "data_file_id"),
                    ("ducklake_delete_file", "delete_file_id"),
                    ("ducklake_file_column_stats", "data_file_id, column_id"),
                    ("ducklake_files_scheduled_for_deletion", "data_file_id, path"),
                )
            ]

    assert entries(catalog) == entries(twin)
    assert rows_at(lake) == expected(reference)

    maintenance.cleanup(destination.lake)
    on_disk = {str(p) for p in Path(lake.data_path).rglob("*.parquet")}
    listed = lake.query("SELECT data_file, delete_file FROM ducklake_list_files('lake', 'items', schema => 'public')")
    assert on_disk == {f for pair in listed for f in pair if f is not None}  # nothing more, nothing less
    assert lake.query("SELECT count(*) FROM __ducklake_metadata_lake.ducklake_files_scheduled_for_deletion") == [(0,)]
    assert rows_at(lake) == expected(reference)


def test_files_no_writer_registered_are_deleted_once_old(lake: Any, kit: Any) -> None:
    destination, reference = files_only(kit, lake), MemoryDestination()
    feed(destination, reference, kit, batches=2, start=0)
    directory = Path(destination.catalog.handle(ITEMS.id).table.directory)
    old, fresh = (directory / f"ducklake-{uuid.uuid4()}.parquet" for _ in range(2))  # a crash's, one being written
    foreign = directory / "important.conf"  # not named as the lake's files are: never deleted
    for stray in (old, fresh, foreign):
        stray.write_bytes(b"PAR1")
    an_hour_ago = time.time() - 3600
    for path in directory.iterdir():  # registered files as old: they stay
        if path != fresh:
            os.utime(path, (an_hour_ago, an_hour_ago))
    maintenance = Maintenance(MaintenanceConfig(orphan_after_seconds=600), destination.metrics)

    maintenance.orphans(destination.lake, copying=lambda: True)  # a copy under way: nothing is deleted
    assert old.exists()
    maintenance.orphans(destination.lake, copying=lambda: False)
    assert not old.exists() and fresh.exists() and foreign.exists()
    assert rows_at(lake) == expected(reference)


def test_maintenance_runs_between_batches_while_the_pipeline_streams(lake: Any, kit: Any) -> None:
    settings = {"every_seconds": 1, "merge_min_files": 3, "rewrite_delete_ratio": 0.15, "cleanup_after_seconds": 0}
    destination, reference = files_only(kit, lake, maintenance=settings), MemoryDestination()

    def done(step: str) -> float:
        return destination.metrics.registry.get_sample_value("etl_ducklake_maintenance_total", {"step": step}) or 0

    steps = ("merge", "rewrite", "cleanup")  # a file with 2 of its 11 rows deleted passes 0.15: rewritten
    for start in range(0, 12, 3):
        feed(destination, reference, kit, batches=3, start=start)
        deadline = time.monotonic() + 60
        while not all(done(step) for step in steps) and time.monotonic() < deadline:
            time.sleep(0.2)
        with destination._writing.batch():  # no cleanup under way: with no grace, it deletes what a reader reads
            assert rows_at(lake) == expected(reference)
    assert all(done(step) for step in steps)
    destination.shutdown()
    assert active_files(lake) < 12
    assert rows_at(lake) == expected(reference)


def test_maintenance_settings_are_checked(lake: Any) -> None:
    base = {"catalog": lake.url, "data_path": lake.data_path}
    assert DuckLakeConfig.model_validate(base).maintenance is None  # off unless asked for
    assert DuckLakeConfig.model_validate({**base, "maintenance": {}}).maintenance == MaintenanceConfig()
    for wrong in ({"merge_min_files": 1}, {"orphan_after_seconds": 0}, {"rewrite_delete_ratio": 1.5}, {"nope": 1}):
        with pytest.raises(ValidationError):
            DuckLakeConfig.model_validate({**base, "maintenance": wrong})
