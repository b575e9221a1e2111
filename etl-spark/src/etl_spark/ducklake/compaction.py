"""Compaction while the pipeline runs: small data files merged, files with many deleted rows rewritten.

Each step, for one table, is one Spark job (a task per file it writes: the task reads the old files by
field id with pyarrow and writes the new one, returning only its metadata) and one snapshot.

- **Merge**: once a table holds ``merge_min_files`` files under ``merge_below_bytes`` written since its
  columns last changed, they are merged, oldest first, into a file of up to the target size (more wait
  for the next step). A merged file keeps each row's id and the snapshot that inserted it
  (``_ducklake_internal_row_id``, ``_ducklake_internal_snapshot_id``, ``partial_max``), deleted rows
  too, and gets one delete file that keeps the snapshot of each delete; so time travel and the change
  feed read what they read before. The old files leave the catalog and are scheduled for deletion
  (``merge_adjacent:<table id>``), as DuckDB's ``ducklake_merge_adjacent_files`` does. DuckDB's merge
  leaves files that have deletes alone; this one takes them, or the files of a table whose rows are
  updated would never merge.
- **Rewrite**: a file whose deleted rows reach ``rewrite_delete_ratio`` of its rows becomes a file of
  its live rows, which keep their ids (``rewrite_delete:<table id>``), as DuckDB's
  ``ducklake_rewrite_data_files`` does. The old file ends there: time travel to before it still reads
  it, until its snapshots expire (``catalog.retention``). The change feed shows the rewritten rows as
  updated to themselves, as after DuckDB's rewrite.

A step whose files another writer changed meanwhile (DuckDB; the destination runs steps between its
own batches) gives up, and the next round tries again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import structlog

from etl_spark.ducklake.catalog import CommitConflict, Composed, DataFile, LakeTable, NewFile, Placed, Transaction
from etl_spark.ducklake.initial_default import default_values
from etl_spark.ducklake.lake import Lake
from etl_spark.ducklake.parquet_files import (
    ONE_FILE,
    ROW_ID,
    SNAPSHOT,
    DataFileSpec,
    file_schema,
    filesystem,
    local_path,
    own_stats,
)
from etl_spark.ducklake.storage import NATIVE_TYPES
from etl_spark.ducklake.types import FIELD_ID, Form

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Source:
    """A data file a compaction task reads (pickled into the task)."""

    path: str
    row_id_start: int | None
    """``None``: the file holds its rows' ids."""
    begin_snapshot: int
    deletes: str | None = None
    """A delete file whose rows are left out (a rewrite)."""


def merge_small_files(lake: Lake, table: LakeTable, below_bytes: int, min_files: int) -> int:
    """Merge the table's small files, oldest first, into one file of up to the target size, when it holds at
    least ``min_files``; how many files were merged. (One file a step: a batch waits for one step at most.)"""
    base = lake.catalog.latest_snapshot()
    small = [f for f in _candidates(lake, table) if f.size_bytes < below_bytes and f.record_count]
    if len(small) < min_files:
        return 0
    groups = _groups(small, lake.target_file_size_bytes)[:1]
    if not groups:
        return 0
    spec = lake.table_spec(table, [*table.columns, ROW_ID, SNAPSHOT], ONE_FILE)
    sources = [[Source(f.path, f.row_id_start, f.begin_snapshot) for f in group] for group in groups]
    written = _run(lake, spec, sources, f"etl: merge {len(small)} files of {table.schema_name}.{table.name}")
    composed: list[Composed] = []
    try:
        for group, file in zip(groups, written, strict=True):
            composed.append(_merged(lake, table, group, file))
    except BaseException:
        _discard(lake, table, composed, written)
        raise
    changes = partial(_merge, table=table, groups=groups, composed=composed)
    if not _commit(lake, table, base, changes, lambda: _discard(lake, table, composed, written)):
        return 0
    merged = sum(len(g) for g in groups)
    log.info("merged small data files", table=f"{table.schema_name}.{table.name}", files=merged, into=len(groups))
    return merged


