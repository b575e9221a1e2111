"""Writing the stream's batches into the lake.

Each batch's tables are planned side by side, one planning thread each (``plan.plan_changes``: Spark work and data
files), and committed in one snapshot per schema version of a table the batch changes, the last of which records
the batch's end as the lake's position (``catalog.positions``; alone when the batch changes no table). A batch
holds whole transactions but when it ends inside one larger than a batch: its part of that one is written into
files no snapshot references, and the batch that ends the transaction commits every part with its own changes
(``open_transaction``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from functools import partial

import structlog

from etl.api import DestinationError, EventBatch, Lsn, TableChanges, TableError, TableErrors, naming_table
from etl_spark.ducklake.catalog import CommitConflict, LakeTable, Transaction
from etl_spark.ducklake.config import DuckLakeConfig
from etl_spark.ducklake.lake import Lake
from etl_spark.ducklake.metrics import DuckLakeMetrics
from etl_spark.ducklake.open_transaction import OpenTransaction, commit_lsn_of, remove_staged, split_at
from etl_spark.ducklake.plan import FlushFirst, TablePlan, changes_table, inline_limits, plan_changes
from etl_spark.ducklake.storage import LakeStorage
from etl_spark.ducklake.table_state import TableState, read_states

log = structlog.get_logger(__name__)


class BatchCommits:
    """Plans and commits the stream's batches; holds the parts of the transaction the stream is inside (``open``)."""

    def __init__(
        self,
        lake: Callable[[], Lake],
        config: DuckLakeConfig,
        metrics: DuckLakeMetrics,
        *,
        planner: Callable[[], ThreadPoolExecutor],
        flush_inlined: Callable[[LakeTable], None],
        committed: Callable[[list[TablePlan]], None],
    ) -> None:
        self._lake = lake
        self._config = config
        self._metrics = metrics
        self._planner = planner
        self._flush_inlined = flush_inlined
        """Flush a table's inlined rows into a data file (a snapshot of its own)."""
        self._committed = committed
        """Told of each batch snapshot's plans once committed."""
        self.open: OpenTransaction | None = None
        """The parts written so far of a transaction larger than a batch."""

    def write(self, batch: EventBatch) -> None:
        """Commit the batch's whole transactions, with the parts of the open one when the batch ends it, and write
        its part of a transaction it ends inside. A table that errors loses its parts (it is copied again)."""
        try:
            self._write(batch)
        except (TableError, TableErrors) as exc:
            if self.open is not None:
                for error in exc.errors if isinstance(exc, TableErrors) else (exc,):
                    if error.table_id is not None:
                        self.open.drop(error.table_id)
            raise

    def abandon(self) -> None:
        """Give the open transaction up (a shutdown: the next run replays it), removing what its parts wrote."""
        if self.open is None:
            return
        self.open = None
        self._metrics.open_transaction_rows.set(0)
        try:
            remove_staged(self._lake().catalog, self._lake().storage)
        except Exception:  # the next start removes them
            log.warning("could not remove the files of a transaction that was not committed", exc_info=True)

    def _write(self, batch: EventBatch) -> None:
        changes, opening = batch.changes, dict[int, list[TableChanges]]()
        if batch.ends_in_transaction:
            changes, opening = split_at(batch.changes, batch.last_commit_lsn)
        position, consistent, recorded = batch.last_commit_lsn or None, batch.all_tables_ready, False
        open_ = self.open
        # ``last_commit_lsn`` is the end of a commit record; the open transaction's may start right there
        if open_ is not None and (not batch.ends_in_transaction or batch.last_commit_lsn > open_.commit_lsn):
            if not self._splits(open_, changes):
                recorded, changes = self._end_open(open_, changes, position, consistent, checked=True), {}
            else:  # a later transaction of the batch changes a schema: the open one commits in a snapshot first
                mine, changes = split_at(changes, Lsn(open_.commit_lsn + 1))
                recorded = self._end_open(open_, mine, None if changes else position, consistent)
        self._commit_closed(changes, position, consistent, recorded)
        if opening:
            self._stage(opening)

    def _splits(self, open_: OpenTransaction, changes: dict[int, list[TableChanges]]) -> bool:
        """Whether the changes cannot join the open transaction's snapshot: two schema versions of a table, or a
        change of a held table's columns."""
        return _rounds(changes) > 1 or self._changes_open_tables(open_, changes)

    def _end_open(
        self,
        open_: OpenTransaction,
        changes: dict[int, list[TableChanges]],
        position: Lsn | None,
        consistent: bool,
        checked: bool = False,
    ) -> bool:
        """Commit the open transaction's last changes with its parts, in one snapshot (at ``position``, if any);
        whether that recorded the position. Its last changes alone decide (unless ``checked`` already): a schema
        change among them splits it."""
        if not checked and self._splits(open_, changes):
            self._split_open("its last part changes a table's columns")
            return self._commit_closed(changes, position, consistent)
        segments = [segs[0] for segs in changes.values()]
        make = partial(self.plan_all, segments, open_) if segments else list
        plans = self.commit_plans(make, position, consistent, open_)
        self._committed(plans)
        return bool(plans) and position is not None

    def _commit_closed(
        self, changes: dict[int, list[TableChanges]], position: Lsn | None, consistent: bool, recorded: bool = False
    ) -> bool:
        """Commit whole transactions, one snapshot per schema version of a table, the last at ``position`` (recorded
        alone when no snapshot holds it and it was not ``recorded`` yet); whether it is recorded."""
        rounds = _rounds(changes)
        for index in range(rounds):
            segments = [segs[index] for segs in changes.values() if index < len(segs)]
            at = position if index == rounds - 1 else None
            plans = self.commit_plans(partial(self.plan_all, segments), at, consistent)
            recorded = recorded or (bool(plans) and at is not None)
            self._committed(plans)
        if position is not None and not recorded:
            self._lake().catalog.record_position(position)
        return position is not None

    def _stage(self, changes: dict[int, list[TableChanges]]) -> None:
        """Write a part of the open transaction: planned on the lake with its earlier parts, committed with its
        last. A part that changes a table's columns (or creates one) commits the parts so far, and itself, in
        snapshots of their own, as any batch: the transaction is split there."""
        segments = [segment for segs in changes.values() for segment in segs]
        if self.open is None:
            self.open = OpenTransaction(self._lake(), commit_lsn_of(segments))
        open_ = self.open
        base = self._lake().catalog.latest_snapshot()
        states = read_states(self._lake().catalog, [s.schema for s in segments])
        if any(len(segs) > 1 for segs in changes.values()) or self._changes_open_tables(open_, changes, states, True):
            self._split_open("a part changes a table's columns")
            self._commit_closed(changes, None, False)
            return
        flush = [
            handle.table
            for s in segments
            if not open_.holds(s.schema.id)
            and states[s.schema.id].inlined_tables
            and (handle := states[s.schema.id].handle) is not None
        ]
        if flush:  # a part ends no inlined row: they go to files first (a snapshot that changes no row)
            for table in flush:
                self._flush_inlined(table)
            base = self._lake().catalog.latest_snapshot()
            states = read_states(self._lake().catalog, [s.schema for s in segments])
        plans = [plan for plan in self.plan_all(segments, open_, states, part=True) if plan is not None]
        open_.add(plans, {s.schema.id: base for s in segments}, commit_lsn_of(segments))
        self._metrics.open_transaction_rows.set(open_.rows)

    def _changes_open_tables(
        self,
        open_: OpenTransaction,
        changes: dict[int, list[TableChanges]],
        states: dict[int, TableState] | None = None,
        every: bool = False,
    ) -> bool:
        """Whether the changes would create a table, or change the name or columns of one: of a table the open
        transaction holds, or (``every``) of any."""
        segments = [s for segs in changes.values() for s in segs if every or open_.holds(s.schema.id)]
        if not segments:
            return False
        if states is None:
            states = read_states(self._lake().catalog, [s.schema for s in segments])
        return any(s.table.num_rows == 0 or changes_table(s.schema, states[s.schema.id]) for s in segments)

    def _split_open(self, why: str) -> None:
        """Commit the open transaction's parts so far in a snapshot of their own (a state the source never had)."""
        open_ = self.open
        if open_ is None or not open_.parts:
            self.open = None
            return
        log.warning(
            "a transaction larger than a batch is split over snapshots: " + why,
            parts=open_.parts,
            rows=open_.rows,
            hint="each snapshot holds whole transactions but at such a schema change",
        )
        open_.split = True
        self.commit_plans(list, None, False, open_)

    def plan_all(
        self,
        segments: list[TableChanges],
        open_: OpenTransaction | None = None,
        states: dict[int, TableState] | None = None,
        part: bool = False,
    ) -> list[TablePlan | None]:
        """Plan each table's changes on a thread of its own; when one fails, the files of the others are removed.
        With ``open_``, the tables are planned as they would be with its parts committed; a ``part`` of it inlines
        no row, and records its write jobs."""
        limits = inline_limits([s.table.num_rows for s in segments], 0 if part else self._config.inline_row_limit)
        if states is None:
            states = read_states(self._lake().catalog, [s.schema for s in segments])
        if open_ is not None:
            states = {s.schema.id: open_.overlay(s.schema, states[s.schema.id]) for s in segments}
        lake = open_.lake if part and open_ is not None else self._lake()
        if len(segments) == 1:
            return [self._plan_changes(lake, segments[0], limits[0], states[segments[0].schema.id])]
        futures = [
            self._planner().submit(self._plan_changes, lake, segment, limit, states[segment.schema.id])
            for segment, limit in zip(segments, limits, strict=True)
        ]
        wait(futures)
        failed = [error for f in futures if (error := f.exception()) is not None]
        plans = [f.result() for f in futures if f.exception() is None]
        if failed:
            for plan in plans:
                if plan is not None:
                    plan.discard(self._lake().storage)
            raise _first_or_all(failed)
        return plans

    def _plan_changes(
        self, lake: Lake, segment: TableChanges, inline_limit: int, state: TableState
    ) -> TablePlan | None:
        with naming_table(segment.schema.id):
            plan = plan_changes(lake, segment, inline_limit, state)
        if plan is not None:
            log.debug(
                "ducklake table planned",
                table=str(segment.schema.name),
                files=len(plan.files),
                inlined=plan.inline.num_rows if plan.inline is not None else 0,
                file_deletes=sum(len(positions) for _, positions in plan.deletes.values()),
                inlined_ended=len(plan.ended_inlined),
            )
        return plan

    def commit_plans(
        self,
        make: Callable[[], Iterable[TablePlan | None]],
        position: Lsn | None = None,
        consistent: bool = False,
        open_: OpenTransaction | None = None,
    ) -> list[TablePlan]:
        """Make the plans (Spark work, data files written) and commit them as one snapshot (standing at the stream's
        ``position``, if any, and marked ``consistent`` when it then holds a state the source had), with the parts
        of ``open_``, which they end; recompute on conflict, and after flushing a table's inlined rows before its
        schema changes. Return the committed plans.

        Data files of plans that do not get committed, a failure half-way through making them included, are
        removed (an open transaction's parts stay, for the write to be tried again).
        """
        attempt, flushed = 0, set()
        catalog, storage = self._lake().catalog, self._lake().storage
        while attempt < self._config.commit_attempts:
            base = catalog.latest_snapshot()
            plans: list[TablePlan] = []
            built: list[bool] = []  # set once the commit's catalog work is done: a failure after may have landed
            try:
                if open_ is not None:
                    held = read_states(catalog, open_.schemas)
                    if open_.marker is not None and open_.marker not in {s.prefix for s in catalog.staged()}:
                        raise AlreadyCommitted
                    open_.prune(held)
                plans.extend(plan for plan in make() if plan is not None)
                committing = plans if open_ is None else open_.merged(plans)
                if not committing:
                    if open_ is not None:
                        self._ended(open_)
                    return []
                catalog.commit(
                    partial(
                        apply_all,
                        committing,
                        storage,
                        position=position,
                        consistent=consistent,
                        open_marker=None if open_ is None else open_.marker,
                        built=built,
                    ),
                    base_snapshot=base,
                    tables=[p.handle.table.table_id for p in plans if p.handle is not None],
                )
            except AlreadyCommitted:  # an earlier attempt landed, and only its answer was lost
                assert open_ is not None
                for plan in plans:
                    plan.discard(storage)
                if not open_.landed(read_states(catalog, open_.schemas)):
                    raise DestinationError(
                        "the catalog's record of a transaction larger than a batch that the pipeline is writing is"
                        " gone, and the lake does not hold it: another process of this pipeline, or a hand, removed"
                        " it from etl_ducklake_staged",
                        hint="run one process per pipeline; a restart replays the transaction",
                        transient=False,
                    ) from None
                self._ended(open_)
                return []
            except FlushFirst as first:  # not an attempt: the plans are made again once the rows are flushed
                for plan in plans:
                    plan.discard(self._lake().storage)
                for table in first.tables:
                    if table.table_id in flushed:
                        raise DestinationError(
                            f"the inlined rows of DuckLake table {table.schema_name}.{table.name} are still there"
                            " after a flush",
                            hint="check the pipeline's log for why the flush failed",
                        ) from None
                    flushed.add(table.table_id)
                    self._flush_inlined(table)
            except CommitConflict as conflict:
                attempt += 1
                self._metrics.commit_conflicts.inc()
                log.info("ducklake commit conflict; recomputing", reason=str(conflict), attempt=attempt)
                for plan in plans:
                    plan.discard(self._lake().storage)
            except BaseException:
                if not built:  # else the commit may have landed: its files stay (the orphan sweep finds them if not)
                    for plan in plans:
                        plan.discard(storage)
                raise
            else:  # committed: its files are the lake's now, never discarded
                for plan in committing:
                    plan.remember_files(self._lake().storage)
                if open_ is not None:
                    self._ended(open_)
                return committing
        raise DestinationError(
            f"DuckLake commit kept conflicting with other writers ({self._config.commit_attempts} attempts)",
            hint="pause maintenance jobs on the lake while the pipeline runs, or raise commit_attempts",
        )

    def _ended(self, open_: OpenTransaction) -> None:
        """The open transaction committed: remove what its parts wrote that the snapshot does not hold."""
        self.open = None
        try:
            open_.tidy()
        except Exception:  # committed all the same; the next start removes what the records name
            log.warning("could not remove the files an open transaction's parts left", exc_info=True)
        self._metrics.open_transaction_rows.set(0)
        if not open_.parts:
            return
        self._metrics.large_transactions.labels("split" if open_.split else "whole").inc()
        if not open_.split:
            log.info("a transaction larger than a batch committed in one snapshot", parts=open_.parts, rows=open_.rows)


