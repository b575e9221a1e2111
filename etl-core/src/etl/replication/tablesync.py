"""The table sync worker: copies one table, catches up on its own slot, hands over to the apply worker.

Init/DataSync -> (drop the destination object, new slot with an exported snapshot, parallel copy)
-> FinishedCopy -> SyncWait -> (the apply worker pauses and answers Catchup at its position) ->
(stream the table's own slot up to that position) -> SyncDone -> the apply worker makes it Ready.
A crash before FinishedCopy restarts the copy from scratch; after it, catch-up resumes.

A table that ``[copy]`` leaves out goes from Init through a hand-over (SyncWait, Catchup) to SyncDone at the apply
worker's position, with an empty destination table and no slot of its own.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pyarrow as pa
import structlog
from psycopg import Connection

from etl.destination.base import TableCopier
from etl.errors import EtlError, RuntimeSetupError, TableError, TransientError
from etl.lsn import Lsn
from etl.postgres.catalog import (
    PublishedTable,
    estimated_rows,
    publication_options,
    table_schema,
    with_current_leaves,
)
from etl.postgres.codecs import arrow_field
from etl.postgres.connection import connect
from etl.postgres.copy import copy_parts, copy_table, plan_copy
from etl.postgres.copy_session import import_snapshot
from etl.postgres.replication import ReplicationConnection
from etl.postgres.slot_state import SlotLostError, SlotNotFoundError, SlotState, slot_state
from etl.postgres.standby_slots import SETTING as STANDBY_SLOTS
from etl.postgres.standby_slots import parse_setting, wait_for_standbys
from etl.replication.context import WorkerContext
from etl.replication.copy_watch import CopyWatch, copy_application_name
from etl.replication.progress import CopyTracker
from etl.replication.slots import table_sync_slot
from etl.replication.stream import StreamWorker
from etl.replication.writer import BatchWriter
from etl.schema import TableId, TableSchema
from etl.store.base import TableState, TableStateKind, table_sync_worker

log = structlog.get_logger(__name__)


def empty_table(schema: TableSchema) -> pa.Table:
    return pa.schema([arrow_field(c) for c in schema.columns]).empty_table()


class TableSyncWorker:
    def __init__(self, ctx: WorkerContext, table: PublishedTable, copies: bool = True) -> None:
        self.ctx = replace(ctx, stop=threading.Event())
        """The pipeline's context, with a stop of this worker's own (``cancel``)."""
        self.table = table
        self.copies = copies
        """False: the table is taken on without a copy (``stream_without_copy``)."""
        self.slot = table_sync_slot(ctx.pipeline_id, table.id)
        self.thread = threading.Thread(target=self.run, name=f"tablesync-{table.name}", daemon=True)
        self.log = log.bind(table=str(table.name))

    @property
    def table_id(self) -> TableId:
        return self.table.id

    def cancel(self) -> None:
        """Stop this worker: its copy or catch-up ends at the next check, writing no further state once
        ``thread.join()`` returned. The pipeline cancels every worker when it stops, and when it recreates a lost
        apply slot (the states it resets must not be overwritten by a worker still running)."""
        self.ctx.stop.set()

    def run(self) -> None:
        states = self.ctx.states
        try:
            state = states.get(self.table_id)
            if not self.copies and (state is None or state.kind is TableStateKind.INIT):
                self.stream_without_copy()
                return
            if state is None or state.kind in (TableStateKind.INIT, TableStateKind.DATA_SYNC):
                self.copy()
            if not self.ctx.stop.is_set():
                self.catch_up()
        except TransientError as exc:
            # Back to the start of the current step on the next attempt; the pool restarts the worker.
            self.log.warning("table sync interrupted; will retry", error=str(exc))
        except SlotLostError as exc:
            self._slot_lost(exc)
        except RuntimeSetupError as exc:  # every table would fail alike: stop, with the one error
            self.ctx.fail(exc)
        except Exception as exc:
            if isinstance(exc, EtlError):
                self.log.error("table sync failed", error=exc.message, hint=exc.hint)
            else:
                self.log.exception("table sync failed")
            # Drop first: an errored table must not hold WAL on the source, and once `etl status` shows it
            # errored, it holds none.
            self._drop_slot()
            state = self.ctx.table_failed(self.table_id, self.table.name, exc)
            self.log.info("table errored", retry=state.retry.value, retry_at=state.retry_at)

    def _slot_recovery(self) -> str:
        return f'{self.ctx.resync_command(self.table.name)}; or set [pipeline] invalidated_slot = "recreate"'

    def _drop_slot(self) -> None:
        try:
            with ReplicationConnection.connect(self.ctx.config.source) as rconn:
                rconn.drop_slot_if_exists(self.slot)
        except EtlError as exc:
            self.log.warning(
                "could not drop the table's slot; it holds WAL until dropped", slot=self.slot, error=str(exc)
            )

    def _slot_lost(self, error: SlotLostError) -> None:
        """The table's slot vanished or was invalidated mid catch-up: changes of the table may be gone."""
        if self.ctx.config.pipeline.invalidated_slot == "stop":
            self.ctx.fail(error)
            return
        self.log.warning("table sync slot lost; copying the table again", slot=self.slot, error=error.message)
        self._drop_slot()
        self.ctx.schemas.forget(self.table_id)
        self.ctx.states.set(self.table_id, TableState.init())

    # -- copy ----------------------------------------------------------------------------------------
    def copy(self) -> None:
        ctx, table_id = self.ctx, self.table_id
        previous = ctx.store.get_table_schema(table_id)
        if previous is not None:
            ctx.destination.drop_table_for_copy(previous)
        ctx.store.prepare_table_for_copy(table_id)
        ctx.schemas.forget(table_id)
        ctx.states.set(table_id, TableState(TableStateKind.DATA_SYNC))
        source = ctx.config.source
        with ReplicationConnection.connect(source) as rconn:
            rconn.drop_slot_if_exists(self.slot)
            # A failover slot too: a failover during the catch-up then goes on from the promoted standby.
            failover = rconn.failover_slots(ctx.config.pipeline.failover_slots)
            slot = rconn.create_slot(self.slot, snapshot="export", failover=failover)
            assert slot.snapshot_name is not None
            # The exported snapshot lives until rconn runs its next command: keep it idle until done.
            with connect(source) as conn, conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                conn.execute(import_snapshot(slot.snapshot_name))
                schema = self._read_schema(conn, slot.consistent_point)
                estimate = estimated_rows(conn, self.table.sources)
                standby_slots = _standby_slots(conn)
            # A failover must not take back rows the destination holds: the standbys get the snapshot's commits first.
            if wait_for_standbys(
                source, standby_slots, slot.consistent_point, what=str(self.table.name), stop=ctx.stop
            ):
                return  # stopping
            ctx.store.store_table_schema(schema)
            tracker = CopyTracker(str(self.table.name), estimate, ctx.metrics, ctx.copy_progress(table_id))
            if isinstance(ctx.destination, TableCopier):
                named = copy_application_name(source, ctx.pipeline_id, table_id)
                copying = source.model_copy(update={"application_name": named})
                parts = copy_parts(ctx.config.copy_.connections)
                plan = plan_copy(copying, schema, self.table, slot.snapshot_name, parts, stop=ctx.stop)
                with CopyWatch(source, named, tracker.advance):
                    rows = ctx.destination.copy_table(plan, ctx.stop)
                tracker.settle(rows)
            elif not self._copy_rows(schema, slot.snapshot_name, tracker):
                return
        ctx.states.set(table_id, TableState(TableStateKind.FINISHED_COPY))
        done = tracker.finish()
        self.log.info(
            "table copied", rows=done.rows, rows_per_s=round(done.rate), consistent_point=str(slot.consistent_point)
        )

    def _read_schema(self, conn: Connection[Any], position: Lsn) -> TableSchema:
        """The table's schema in ``conn``'s transaction, valid from ``position``; its leaves too, as of then (one
        attached or detached since the publication was read counts)."""
        self.table = with_current_leaves(conn, self.table)
        # Stored generated columns are in the stream where the publication publishes them (Postgres 18+).
        generated = publication_options(conn, self.ctx.config.pipeline.publication).generated_columns
        schema = table_schema(conn, self.table_id, self.table.column_list, include_generated=generated)
        schema = schema.with_snapshot(position)
        if not self.table.partitioned:
            return schema
        return replace(schema, partitions=self.table.partitions, attachments=self.table.attachments)

    def stream_without_copy(self) -> None:
        """Take the table on without copying it (``[copy]`` leaves it out): its destination table is created empty,
        and the apply worker applies its changes from where it stands once the table is taken on.

        That position is the apply worker's, taken in a hand-over: the apply worker pauses between transactions
        until the table is SyncDone there, so no transaction of the table is applied in part, and none that commits
        after it is decoded while the table is not yet applied (and dropped). The schema is read meanwhile, and
        stored just before the state: a crash between the two leaves a stored schema, so the next run copies the
        table (a table with a stored schema was taken on before, and only a copy is sure to be whole).
        """
        ctx = self.ctx
        position = self._await_position()
        if position is None:
            return
        with connect(ctx.config.source) as conn, conn.transaction():
            schema = self._read_schema(conn, position)
        ctx.destination.write_table_rows(schema, empty_table(schema))
        ctx.destination.flush()
        ctx.store.store_table_schema(schema)
        ctx.states.set(self.table_id, TableState(TableStateKind.SYNC_DONE, lsn=position))
        self.log.info("table streamed without a copy", streamed_from=str(position))

    def _copy_rows(self, schema: TableSchema, snapshot: str, tracker: CopyTracker) -> bool:
        """Copy the table through the engine into ``write_table_rows``; False when stopped half-way."""
        ctx = self.ctx
        wrote = False
        for batch in copy_table(
            ctx.config.source, schema, self.table, snapshot, ctx.config.copy_.connections, stop=ctx.stop
        ):
            if ctx.stop.is_set():
                return False
            ctx.destination.write_table_rows(schema, pa.Table.from_batches([batch]))
            tracker.advance(batch.num_rows)
            wrote = True
        if not wrote:
            ctx.destination.write_table_rows(schema, empty_table(schema))
        ctx.destination.flush()
        return True

    # -- catch-up ------------------------------------------------------------------------------------
    def _await_position(self) -> Lsn | None:
        """SyncWait: ask the apply worker to pause between transactions; its position once it did (Catchup), or
        ``None`` when stopped first. It stays paused until this worker moves the table on from Catchup."""
        ctx, table_id = self.ctx, self.table_id
        ctx.states.set(table_id, TableState(TableStateKind.SYNC_WAIT))

        def answered() -> bool:
            state = ctx.states.get(table_id)
            return ctx.stop.is_set() or state is None or state.kind is not TableStateKind.SYNC_WAIT

        while not ctx.states.wait(answered, timeout=1.0):
            pass
        state = ctx.states.get(table_id)
        if ctx.stop.is_set() or state is None or state.kind is not TableStateKind.CATCHUP or state.lsn is None:
            return None
        return state.lsn

    def catch_up(self) -> None:
        ctx, table_id = self.ctx, self.table_id
        target = self._await_position()
        if target is None:
            return
        with connect(ctx.config.source) as conn:
            slot = slot_state(conn, self.slot)
        if not slot.exists or slot.invalidated:
            raise SlotLostError.of(
                self.slot, slot, f"the copy of {self.table.name} cannot catch up", self._slot_recovery()
            )
        done = slot.confirmed_flush_lsn if slot.confirmed_flush_lsn >= target else self._stream_until(target)
        if done is None:
            return  # stopped
        ctx.states.set(table_id, TableState(TableStateKind.SYNC_DONE, lsn=done))
        with ReplicationConnection.connect(ctx.config.source) as rconn:
            rconn.drop_slot_if_exists(self.slot)
        ctx.store.delete_progress(table_sync_worker(table_id))
        self.log.info("table caught up", sync_done=str(done))

    def _stream_until(self, target: Lsn) -> Lsn | None:
        ctx = self.ctx
        key = table_sync_worker(self.table_id)
        start = ctx.store.get_progress(key) or Lsn.ZERO
        with ReplicationConnection.connect(ctx.config.source) as rconn:
            try:
                rconn.start_replication(self.slot, start, [ctx.publication], ctx.protocol_version, ctx.streaming)
            except SlotNotFoundError:
                raise SlotLostError.of(
                    self.slot,
                    SlotState(exists=False),
                    f"the copy of {self.table.name} cannot catch up",
                    self._slot_recovery(),
                ) from None
            writer = BatchWriter(
                ctx.destination, ctx.store, key, self._table_error, start, metrics=ctx.metrics, activity=ctx.activity
            )
            stream = CatchUpStream(self, rconn, writer, target)
            try:
                stream.run()
            finally:
                writer.close()
            return stream.done

    def _table_error(self, table_id: TableId, error: TableError) -> None:
        raise error


