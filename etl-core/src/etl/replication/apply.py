"""The apply worker: streams the pipeline's permanent slot and drives every table's life cycle.

It applies the changes of Ready tables (and of SyncDone tables from their hand-over LSN on), keeps
the table sync pool busy with tables that need a copy, answers sync workers waiting for a catch-up
position, notices tables added to or removed from the publication, copies again the tables the
owner asked for (``Store.request_resync``) and the errored ones whose timed retry is due, and owns
durable progress.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Literal

import structlog

from etl.errors import TableError
from etl.events import EventBatch
from etl.lsn import Lsn
from etl.postgres import pgoutput as pg
from etl.postgres.catalog import PublishedTable, publication_tables
from etl.postgres.connection import connect
from etl.postgres.replication import ReplicationConnection
from etl.replication import retries
from etl.replication.chunked_copy import ChunkedCopies
from etl.replication.context import WorkerContext
from etl.replication.slots import table_sync_slot
from etl.replication.stream import StreamWorker
from etl.replication.tablesync import TableSyncWorker
from etl.replication.writer import BatchWriter
from etl.schema import TableId, TableName
from etl.store.base import APPLY_WORKER, TableState, TableStateKind

log = structlog.get_logger(__name__)

RESYNC_MESSAGE_PREFIX = "etl.resync"
"""The prefix earlier versions of ``etl resync`` sent requests with, in the WAL where any role could forge them."""
REFRESH_INTERVAL_S = 5.0
NEEDS_SYNC_WORKER = (TableStateKind.INIT, TableStateKind.DATA_SYNC, TableStateKind.FINISHED_COPY)
CopyAgainReason = Literal["requested", "retry", "partitions attached or detached"]


class ApplyWorker(StreamWorker):
    worker_key = APPLY_WORKER
    message_prefixes = (*StreamWorker.message_prefixes, RESYNC_MESSAGE_PREFIX)

    def __init__(
        self,
        ctx: WorkerContext,
        conn: ReplicationConnection,
        writer: BatchWriter,
        sync_workers: dict[TableId, TableSyncWorker],
    ) -> None:
        super().__init__(ctx.stream, conn, writer)
        self.ctx = ctx
        self.position = writer.durable_lsn
        self.tables: dict[TableId, PublishedTable] = {}
        self.sync_workers = sync_workers  # outlives this worker: it is kept across reconnects
        self._next_refresh = 0.0
        self._uncopied: set[TableId] = set()
        """Published tables ``[copy]`` takes on without a copy."""
        self.chunked = ChunkedCopies(ctx, self, writer.wait, writer.in_flight)
        """Tables copied in chunks (``[copy] method = "incremental"``)."""
        self.copies_done = False
        """``[copy] mode = "initial_only"``, and every published table is copied: the stream ends."""

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.chunked.close()

    def applies(self, table_id: TableId, final_lsn: Lsn) -> bool:
        return self.ctx.states.applies(table_id, final_lsn)

    def began(self, xid: int) -> None:
        self.chunked.began(xid)

    def prepared(self, batch: EventBatch) -> EventBatch:
        return self.chunked.prepared(batch)

    def marked(self, batch: EventBatch) -> EventBatch:
        # Once the earlier writes ended: a table one of them errored is no longer ready. No copy starts while this
        # batch is written (_start_sync_workers waits for it; chunks and copies again are written between batches).
        return replace(batch, all_tables_ready=True) if self._all_tables_ready() else batch

    def _all_tables_ready(self) -> bool:
        """Every published table copied and ready, and no table copied or backfilled in chunks or by a sync worker.
        A pipeline with tables ``[copy]`` leaves uncopied never is: their rows from before it started are missing."""
        if self.chunked.copies or self.sync_workers or not self.tables or self._uncopied:
            return False
        states = self.ctx.states
        return all((s := states.get(t)) is not None and s.kind is TableStateKind.READY for t in self.tables)

    def awaiting_position(self) -> bool:
        return self.ctx.states.waiting_on_apply or self.chunked.awaiting_position()

    def position_wanted_soon(self) -> bool:
        return bool(self.sync_workers) or self.chunked.in_flight() or self.awaiting_position()

    def nothing_pending(self) -> bool:
        return super().nothing_pending() and not self.chunked.holding()

    def table_failed(self, table_id: TableId, error: TableError) -> None:
        table = self.tables.get(table_id)
        state = self.ctx.table_failed(table_id, table.name if table else str(table_id), error)
        log.error(
            "table failed; its changes are no longer applied",
            table=str(table.name) if table else table_id,
            error=error.message,
            retry=state.retry.value,
            retry_at=state.retry_at.isoformat() if state.retry_at else None,
        )

    def schema_change_recorded(self, lsn: Lsn) -> bool:
        return self.ctx.schema_change_recorded(lsn)

    # -- life cycle ------------------------------------------------------------------------------------
    def after_commit(self, end_lsn: Lsn) -> None:
        self.position = max(self.position, end_lsn)
        if self.ctx.states.waiting_on_apply:
            self._advance_synced(self.ctx.states.snapshot())

    def tick(self) -> None:
        if time.monotonic() >= self._next_refresh:
            self.refresh()
        elif self._a_sync_worker_succeeded():
            # A table's copy ended: the next table's starts now, not at the next refresh (tables of a thousand rows
            # each waited up to REFRESH_INTERVAL_S for a free worker). One that failed is started again by the
            # refresh, which paces its retries.
            self._reap_sync_workers()
            self._start_sync_workers()
        self.chunked.copy_chunks()
        if self.ctx.config.copy_.mode == "initial_only" and not self.copies_done and self.nothing_pending():
            # Nothing pending: no write is left that could still error a table after the copies count as done.
            states = self.ctx.states.snapshot()
            if self.tables and all(
                (s := states.get(t)) is not None and s.kind is TableStateKind.READY for t in self.tables
            ):
                log.info("every table is copied; the pipeline stops ([copy] mode = initial_only)")
                self.copies_done = True

    def work_due(self) -> bool:
        return self.chunked.due()

    def finished(self) -> bool:
        return self.copies_done or super().finished()

    def _advance_synced(self, states: dict[TableId, TableState]) -> None:
        ready = {
            t: TableState(TableStateKind.READY)
            for t, s in states.items()
            if s.kind is TableStateKind.SYNC_DONE and s.lsn is not None and s.lsn <= self.position
        }
        if ready:
            self.ctx.states.set_many(ready)
            log.info("tables ready", tables=[self.tables[t].name.__str__() for t in ready if t in self.tables])
        waiting = [t for t, s in states.items() if s.kind is TableStateKind.SYNC_WAIT]
        if waiting:
            self._hand_over(waiting)

    def _hand_over(self, tables: list[TableId]) -> None:
        """Pause at ``position`` until the waiting sync workers caught up to it."""
        self.ctx.states.set_many({t: TableState(TableStateKind.CATCHUP, lsn=self.position) for t in tables})

        def caught_up() -> bool:
            return self.stop.is_set() or all(
                (s := self.ctx.states.get(t)) is None or s.kind is not TableStateKind.CATCHUP for t in tables
            )

        while not self.ctx.states.wait(caught_up, timeout=1.0):
            # Every second, not every STATUS_INTERVAL_S: the paused stream reads nothing, so a write is what finds a
            # connection the server ended (the second write after it fails), in seconds rather than half a minute.
            self.send_status(force=True)
            self._reap_sync_workers()
            for table_id in tables:  # a worker that died mid catch-up starts over from FinishedCopy
                state = self.ctx.states.get(table_id)
                if state is not None and state.kind is TableStateKind.CATCHUP and table_id not in self.sync_workers:
                    self.ctx.states.set(table_id, TableState(TableStateKind.FINISHED_COPY))

    # -- publication and the sync pool ------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the publication; start, stop and reap table sync workers."""
        self._next_refresh = time.monotonic() + REFRESH_INTERVAL_S
        with connect(self.ctx.config.source) as conn:
            published = {t.id: t for t in publication_tables(conn, self.ctx.publication)}
        states = self.ctx.states
        known = states.snapshot()
        added = {t: TableState.init() for t in published if t not in known}
        if added:
            log.info("tables added to the publication", tables=[str(published[t].name) for t in added])
            states.set_many(added)
        for table_id in [t for t in known if t not in published]:
            self._remove_table(table_id)
            if table_id in self.tables:
                self.ctx.metrics.forget_tables([str(self.tables[table_id].name)])
        self.tables = published
        self._uncopied = {t for t, table in published.items() if not self.ctx.config.copy_.copies(table.name)}
        self._reap_sync_workers()
        requests = self.ctx.store.take_resync_requests()
        self._copy_again([t for t, where in requests.items() if where is None], why="requested")
        for table_id, where in requests.items():
            if where is not None:
                self._backfill(table_id, where)
        self._copy_again(retries.due(states.snapshot(), datetime.now(UTC)), why="retry")
        self._copy_again(self._repartitioned(), why="partitions attached or detached")
        for table_id, state in states.snapshot().items():
            if state.kind is TableStateKind.COPYING and table_id not in self.chunked.copies and table_id in self.tables:
                self.chunked.resume(table_id)
        self._start_sync_workers()

    def _repartitioned(self) -> list[TableId]:
        """Copied tables published through their partition root whose partitions changed so that rows came in or
        went out of the root without a change in the stream.

        ATTACH PARTITION of a table that holds rows brings them in; DETACH PARTITION, or dropping a partition,
        takes its rows out; a partition detached and attached again (told by its new ``pg_inherits`` row) may have
        had rows changed in between: only a copy makes the destination hold them (or not) again. A new partition
        that is empty (``CREATE TABLE ... PARTITION OF``, or an empty table attached) needs none: its rows come
        through the stream, and the partitions are recorded as they are.
        """
        changed = []
        for table_id, table in self.tables.items():
            state = self.ctx.states.get(table_id)
            if not table.partitioned or table_id in self.sync_workers or state is None or not state.kind.copied:
                continue
            copied = self.ctx.schemas.current(table_id)
            if (copied.partitions, copied.attachments) == (table.partitions, table.attachments):
                continue
            if copied.partitions is None:  # copied by a release that did not record them: take today's as the copy's
                self.ctx.schemas.record_partitions(table_id, table.partitions, table.attachments)
                continue
            added = [n for n, i in zip(table.leaves, table.leaf_ids, strict=True) if i not in copied.partitions]
            removed = len(set(copied.partitions) - set(table.partitions))
            filled = self._holding_rows(added)
            before = dict(copied.attachments or ())  # not recorded by earlier releases: none told apart
            reattached = [oid for oid, xid in table.attachments if before.get(oid, xid) != xid]
            if not removed and not filled and not reattached:
                if added:
                    log.info("empty partitions added; their rows are streamed", table=str(table.name), added=added)
                self.ctx.schemas.record_partitions(table_id, table.partitions, table.attachments)
                continue
            log.warning(
                "partitions with rows attached to, or partitions detached from, a table published through its root",
                table=str(table.name),
                attached=[str(n) for n in filled],
                detached=removed,
                attached_again=len(reattached),
            )
            changed.append(table_id)
        return changed

    def _backfill(self, table_id: TableId, where: str) -> None:
        """Backfill a copied table (``etl resync --where``); one that is not copied yet gets every row from its
        copy."""
        table, state = self.tables.get(table_id), self.ctx.states.get(table_id)
        if table is None:
            log.warning("backfill asked for a table outside the publication; ignored", table_id=table_id)
        elif state is None or state.kind is not TableStateKind.READY or table_id in self.chunked.copies:
            errored = state is not None and state.kind is TableStateKind.ERRORED
            what = "errored" if errored else "being copied or backfilled"
            # Recorded before the log: who reads the line finds it in etl status.
            self.chunked.ignored(table_id, f"a backfill of the rows where {where} was ignored: the table was {what}")
            log.warning(
                "backfill asked for a table being copied, backfilled or errored; ignored",
                table=str(table.name),
                where=where,
                state=None if state is None else state.kind.value,
                hint=f"ask again once it is ready: etl resync --table {table.name} --where '...'",
            )
        else:
            self.chunked.backfill(table_id, where)

    def _holding_rows(self, tables: list[TableName]) -> list[TableName]:
        if not tables:
            return []
        with connect(self.ctx.config.source) as conn:
            return [
                t
                for t in tables
                if conn.execute(f"SELECT EXISTS (SELECT FROM ONLY {t.quoted()})").fetchone() == (True,)
            ]

    def _remove_table(self, table_id: TableId) -> None:
        log.info("table left the publication; forgetting it", table_id=table_id)
        self.chunked.forget(table_id)
        worker = self.sync_workers.pop(table_id, None)
        if worker is not None:  # stopped first, so that (unless it hangs past the wait) it writes no state after
            worker.cancel()
            worker.thread.join(timeout=30)
        self.ctx.states.forget(table_id)
        self.ctx.schemas.forget(table_id)
        with ReplicationConnection.connect(self.ctx.config.source) as rconn:
            rconn.drop_slot_if_exists(table_sync_slot(self.ctx.pipeline_id, table_id))

    def _a_sync_worker_succeeded(self) -> bool:
        """A sync worker's thread ended with its table caught up (or ready)."""
        for table_id, worker in self.sync_workers.items():
            if not worker.thread.is_alive():
                state = self.ctx.states.get(table_id)
                if state is not None and state.kind in (TableStateKind.SYNC_DONE, TableStateKind.READY):
                    return True
        return False

    def _reap_sync_workers(self) -> None:
        for table_id, worker in list(self.sync_workers.items()):
            if not worker.thread.is_alive():
                del self.sync_workers[table_id]

    def _start_sync_workers(self) -> None:
        free = self.ctx.config.pipeline.table_sync_workers - len(self.sync_workers)
        for table_id, state in sorted(self.ctx.states.snapshot().items()):
            if free <= 0:
                break
            if state.kind in NEEDS_SYNC_WORKER and table_id not in self.sync_workers and table_id in self.tables:
                copies = self._copies(table_id, state)
                incremental = self.ctx.config.copy_.method == "incremental" and state.kind is TableStateKind.INIT
                if copies and incremental and self.chunked.take_on(table_id):
                    continue
                if not self.sync_workers:  # the write in flight may be marked all_tables_ready: it ends first
                    self.wait_for_writer()
                worker = TableSyncWorker(self.ctx, self.tables[table_id], copies)
                self.sync_workers[table_id] = worker
                worker.thread.start()
                free -= 1

    def _copies(self, table_id: TableId, state: TableState) -> bool:
        """Whether the table is copied. ``[copy]`` decides for a table the pipeline takes on for the first time; one
        taken on before (a resync, a timed retry, a copy cut short) is copied whatever it says: only a copy makes
        its destination table whole again."""
        if self.ctx.config.copy_.copies(self.tables[table_id].name):
            return True
        return state.kind is not TableStateKind.INIT or self.ctx.store.get_table_schema(table_id) is not None

    # -- copies again ------------------------------------------------------------------------------------
    def _copy_again(self, table_ids: Iterable[TableId], *, why: CopyAgainReason) -> None:
        """Set tables back to Init, so the pool copies them again: asked for by the owner (``requested``), a
        timed retry (``retry``), or because their partitions changed.

        Runs between transactions; what is buffered of those tables is written first, since the copy
        replaces their destination objects.
        """
        wanted = []
        for table_id in sorted(table_ids):
            table = self.tables.get(table_id)
            if table is None:
                log.warning("resync asked for a table outside the publication; ignored", table_id=table_id)
            elif table_id in self.sync_workers:
                log.info("resync asked for a table being copied; its copy goes on", table=str(table.name))
            else:
                wanted.append(table_id)
                if why != "retry":
                    self.ctx.retries.forget(table_id)
                log.info("copying a table again", table=str(table.name), why=why)
        if not wanted:
            return
        self.flush()
        self.writer.wait()
        for table_id in wanted:
            self.chunked.forget(table_id)
            self.ctx.schemas.forget(table_id)
        self.ctx.states.set_many({t: TableState.init() for t in wanted})

    # -- control messages ----------------------------------------------------------------------------------
    def on_message(self, message: pg.LogicalMessage) -> None:
        super().on_message(message)
        if message.prefix == RESYNC_MESSAGE_PREFIX:
            log.warning(
                "a resync message in the WAL was ignored: requests come through the store (etl resync)",
                lsn=str(message.lsn),
                hint="any role can write such messages; see docs/architecture.md, Failure modes",
            )
