"""The read loop shared by the apply worker and the table sync workers' catch-up.

It reads one slot, decodes pgoutput, keeps the changes of the tables the worker applies, batches
them by size and time, hands batches to a ``BatchWriter`` (one write in flight) and keeps the
server informed with standby status updates, also while reading is paused for backpressure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import structlog

from etl.config import BatchSection
from etl.errors import SourceError, TableError
from etl.events import EventBatch
from etl.lsn import Lsn
from etl.postgres import ddl
from etl.postgres import pgoutput as pg
from etl.postgres.frames import Keepalive, XLogData
from etl.postgres.replication import ReplicationConnection
from etl.replication.changes import ChangeBuilder
from etl.replication.schemas import SchemaTracker
from etl.replication.spill_dir import SpillDirectory, remove_abandoned, spill_base
from etl.replication.streamed import StreamedTransactions
from etl.replication.writer import BatchWriter
from etl.schema import TableId

log = structlog.get_logger(__name__)

STATUS_INTERVAL_S = 10.0
TICK_INTERVAL_S = 1.0
BURST_MESSAGES = 1000
"""Messages handled in one turn of the read loop at most (the bookkeeping runs once a turn)."""
BUSY_POLL_S = 0.05
"""How often a due batch looks whether the write in flight has ended."""
POSITION_POLL_S = 0.1
"""How long an idle read lasts while a worker waits, or may soon wait, for a position (a table's hand-over): it then
asks the server where the stream is. A table copy's hand-over waits for such an answer: at 1 s, 200 small tables
copied four at a time were ready in 61 s, at 0.1 s in 30 s (into null, a loaded machine)."""
REPLAY_RUN = 512
"""Inserts of a replayed streamed transaction added to a batch at once, at most (the size check runs once a run)."""


@dataclass(frozen=True)
class StreamSettings:
    """What every stream worker of a pipeline shares (``WorkerContext.stream`` gives it)."""

    protocol_version: int
    batch: BatchSection
    schemas: SchemaTracker
    stop: threading.Event


class StreamWorker:
    """Consumes one replication stream. Subclasses decide which tables apply and when to stop."""

    worker_key: str
    message_prefixes: tuple[str, ...] = (ddl.MESSAGE_PREFIX,)
    """The prefixes of the logical messages that ``on_message`` gets; the stream drops others unread."""

    def __init__(self, settings: StreamSettings, conn: ReplicationConnection, writer: BatchWriter) -> None:
        self.conn = conn
        self.batch_config = batch = settings.batch
        self.schemas = settings.schemas
        self.writer = writer
        self.stop = settings.stop
        self.decoder = pg.PgOutputDecoder(settings.protocol_version)
        self.builder = ChangeBuilder(settings.schemas.current)
        spill = spill_base(batch.spill_directory)
        remove_abandoned(spill)
        self.streamed = StreamedTransactions(SpillDirectory(spill), batch.spill_threshold_bytes)
        self.received_lsn = Lsn.ZERO
        self.final_lsn = Lsn.ZERO  # final LSN of the transaction being decoded
        self.in_transaction = False
        self._stream_xid: int | None = None
        self._batch_started: float | None = None
        self._last_status = 0.0
        self._last_tick = 0.0
        self.idle_lsn = Lsn.ZERO  # a keepalive position reached with nothing pending
        self.last_turn = time.monotonic()
        """When the read loop last began a turn (health checks: a loop that stopped turning is stuck)."""
        self._handlers: dict[type[pg.Message], Callable[[Any], None]] = {
            pg.Begin: self._on_begin,
            pg.Commit: self._on_commit,
            pg.Insert: self._on_insert,
            pg.Update: self._on_update,
            pg.Delete: self._on_delete,
            pg.Relation: self._on_relation,
            pg.Truncate: self._on_truncate,
            pg.LogicalMessage: self.on_message,
            pg.StreamStart: self._on_stream_start,
            pg.StreamStop: self._on_stream_stop,
            pg.StreamCommit: self._on_stream_commit,
            pg.StreamAbort: self._on_stream_abort,
        }

    # -- hooks ---------------------------------------------------------------------------------------
    def applies(self, table_id: TableId, final_lsn: Lsn) -> bool:
        raise NotImplementedError

    def began(self, xid: int) -> None:
        """Called as each transaction's changes begin to arrive (``xid``: its id), before any of them."""

    def after_commit(self, end_lsn: Lsn) -> None:
        """Called after each transaction's commit, and when idle at a keepalive position."""

    def on_message(self, message: pg.LogicalMessage) -> None:
        """A logical decoding message (``pg_logical_emit_message``) inside the stream, of one of ``message_prefixes``.

        Handles the DDL trigger's schema change messages; subclasses that handle more call this first.
        """
        if message.prefix == ddl.MESSAGE_PREFIX and message.transactional:
            self._schema_change(message)

    def _schema_change(self, message: pg.LogicalMessage) -> None:
        """A new schema version from the DDL trigger: a Relation event before the table's next row.

        The record is looked up before the content is read: what any role may emit is never parsed. A recorded
        message that cannot be read (a trigger of another version) changes nothing either: the change is then
        seen from the RELATION message before the table's next row, as without the trigger.
        """
        if not self.schema_change_recorded(message.lsn):
            log.warning(
                "schema change message ignored: the DDL trigger did not record it, so another role forged it",
                lsn=str(message.lsn),
                hint="revoke EXECUTE on pg_logical_emit_message from roles that need not call it"
                " (docs/schema-changes.md); if the trigger predates this version, reinstall it",
            )
            return
        try:
            change = ddl.parse_schema_change(message.content)
        except SourceError as exc:
            log.warning(
                "schema change message of the DDL trigger unreadable; the change is taken from RELATION messages",
                lsn=str(message.lsn),
                error=exc.message,
                hint=exc.hint,
            )
            return
        if not self.applies(change.table_id, self.final_lsn):
            return
        schema = self.schemas.observe_ddl(change, self.final_lsn)
        if schema is not None:
            self._mark_batch()  # a transaction may change the schema and no row: flush it in time all the same
            self.builder.relation(schema, message.lsn)

    def schema_change_recorded(self, lsn: Lsn) -> bool:
        """Whether the DDL trigger recorded the schema change message at ``lsn`` (``ddl.schema_change_recorded``).

        Any role can emit a message with the trigger's prefix; only recorded ones are acted on.
        Without a way to ask the source, nothing is trusted.
        """
        return False

    def finished(self) -> bool:
        return self.stop.is_set()

    def tick(self) -> None:
        """Called between transactions on every turn of the read loop (at least once a second)."""

    def work_due(self) -> bool:
        """Whether ``tick`` has work to do now: the read loop then waits for no message."""
        return False

    def awaiting_position(self) -> bool:
        """True when the worker waits for the stream to reach a position even if no change arrives."""
        return False

    def position_wanted_soon(self) -> bool:
        """True while the worker may come to wait for a position any moment (a table copy under way): its idle reads
        are short, so that the wait, once it begins, is not behind a read of a second."""
        return self.awaiting_position()

    # -- loop ----------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.finished():
                self._read_once()
            self.flush()
            self.writer.wait()
            self.send_status(force=True)
        finally:
            self.streamed.close()

    def _read_once(self) -> None:
        """One turn: wait for a message, handle it and every message already received after it (a burst),
        then do the bookkeeping (tick, batch flush, status) once for the whole burst."""
        self.last_turn = time.monotonic()
        item = self.conn.read(self._read_timeout())
        if item is None:
            if self.nothing_pending() and self.awaiting_position():
                self.send_status(force=True, reply=True)  # ask the server where the stream is
        else:
            self._burst(item)
        if not self.in_transaction:
            self._last_tick = time.monotonic()
            self.tick()
        self.writer.check()
        self._maybe_flush()
        self.send_status()

    def _burst(self, item: XLogData | Keepalive) -> None:
        # Ends when nothing more was received, after BURST_MESSAGES, when the batch is full, or between
        # transactions when the worker is finished or its tick is overdue.
        tick_due = time.monotonic() - self._last_tick >= TICK_INTERVAL_S
        max_bytes, busy_limit = self.batch_config.max_bytes, self.batch_config.busy_limit
        builder = self.builder
        poll = self.conn.poll
        budget = BURST_MESSAGES
        wal_end = Lsn.ZERO  # of the burst's last XLogData: the server's WAL end only grows
        while True:
            if isinstance(item, XLogData):
                wal_end = item.wal_end
                self._handle_payload(item.payload)
            else:
                self._keepalive(item)
            budget -= 1
            if not budget:
                break
            size = builder.size_bytes
            if size >= max_bytes and (size >= busy_limit or not self._busy()):
                break
            if not self.in_transaction and (tick_due or self.finished()):
                break
            next_item = poll()
            if next_item is None:
                break
            item = next_item
        self.received_lsn = max(self.received_lsn, wal_end)

    def _keepalive(self, item: Keepalive) -> None:
        self.received_lsn = max(self.received_lsn, item.wal_end)
        if self.nothing_pending():
            self.idle_lsn = max(self.idle_lsn, item.wal_end)
            self.after_commit(item.wal_end)
        self.send_status(force=item.reply_requested)

    def _read_timeout(self) -> float:
        if not self.in_transaction and self.work_due():  # tick runs between transactions only
            return 0.0
        if self._batch_started is None:
            # A worker waiting for a position asks the server where the stream is after each read that timed out.
            return POSITION_POLL_S if self.position_wanted_soon() else 1.0
        filling = self.batch_config.max_fill_ms / 1000 - (time.monotonic() - self._batch_started)
        interval = self.writer.next_write_in()
        remaining = max(filling, interval)
        full = self.builder.size_bytes >= self.batch_config.max_bytes
        if self.writer.busy and (remaining <= 0 or (full and interval <= 0)):
            return BUSY_POLL_S  # a due or full batch keeps reading while it waits for the writer
        if remaining <= 0 and not full and self.builder.splits_a_transaction:
            return 1.0  # due at the commit: nothing to do before more of the transaction arrives, which wakes the read
        return max(0.0, min(1.0, remaining))

    def stalled_for(self) -> float:
        """How long the worker has made no progress: since its read loop last turned, or since the write in
        flight began (a batch that keeps filling while a write hangs turns the loop, yet gets nowhere)."""
        now = time.monotonic()
        started = self.writer.write_started
        return max(now - self.last_turn, 0.0 if started is None else now - started)

    def nothing_pending(self) -> bool:
        return not self.in_transaction and self.builder.is_empty and not self.writer.busy and not self.streamed

    def _handle_payload(self, payload: bytes | memoryview) -> None:
        if type(payload) is not bytes:  # a logical message, not copied yet (``parse_frame``)
            kept = self._kept_message(payload)
            if kept is None:
                return
            payload = kept
        if self._stream_xid is not None and payload[:1] in pg.STREAMABLE:
            self.streamed.append(self._stream_xid, pg.stream_xid(payload), payload)
            return
        table_id = pg.insert_relation(payload)
        if table_id is None:
            self._handle(self.decoder.decode(payload))
        elif self.applies(table_id, self.final_lsn):  # most changes: no message object on the way
            self._mark_batch()
            self.builder.insert_tuple(table_id, payload, pg.INSERT_TUPLE_START, self.final_lsn)

    def _kept_message(self, payload: bytes | memoryview) -> bytes | None:
        """A logical message copied to be read, or ``None``: dropped unread.

        Any role can emit logical messages of up to 1 GB, and they reach every slot. Those of other prefixes
        are other applications' (never copied, decoded or buffered in a streamed transaction); those of
        ``message_prefixes`` larger than ``ddl.MAX_MESSAGE_BYTES`` are no message the engine sends.
        """
        in_stream = self._stream_xid is not None
        prefix = pg.message_prefix(payload, in_stream, self.message_prefixes)
        if prefix is None:
            return None
        if len(payload) > ddl.MAX_MESSAGE_BYTES:
            log.warning(
                "logical message ignored: larger than any the engine sends",
                prefix=prefix,
                lsn=str(Lsn(pg.message_lsn(payload, in_stream))),
                size=len(payload),
                limit=ddl.MAX_MESSAGE_BYTES,
                hint="another role emitted it with pg_logical_emit_message; see docs/schema-changes.md",
            )
            return None
        return bytes(payload)

    def _handle(self, msg: pg.Message) -> None:
        handler = self._handlers.get(type(msg))
        if handler is not None:  # Origin and Type messages carry nothing the engine uses
            handler(msg)

    def _on_begin(self, msg: pg.Begin) -> None:
        self._begin(msg.xid, msg.final_lsn, msg.commit_ts)

    def _on_commit(self, msg: pg.Commit) -> None:
        self._commit(msg.commit_lsn, msg.end_lsn, msg.commit_ts)

    def _on_relation(self, msg: pg.Relation) -> None:
        if self.applies(msg.oid, self.final_lsn):
            schema = self.schemas.observe(msg, self.final_lsn)
            if schema is not None:
                if self.builder.holds_rows_of(schema.id) and not self.builder.splits_a_transaction:
                    self.flush()  # one schema version of a table per batch, where a commit allows the cut
                self.builder.relation(schema, self.final_lsn)

    def _on_truncate(self, msg: pg.Truncate) -> None:
        ids = [t for t in msg.relation_oids if self.applies(t, self.final_lsn)]
        if ids:
            self._mark_batch()
            self.builder.truncate(ids, msg.cascade, msg.restart_identity, self.final_lsn)

    def _on_stream_start(self, msg: pg.StreamStart) -> None:
        self._stream_xid = msg.xid

    def _on_stream_stop(self, msg: pg.StreamStop) -> None:
        self._stream_xid = None

    def _on_stream_commit(self, msg: pg.StreamCommit) -> None:
        self._begin(msg.xid, msg.commit_lsn, msg.commit_ts)
        for table_id, run in pg.streamed_insert_runs(self.streamed.commit(msg.xid), REPLAY_RUN):
            if table_id is None:
                self._handle(self.decoder.decode_streamed(run[0]))
            elif self.applies(table_id, self.final_lsn):
                self._mark_batch()
                self.builder.insert_tuples(table_id, run, pg.STREAMED_INSERT_TUPLE_START, self.final_lsn)
            if self.builder.size_bytes >= self._full_at():
                self.flush()
        self._commit(msg.commit_lsn, msg.end_lsn, msg.commit_ts)

    def _on_stream_abort(self, msg: pg.StreamAbort) -> None:
        self.streamed.abort(msg.xid, msg.subxid)

    def _begin(self, xid: int, final_lsn: Lsn, commit_ts: datetime) -> None:
        self.began(xid)
        self.in_transaction = True
        self.final_lsn = final_lsn
        self.builder.begin(xid, final_lsn, commit_ts, final_lsn)

    def _commit(self, commit_lsn: Lsn, end_lsn: Lsn, commit_ts: datetime) -> None:
        self.builder.commit(commit_lsn, end_lsn, commit_ts, commit_lsn)
        self.in_transaction = False
        self.after_commit(end_lsn)

    def _on_insert(self, msg: pg.Insert) -> None:
        if self.applies(msg.relation_oid, self.final_lsn):
            self._mark_batch()
            self.builder.insert(msg.relation_oid, msg.new, self.final_lsn)

    def _on_update(self, msg: pg.Update) -> None:
        if self.applies(msg.relation_oid, self.final_lsn):
            self._mark_batch()
            self.builder.update(msg.relation_oid, msg.old_kind, msg.old, msg.new, self.final_lsn)

    def _on_delete(self, msg: pg.Delete) -> None:
        if self.applies(msg.relation_oid, self.final_lsn):
            self._mark_batch()
            self.builder.delete(msg.relation_oid, msg.old_kind, msg.old, self.final_lsn)

    def _mark_batch(self) -> None:
        if self._batch_started is None:
            self._batch_started = time.monotonic()

    # -- batching ------------------------------------------------------------------------------------
    def _maybe_flush(self) -> None:
        """Hand the batch over when it is full, or when it is due and the writer takes it, at a commit: a due batch
        that holds changes of a transaction still open waits for its commit (a full one does not: a transaction
        larger than a batch is split over batches).

        A batch due while the previous write still runs, or before the destination's
        ``min_write_interval_s`` since that write began, keeps filling; so does a batch past ``max_bytes``
        meanwhile, up to ``busy_max_bytes``. Batches arriving faster than the destination writes are merged
        into fewer, larger writes, and the stream is read meanwhile instead of waiting.
        """
        if self.builder.is_empty:
            return
        due = self._batch_started is not None and (
            time.monotonic() - self._batch_started >= self.batch_config.max_fill_ms / 1000
        )
        if self.builder.size_bytes >= self._full_at() or (
            due and not self._busy() and not self.builder.splits_a_transaction
        ):
            self.flush()

    def _busy(self) -> bool:
        """Whether the destination cannot take a batch yet: a write runs, or its least interval between writes lasts."""
        return self.writer.busy or self.writer.next_write_in() > 0

    def _full_at(self) -> int:
        """The size at which the batch is full: ``max_bytes``, or while the destination is busy ``busy_max_bytes``."""
        return self.batch_config.busy_limit if self._busy() else self.batch_config.max_bytes

    def flush(self) -> None:
        """Hand the current batch to the writer (waiting for the write in flight first)."""
        if self.builder.is_empty and not self.builder.has_commits:
            return
        splits = self.builder.splits_a_transaction
        while True:
            try:
                batch = self.builder.build()
                break
            except TableError as exc:  # a value of one table cannot be converted: that table errors, alone
                if exc.table_id is None:
                    raise
                self.table_failed(exc.table_id, exc)
                self.builder.discard_table(exc.table_id)
        self._batch_started = None
        if splits:
            batch = replace(batch, ends_in_transaction=True)
        self.submit(self.prepared(batch))

    def prepared(self, batch: EventBatch) -> EventBatch:
        """The batch to hand over, made from what the stream gave (the apply worker leaves out what it copies)."""
        return batch

    def marked(self, batch: EventBatch) -> EventBatch:
        """The batch as written, once every earlier write has ended (the apply worker marks it then)."""
        return batch

    def holds(self, table_id: TableId) -> bool:
        """Whether the batch being filled holds changes of the table."""
        return self.builder.holds(table_id)

    def submit(self, batch: EventBatch) -> None:
        """Hand ``batch`` to the writer once the write in flight has ended."""
        self.wait_for_writer()
        self.writer.submit(self.marked(batch))

    def wait_for_writer(self) -> None:
        """Until the write in flight, if any, has ended."""
        while not self.writer.wait(timeout=1.0):  # backpressure: keep the server informed meanwhile
            self.send_status()

    def table_failed(self, table_id: TableId, error: TableError) -> None:
        raise error

    # -- feedback ------------------------------------------------------------------------------------
    def confirmed_lsn(self) -> Lsn:
        """What the slot may forget: the durable position, or the idle position when nothing is pending."""
        return max(self.writer.durable_lsn, self.idle_lsn if self.nothing_pending() else Lsn.ZERO)

    def send_status(self, force: bool = False, reply: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_status < STATUS_INTERVAL_S:
            return
        flushed = self.confirmed_lsn()
        self.conn.send_status(write=self.received_lsn, flush=flushed, apply=flushed, reply=reply)
        self._last_status = now
