"""A source transaction larger than a batch, written part by part and committed as one snapshot.

The stream hands such a transaction over in several batches (each but the last ``ends_in_transaction``). Each
part is planned as a batch is, against the lake as it would be with the earlier parts committed: their data
files are candidates for its deletes and lookups, and the positions they delete are left out (``overlay``). Its
data files are written into the table's directory, but no snapshot references them yet, and the positions it
deletes are kept in memory, with a delete file of them (unregistered) for the Spark jobs that read the table.
The part that commits the transaction registers all of it in one snapshot (``merged``).

Nothing the parts write is visible before then. Each write job's file name prefix is recorded in the catalog
first (``catalog.staging``); the commit forgets the records, and a start after a crash removes the files they
name that no snapshot references. A part never inlines rows, and a table's inlined rows are flushed before its
first part, so a part's deletes all land in files.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import structlog

from etl.api import COMMIT_LSN_COLUMN, Lsn, TableChanges, TableSchema
from etl_spark.collapse import Position
from etl_spark.ducklake.catalog import Catalog, DataFile, DeleteFile, Handle, NewFile
from etl_spark.ducklake.catalog.staging import StagedPrefix
from etl_spark.ducklake.lake import Lake
from etl_spark.ducklake.parquet_files import DataFileSpec, job_prefix
from etl_spark.ducklake.plan import TablePlan
from etl_spark.ducklake.storage import LakeStorage
from etl_spark.ducklake.table_state import TableState

log = structlog.get_logger(__name__)

_IDS: Iterator[int] = itertools.count(-1, -1)
"""Ids of the files an open transaction wrote, until its commit gives them theirs: negative, never reused (the key
cache keeps files by id)."""


@dataclass
class _Parts:
    """One table's parts so far."""

    plan: TablePlan
    """The latest part's plan: the table, its directory and source columns, as its commit will register them."""
    base: int
    """The lake's latest snapshot before the first part was planned: a later one that changed the table other
    than by inserting is a conflict."""
    truncate: bool = False
    files: list[NewFile] = field(default_factory=list)
    """Its data files since its last truncate, in order."""
    staged: list[DataFile] = field(default_factory=list)
    """The same files as planning reads them."""
    deletes: dict[int, pa.Array] = field(default_factory=dict)
    """The positions the parts deleted, by data file id (of the lake's files and of the parts' own); those the
    lake's own delete file holds are not among them."""
    overlays: dict[int, DeleteFile] = field(default_factory=dict)
    """By data file id: an unregistered delete file of every position deleted in it, the parts' and the lake's."""
    dropped: list[NewFile] = field(default_factory=list)
    """Its files from before a truncate, and the delete files it replaced: removed once it ends."""
    watermark: Position | None = None
    rows: int = 0