def rewrite_deleted(lake: Lake, table: LakeTable, ratio: float) -> int:
    """Rewrite the table's files whose deleted rows reach ``ratio`` of their rows; how many were rewritten."""
    base = lake.catalog.latest_snapshot()
    doomed = [
        f
        for f in _candidates(lake, table)
        if f.delete is not None and f.record_count and f.delete.delete_count >= ratio * f.record_count
    ]
    if not doomed:
        return 0
    live = [f for f in doomed if f.delete is not None and f.delete.delete_count < f.record_count]
    written: list[NewFile] = []
    if live:
        spec = lake.table_spec(table, [*table.columns, ROW_ID], ONE_FILE)
        sources = [
            [Source(f.path, f.row_id_start, f.begin_snapshot, f.delete.path if f.delete else None)] for f in live
        ]
        written = _run(lake, spec, sources, f"etl: rewrite {len(live)} files of {table.schema_name}.{table.name}")
    placed = Placed(None, None, None)
    by_file = {
        f.data_file_id: Composed(own_stats(table.columns, w), placed) for f, w in zip(live, written, strict=True)
    }
    rewrites = [(f, by_file.get(f.data_file_id)) for f in doomed]  # None: every row deleted, no new file
    changes = partial(_rewrite, table=table, rewrites=rewrites)
    if not _commit(lake, table, base, changes, lambda: lake.storage.remove(table.directory, written)):
        return 0
    log.info("rewrote data files with many deletes", table=f"{table.schema_name}.{table.name}", files=len(doomed))
    return len(doomed)


def _candidates(lake: Lake, table: LakeTable) -> list[DataFile]:
    """The active files a step may take: written since the table's columns last changed (so they hold its
    columns as they are), with uuid and time in their own Parquet types (not the text of older writers)."""
    since = lake.catalog.columns_changed(table.table_id)
    native = {c.column_id for top in table.columns for c in top.with_elements() if c.type in NATIVE_TYPES}
    return [
        f
        for f in lake.catalog.data_files(table)
        if f.begin_snapshot >= since and lake.storage.native_columns(f.path, table.columns) == native
    ]


def _groups(files: Sequence[DataFile], target_bytes: int) -> list[list[DataFile]]:
    """Consecutive files in groups of up to ``target_bytes``; groups of one file are left out."""
    groups: list[list[DataFile]] = [[]]
    size = 0
    for file in files:
        if groups[-1] and size + file.size_bytes > target_bytes:
            groups.append([])
            size = 0
        groups[-1].append(file)
        size += file.size_bytes
    return [g for g in groups if len(g) > 1]


def _run(lake: Lake, spec: DataFileSpec, sources: list[list[Source]], description: str) -> list[NewFile]:
    """One Spark job: task ``i`` writes the rows of ``sources[i]`` as one file."""
    files = lake.storage.write_job(lake.spark, spec, len(sources), partial(_rows, spec, sources), description)
    if len(files) != len(sources):  # each task writes exactly one file
        lake.storage.remove(spec.directory, files)
        raise RuntimeError(f"{description}: {len(files)} files written for {len(sources)} tasks")
    return files


def _rows(spec: DataFileSpec, sources: list[list[Source]], index: int) -> Iterator[pa.Table]:
    """In a task: the rows of one group's files, in order, a file at a time."""
    fs, root = filesystem(spec.data_path)
    for source in sources[index]:
        yield read_source(fs, lambda path: local_path(root, spec.data_path, path), source, spec)