class CatchUpStream(StreamWorker):
    """Streams the table's own slot until a transaction boundary at or past the apply worker's position."""

    def __init__(self, worker: TableSyncWorker, conn: ReplicationConnection, writer: BatchWriter, target: Lsn) -> None:
        super().__init__(worker.ctx.stream, conn, writer)
        self.ctx = worker.ctx
        self.worker_key = table_sync_worker(worker.table_id)
        self.table_id = worker.table_id
        self.target = target
        self.done: Lsn | None = None

    def applies(self, table_id: TableId, final_lsn: Lsn) -> bool:
        return table_id == self.table_id

    def after_commit(self, end_lsn: Lsn) -> None:
        if end_lsn >= self.target and self.done is None:
            self.done = end_lsn

    def finished(self) -> bool:
        return self.done is not None or self.stop.is_set()

    def awaiting_position(self) -> bool:
        return True

    def schema_change_recorded(self, lsn: Lsn) -> bool:
        return self.ctx.schema_change_recorded(lsn)


def _standby_slots(conn: Connection[Any]) -> tuple[str, ...]:
    """The standby slots a copy's rows wait for (``etl.postgres.standby_slots``)."""
    row = conn.execute(f"SELECT {STANDBY_SLOTS}").fetchone()
    assert row is not None
    return parse_setting(row[0])