class OpenTransaction:
    """The parts written so far of the one source transaction the stream has not finished handing over."""

    def __init__(self, lake: Lake, commit_lsn: Lsn) -> None:
        self._lake = lake
        self.commit_lsn = commit_lsn
        """The commit LSN of its changes (the start of its commit record): a batch whose last commit ends past it
        ends the transaction."""
        self.marker: str | None = None
        """A record of its own in ``catalog.staging``, written before its first file: its commit removes it, so a
        commit tried again after one whose outcome was lost finds it gone (``AlreadyCommitted``)."""
        self._tables: dict[int, _Parts] = {}
        self._lake_files: dict[int, DataFile] = {}
        """The lake's data files the parts delete from, as the lake holds them (their own delete file)."""
        self.parts = 0
        self.split = False
        """Its parts so far commit before its end (a schema change inside it)."""
        self._emptied: set[int] = set()
        """The tables the last part truncates (``merged``)."""

    @property
    def lake(self) -> Lake:
        """The lake a part is planned on: each write job's name prefix is recorded before it writes."""
        return replace(self._lake, staging=self._record)

    @property
    def rows(self) -> int:
        return sum(parts.rows for parts in self._tables.values())

    def holds(self, source_table_id: int) -> bool:
        return source_table_id in self._tables

    def _record(self, spec: DataFileSpec, table_id: int | None) -> None:
        if table_id is None:  # the caller commits a table's creation first: a part never creates one
            raise AssertionError(f"a part of an open transaction writes files for a new table ({spec.directory})")
        self._lake.catalog.record_staged(StagedPrefix(table_id, spec.directory, spec.prefix))

    # -- planning --------------------------------------------------------------------------------
    def overlay(self, schema: TableSchema, state: TableState) -> TableState:
        """The table's state as planning reads it, with the parts so far as if committed."""
        for data_file in state.data_files:  # the deletes of its parts land in them as they are now
            self._lake_files[data_file.data_file_id] = data_file
        parts = self._tables.get(schema.id)
        if parts is None or state.handle is None:
            return state
        lake_files = [] if parts.truncate else list(state.data_files)
        files = [self._overlaid(f, parts) for f in [*lake_files, *parts.staged]]
        watermark = max(parts.watermark or state.handle.watermark, state.handle.watermark)
        return replace(state, handle=Handle(state.handle.table, watermark), data_files=files, inlined_tables=[])

    @staticmethod
    def _overlaid(data_file: DataFile, parts: _Parts) -> DataFile:
        overlay = parts.overlays.get(data_file.data_file_id)
        return data_file if overlay is None else replace(data_file, delete=overlay)

    def add(self, plans: Sequence[TablePlan], bases: dict[int, int], commit_lsn: Lsn) -> None:
        """Hold one part's plans (planned on ``overlay``; ``bases``: the lake's latest snapshot before each table's
        first part), all or none: a part that fails here (a delete file not written) leaves the parts as they were,
        and its files are removed, for the batch to be written again."""
        if not plans:
            return
        updated: dict[int, _Parts] = {}
        written: list[tuple[str, NewFile]] = []
        try:
            if self.marker is None:
                first = plans[0].handle
                assert first is not None  # a part never creates its table
                marker = "open-" + job_prefix()
                self._lake.catalog.record_staged(StagedPrefix(first.table.table_id, first.table.directory, marker))
                self.marker = marker
            for plan in plans:
                held = self._tables.get(plan.schema.id)
                parts = _Parts(plan, bases[plan.schema.id]) if held is None else copy.copy(held)
                if held is not None:  # its collections are replaced, never changed in place
                    parts.deletes, parts.overlays = dict(held.deletes), dict(held.overlays)
                    parts.files, parts.staged, parts.dropped = list(held.files), list(held.staged), list(held.dropped)
                self._add(parts, plan, written)
                updated[plan.schema.id] = parts
        except BaseException:
            for directory, file in written:
                _remove(self._lake.storage, directory, [file])
            for plan in plans:
                plan.discard(self._lake.storage)
            raise
        self._tables.update(updated)
        self.commit_lsn = max(self.commit_lsn, commit_lsn)
        self.parts += 1

    def _add(self, parts: _Parts, plan: TablePlan, written: list[tuple[str, NewFile]]) -> None:
        assert plan.inline is None and not plan.ended_inlined, "a part inlines no row and has none to end"
        parts.plan = plan
        if plan.truncate:
            parts.dropped += parts.files
            parts.dropped += [self._file_of(d) for d in parts.overlays.values()]
            parts.truncate, parts.files, parts.staged, parts.deletes, parts.overlays = True, [], [], {}, {}
        for file in plan.files:
            path = plan.directory + file.name
            parts.staged.append(DataFile(next(_IDS), path, file.record_count, None, file.size_bytes, 0, None))
        for data_file_id, (_, found) in plan.deletes.items():
            positions = pc.cast(found, pa.int64())
            held = parts.deletes.get(data_file_id)
            parts.deletes[data_file_id] = positions if held is None else pc.unique(pa.concat_arrays([held, positions]))
            written.append(self._write_overlay(parts, data_file_id))
        parts.files += plan.files
        parts.rows += sum(f.record_count for f in plan.files)
        parts.watermark = plan.watermark

    def _write_overlay(self, parts: _Parts, data_file_id: int) -> tuple[str, NewFile]:
        """Write the data file's deleted positions, the lake's and the parts', as a delete file no snapshot holds."""
        assert parts.plan.handle is not None  # a part never creates its table
        table = parts.plan.handle.table
        target = self._lake_files.get(data_file_id) or next(f for f in parts.staged if f.data_file_id == data_file_id)
        positions = parts.deletes[data_file_id]
        storage = self._lake.storage
        if target.delete is not None:
            positions = pc.unique(pa.concat_arrays([storage.deleted(target.delete)["pos"].combine_chunks(), positions]))
        prefix = job_prefix()
        self._lake.catalog.record_staged(StagedPrefix(table.table_id, table.directory, prefix))
        rows = pa.table({"pos": pc.cast(positions, pa.int64())}).sort_by("pos")
        written = storage.write_delete(table, target.path, rows, prefix)
        begin = target.delete.begin_snapshot if target.delete is not None else 0
        previous = parts.overlays.get(data_file_id)
        path = table.directory + written.name
        parts.overlays[data_file_id] = DeleteFile(next(_IDS), path, begin, False, rows.num_rows)
        if previous is not None:
            parts.dropped.append(self._file_of(previous))
        return table.directory, written

    @staticmethod
    def _file_of(delete: DeleteFile) -> NewFile:
        name = delete.path.rsplit("/", 1)[-1]
        return NewFile(name, delete.delete_count, 0, 0)

    # -- the commit ------------------------------------------------------------------------------
    def merged(self, plans: Sequence[TablePlan]) -> list[TablePlan]:
        """What one snapshot commits: the plans of the part that ends the transaction (planned on ``overlay``), each
        with its table's earlier parts, and the tables only earlier parts changed."""
        merged = []
        for plan in plans:
            parts = self._tables.get(plan.schema.id)
            merged.append(plan if parts is None else self._merge(parts, plan))
        planned = {plan.schema.id for plan in plans}
        for source_id, parts in self._tables.items():
            if source_id not in planned:
                merged.append(self._merge(parts, None))
        return merged

    def _merge(self, parts: _Parts, last: TablePlan | None) -> TablePlan:
        if last is not None and last.truncate:
            self._emptied.add(last.schema.id)
            return last  # the table was emptied: its earlier parts' files go (``leftovers``)
        deletes: dict[int, tuple[DataFile, pa.Array]] = {}
        staged = {f.data_file_id: f for f in parts.staged}
        for data_file_id, positions in parts.deletes.items():
            deletes[data_file_id] = (self._target(data_file_id, staged), positions)
        for data_file_id, (_, found) in (last.deletes if last is not None else {}).items():
            positions = pc.cast(found, pa.int64())
            held = parts.deletes.get(data_file_id)
            union = positions if held is None else pc.unique(pa.concat_arrays([held, positions]))
            deletes[data_file_id] = (self._target(data_file_id, staged), union)
        base = last if last is not None else replace(parts.plan, inline=None, ended_inlined=[])
        return replace(
            base,
            truncate=parts.truncate,
            files=[*parts.files, *base.files] if last is not None else list(parts.files),
            deletes=deletes,
            written_keys=None,
            check_since=parts.base,
        )

    def _target(self, data_file_id: int, staged: dict[int, DataFile]) -> DataFile:
        """A data file a delete lands in: the lake's as the lake holds it, or a file of the parts (its id negative,
        given its own by the commit)."""
        return staged[data_file_id] if data_file_id < 0 else self._lake_files[data_file_id]

    def tidy(self) -> None:
        """Once the transaction committed (``merged``): remove the overlays, the files of parts that a truncate
        emptied, and every part's files of a table that the last part truncates; then forget the records of them."""
        removed = True
        for source_id, parts in self._tables.items():
            files = [*parts.dropped, *(self._file_of(d) for d in parts.overlays.values())]
            if source_id in self._emptied:
                files += parts.files
            removed = _remove(self._lake.storage, parts.plan.directory, files) and removed
        if removed:  # else the next start removes what the records name
            self._lake.catalog.forget_staged()

    def drop(self, source_table_id: int) -> None:
        """Forget a table's parts (it errored, or was replaced: it is copied again); its files are removed as far as
        they can be (a start removes the rest)."""
        parts = self._tables.pop(source_table_id, None)
        if parts is not None:
            files = [*parts.dropped, *parts.files, *(self._file_of(d) for d in parts.overlays.values())]
            _remove(self._lake.storage, parts.plan.directory, files)

    def landed(self, states: dict[int, TableState]) -> bool:
        """Whether the lake holds every part already (``states``: its tables as they are now): each table's
        watermark at or past its last part's."""
        return all(
            (state := states.get(source_id)) is not None
            and state.handle is not None
            and parts.watermark is not None
            and state.handle.watermark >= parts.watermark
            for source_id, parts in self._tables.items()
        )

    def prune(self, states: dict[int, TableState]) -> None:
        """Drop the parts of tables whose lake table is no longer the one they were planned on (a resync replaced
        it: its copy brings the rows)."""
        for source_id, parts in list(self._tables.items()):
            state, planned = states.get(source_id), parts.plan.handle
            if state is None or planned is None:
                continue
            if state.handle is None or state.handle.table.table_id != planned.table.table_id:
                self.drop(source_id)

    @property
    def schemas(self) -> list[TableSchema]:
        """The schemas of the tables it holds parts of."""
        return [parts.plan.schema for parts in self._tables.values()]