def apply_all(
    plans: list[TablePlan],
    storage: LakeStorage,
    txn: Transaction,
    *,
    position: Lsn | None = None,
    consistent: bool = False,
    open_marker: str | None = None,
    built: list[bool] | None = None,
) -> None:
    """Apply the plans in one transaction, each to its lake table as read at the start of it, standing at the
    stream's ``position`` (``consistent``: a state the source had), and ending the open transaction whose parts they
    hold (``open_marker``: its marker goes; ``AlreadyCommitted`` when it is gone), and telling ``built`` once the
    catalog work is done. So a table that an earlier plan parked (another
    source table of the batch took its name) is not renamed back by its own plan, which would park the other in
    turn: both held the name during the batch, and its next change names it."""
    if built is not None:
        built.clear()  # a commit that lost the race for its snapshot id builds again
    if open_marker is not None and not txn.end_open(open_marker):
        raise AlreadyCommitted
    txn.position, txn.consistent = position, consistent
    current = txn.tables([plan.handle.table.table_id for plan in plans if plan.handle is not None])
    for plan in plans:
        if plan.check_since is not None and plan.handle is not None:
            _check_parts(txn, plan.check_since, plan.handle.table)
    for plan in plans:
        with naming_table(plan.schema.id):
            plan.apply(txn, storage, None if plan.handle is None else current[plan.handle.table.table_id])
    if built is not None:
        built.append(True)