def read_source(fs: pafs.FileSystem, local: Callable[[str], str], source: Source, spec: DataFileSpec) -> pa.Table:
    """A data file's rows as ``spec``'s columns, found by field id: row ids and snapshots from the file when it
    holds them, else from its catalog entry; the rows of ``source.deletes`` left out."""
    data = pq.read_table(local(source.path), filesystem=fs)
    by_id = {int(f.metadata[FIELD_ID]): f.name for f in data.schema if f.metadata and FIELD_ID in f.metadata}
    rows = data.num_rows
    columns: dict[str, pa.ChunkedArray | pa.Array] = {}
    for column, field in zip(spec.columns, file_schema(spec.columns), strict=True):
        if column.column_id in by_id:
            columns[column.name] = data[by_id[column.column_id]]
        elif column == ROW_ID and source.row_id_start is not None:
            columns[column.name] = pa.array(np.arange(source.row_id_start, source.row_id_start + rows, dtype=np.int64))
        elif column == SNAPSHOT:
            columns[column.name] = pa.array(np.full(rows, source.begin_snapshot, dtype=np.int64))
        elif column.initial_default is not None:  # a column added after the file: what DuckDB reads there
            columns[column.name] = default_values(column, column.initial_default, rows, Form.FILE)
        else:  # a column the file does not hold (or, were it to lack them, its row ids): NULL
            columns[column.name] = pa.nulls(rows, field.type)
    table = pa.table(columns)
    if source.deletes is not None:
        deleted = pq.read_table(local(source.deletes), columns=["pos"], filesystem=fs)["pos"].combine_chunks()
        positions = pa.array(np.arange(rows, dtype=np.int64))
        table = table.filter(pc.invert(pc.is_in(positions, value_set=deleted)))
    return table


def _merged(lake: Lake, table: LakeTable, group: Sequence[DataFile], file: NewFile) -> Composed:
    """The catalog entry of a merged file: where its rows sit (from its own row id and snapshot statistics),
    and a delete file of the rows its files had deleted, at their positions in it."""
    stats = {s.column_id: s for s in file.stats}
    row_ids, snapshots = stats[ROW_ID.column_id], stats[SNAPSHOT.column_id]
    placed = Placed(int(str(row_ids.min_value)), int(str(snapshots.min_value)), int(str(snapshots.max_value)))
    deleted, offset = [], 0
    for old in group:
        if old.delete is not None:
            positions = lake.storage.read_delete(old.delete.path, old.delete.begin_snapshot)
            deleted.append(positions.set_column(0, "pos", pc.add(positions["pos"], offset)))
        offset += old.record_count
    composed = Composed(own_stats(table.columns, file), placed)
    if not deleted:
        return composed
    rows = pa.concat_tables(deleted).sort_by("pos")
    deletes = lake.storage.write_delete(table, table.directory + file.name, rows)
    return replace(composed, deletes=deletes, deletes_begin=pc.min(rows[SNAPSHOT.name]).as_py())


def _merge(txn: Transaction, *, table: LakeTable, groups: list[list[DataFile]], composed: list[Composed]) -> None:
    current = txn.table(table.table_id)
    for group, merged in zip(groups, composed, strict=True):
        txn.merge_data_files(current, group, merged)


def _rewrite(txn: Transaction, *, table: LakeTable, rewrites: list[tuple[DataFile, Composed | None]]) -> None:
    current = txn.table(table.table_id)
    for old, new in rewrites:
        txn.rewrite_data_file(current, old, new)


def _commit(
    lake: Lake, table: LakeTable, base: int, changes: Callable[[Transaction], None], discard: Callable[[], None]
) -> bool:
    """Commit a step's snapshot; ``False`` (its files discarded) when another writer changed the table since
    snapshot ``base``, which the step read."""
    try:
        lake.catalog.commit(changes, base_snapshot=base, tables=[table.table_id])
    except CommitConflict as conflict:
        discard()
        log.info("table changed during upkeep; trying again later", table_id=table.table_id, reason=str(conflict))
        return False
    except BaseException:
        discard()
        raise
    return True


def _discard(lake: Lake, table: LakeTable, composed: Sequence[Composed], written: Sequence[NewFile]) -> None:
    """Delete a merge's files: those written, with the delete files of those described so far."""
    for merged in composed:
        lake.storage.discard(table.directory, merged)
    lake.storage.remove(table.directory, written[len(composed) :])