def split_at(
    changes: dict[int, list[TableChanges]], lsn: Lsn
) -> tuple[dict[int, list[TableChanges]], dict[int, list[TableChanges]]]:
    """A batch's changes cut at ``lsn``, where its last commit ends: those of the transactions committed before (their
    commit records start before it), and those of the one it ends inside, whose commit record may start right there
    (a segment's changes are in stream order, so the cut is a slice)."""
    closed: dict[int, list[TableChanges]] = {}
    opened: dict[int, list[TableChanges]] = {}
    for table_id, segments in changes.items():
        for segment in segments:
            rows = segment.table
            if rows.num_rows == 0:  # a schema version alone: where the transaction that made it is
                side = closed if segment.schema.snapshot_lsn < lsn else opened
                side.setdefault(table_id, []).append(segment)
                continue
            lsns = rows[COMMIT_LSN_COLUMN].to_numpy()
            cut = int(np.searchsorted(lsns, lsns.dtype.type(int(lsn)), side="left"))  # a commit starts before it ends
            if cut:
                closed.setdefault(table_id, []).append(TableChanges(segment.schema, rows.slice(0, cut)))
            if cut < rows.num_rows:
                opened.setdefault(table_id, []).append(TableChanges(segment.schema, rows.slice(cut)))
    return closed, opened