def _rounds(changes: dict[int, list[TableChanges]]) -> int:
    """The snapshots the changes need: one per schema version of the table with the most."""
    return max((len(segments) for segments in changes.values()), default=0)


class AlreadyCommitted(Exception):
    """The open transaction's marker is gone: a commit of it landed before (its answer lost on the way)."""


def _check_parts(txn: Transaction, since: int, table: LakeTable) -> None:
    """Stop when another writer changed a table since an open transaction's first part was planned on it: the
    parts' deletes may miss rows or hit the wrong ones, and only a replay of the whole transaction can tell."""
    try:
        txn.check_conflicts(since, {table.table_id})
    except CommitConflict as conflict:
        raise DestinationError(
            f"DuckLake table {table.schema_name}.{table.name} was changed by another writer while the pipeline"
            f" wrote a transaction larger than a batch into it ({conflict})",
            hint="pause maintenance jobs on the lake while the pipeline runs; a restart replays the transaction",
            transient=False,
        ) from None


def _first_or_all(failed: list[BaseException]) -> BaseException:
    """What a batch whose tables failed to plan raises: every table's own error at once when each failure is one
    table's (``TableErrors``: each table is errored, the rest of the batch goes on), the tables whose inlined rows
    must be flushed first when that is all, else the first other failure."""
    others = [error for error in failed if not isinstance(error, FlushFirst)]
    if not others:
        return FlushFirst(*(t for e in failed if isinstance(e, FlushFirst) for t in e.tables))
    tables = [error for error in others if isinstance(error, TableError) and error.table_id is not None]
    if len(tables) == len(others) > 1:
        return TableErrors(tables)
    return others[0]