def commit_lsn_of(segments: Sequence[TableChanges]) -> Lsn:
    """The commit LSN of the open transaction's changes (the last a segment holds)."""
    return Lsn(max((int(s.table[COMMIT_LSN_COLUMN][-1].as_py()) for s in segments if s.table.num_rows), default=0))


def remove_staged(catalog: Catalog, storage: LakeStorage) -> None:
    """Remove the files of an open transaction's parts that no snapshot references, and forget the records of them:
    at a start, those a run that died left; when a run gives its open transaction up, its own."""
    staged = catalog.staged()
    if not staged:
        return
    known = catalog.known_files(sorted({s.table_id for s in staged}))
    leftovers = []
    for directory in sorted({s.directory for s in staged}):
        prefixes = tuple(directory + s.prefix for s in staged if s.directory == directory)
        leftovers += [p for p in storage.files_in(directory) if p.startswith(prefixes) and p not in known]
    removed = storage.delete(leftovers)
    catalog.forget_staged()  # the records of a transaction that committed after its files' removal went too
    if removed:
        log.info("removed the files of a transaction that was not committed", files=removed)


def _remove(storage: LakeStorage, directory: str, files: Sequence[NewFile]) -> bool:
    """Remove files no snapshot references, those already gone skipped; whether that worked (a failure is logged:
    a start removes what the records name)."""
    try:
        storage.delete(directory + file.name for file in files)
    except OSError:
        log.warning("could not remove files of a transaction's parts", directory=directory, exc_info=True)
        return False
    return True
