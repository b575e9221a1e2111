"""The apply worker's incremental copies (``[copy] method = "incremental"``): taking tables on, and their chunks
read on copy threads beside the stream (a flight each), each table's changes after its chunk's launch held back
until the chunk is written between two writes of the stream. What a chunk means for the stream's changes is
``incremental``'s."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final, Protocol

import psycopg
import pyarrow as pa
import structlog

from etl.destination.base import ChunkCopier, StagedChunk
from etl.errors import ConfigError, EtlError, TableError
from etl.events import EventBatch, joined
from etl.key_chunk import KeyChunk
from etl.key_sql import KeyValue, integer_key
from etl.lsn import Lsn
from etl.postgres.catalog import (
    WAL_POSITION,
    PublishedTable,
    estimated_rows,
    publication_options,
    table_schema,
)
from etl.postgres.connection import connect
from etl.postgres.copy import copy_chunk, plan_chunk
from etl.postgres.copy_session import ChunkKey, ChunkSnapshot, ChunkTable
from etl.postgres.key_order import (
    NO_KEY,
    PARTITION_ROOT,
    SourceComparisons,
    SourceKeyOrder,
    key_index_order,
)
from etl.postgres.predicate import predicate_rows
from etl.postgres.standby_slots import wait_for_standbys
from etl.postgres.wal_nudge import nudge_decoding
from etl.postgres.xid_snapshot import XidSnapshot, running_xids
from etl.replication.context import WorkerContext
from etl.replication.incremental import (
    NO_MARK,
    NOTHING_RECORDED,
    ChunkMark,
    IncrementalCopy,
    IntegerKeyOrder,
    KeyOrder,
    incremental_key,
    table_key,
)
from etl.replication.tablesync import empty_table
from etl.schema import TableId, TableSchema
from etl.store.base import CopyProgress, TableState, TableStateKind

log = structlog.get_logger(__name__)

RETRY_S: Final = 2.0
"""How long a copy waits after a chunk it could not read or use, or while its barrier holds."""
STANDBY_WAIT_S: Final = 5.0
"""Seconds a chunk waits for the standby slots to have what it read before it is read again later."""
SNAPSHOT_QUERY: Final = "SELECT pg_catalog.pg_current_snapshot()::text"
RUNNING_QUERY: Final = (
    "SELECT backend_xid::text FROM pg_catalog.pg_stat_activity WHERE backend_xid IS NOT NULL"
    " UNION ALL SELECT transaction::text FROM pg_catalog.pg_prepared_xacts"
)
"""The transactions in progress (their 32-bit ids; ``pg_stat_activity`` shows every backend's to any role)."""
HOLDERS_QUERY: Final = (
    "SELECT 'pid ' || pid, backend_xid::text,"
    " extract(epoch FROM pg_catalog.now() OPERATOR(pg_catalog.-) xact_start)::float8, state"
    " FROM pg_catalog.pg_stat_activity WHERE backend_xid IS NOT NULL"
    " UNION ALL SELECT 'prepared transaction ' || pg_catalog.quote_literal(gid), transaction::text,"
    " extract(epoch FROM pg_catalog.now() OPERATOR(pg_catalog.-) prepared)::float8, NULL"
    " FROM pg_catalog.pg_prepared_xacts"
)
BARRIER_NOTE: Final = "waits for transactions open since the copy began: "
BARRIER_NOTE_S: Final = 5.0
"""How long a copy waits for the transactions running when it began before it says whom it waits for."""


class Stream(Protocol):
    """What the copies need of the apply worker."""

    position: Lsn
    """After every transaction received: the end of the last, or a keepalive's position once nothing is pending."""
    tables: dict[TableId, PublishedTable]

    def flush(self) -> None: ...

    def holds(self, table_id: TableId) -> bool:
        """Whether the batch being filled holds changes of the table."""
        ...

    def submit(self, batch: EventBatch) -> None: ...

    def table_failed(self, table_id: TableId, error: TableError) -> None: ...


@dataclass(frozen=True)
class ChunkRead:
    """What a copy thread read of a chunk, for the apply worker to place (``ChunkedCopies._place``)."""

    read: ChunkSnapshot
    found: ChunkTable
    chunk: KeyChunk
    """The chunk as read (a backfill's ``bounded``)."""
    rows: int
    last: KeyValue | None
    """Its last key, in the source's text form; ``None``: it holds no row."""
    missed: frozenset[int]
    """Transactions streamed before its read began that its snapshot saw not completed (``IncrementalCopy.misses``):
    their changes to its keys were left out, so it is read again."""
    lacking: list[str]
    """Standbys in ``synchronized_standby_slots`` that lack what it read after a short wait: it is read again."""
    rows_read: pa.Table | None = None
    """Its rows, read in this process, for a batch; ``None``: the destination staged them (``staged``)."""
    staged: StagedChunk | None = None
    """What the destination staged (``ChunkCopier.stage_chunk``); ``None`` when it holds no row, or is read again."""


@dataclass
class Flight:
    """A chunk read on a copy thread while the stream goes on. It is written at ``start`` among the stream's changes,
    so the changes of its table that commit from ``start`` on wait for it (``held``): the other tables' are written
    meanwhile. So long as some wait, the stream's position is not durable past ``start`` (``ChunkedCopies.prepared``):
    a run that dies meanwhile receives them again."""

    copy: IncrementalCopy
    table_name: str
    start: Lsn
    """The stream's position when the read began (``Stream.position``): every later transaction commits at or after."""
    schema: TableSchema
    """The table's schema when the read began: a chunk whose table changed its columns meanwhile is read again."""
    before: frozenset[int]
    """The transactions streamed since the last chunk, which the read checks (``ChunkRead.missed``)."""
    future: Future[ChunkRead]
    held: list[EventBatch] = field(default_factory=list)
    """The table's changes from ``start`` on, in order (``EventBatch.parted``)."""
    held_bytes: int = 0
    overflowed: bool = False
    """``held`` outgrew ``busy_max_bytes``: the changes were let go, and the chunk is read again."""


@dataclass
class ChunkedCopies:
    ctx: WorkerContext
    stream: Stream
    wait_written: Callable[[], object]
    """Waits until the write in flight is durable (``BatchWriter.wait``)."""
    write_in_flight: Callable[[], Future[None] | None]
    """The write in flight, which a copy thread may wait for (``BatchWriter.in_flight``)."""

    def __post_init__(self) -> None:
        self.copies: dict[TableId, IncrementalCopy] = {}
        self._resume_at: dict[TableId, Lsn] = {}
        self._snapshot_copies: set[TableId] = set()
        self._not_before: dict[TableId, float] = {}
        self._held_since: dict[TableId, float] = {}
        """When each copy found its barrier holding first (``_barrier_holds``)."""
        self._nudged = Lsn.ZERO
        """Where the last ``nudge_decoding`` committed: finished copies whose last read is before it need no other."""
        self._comparisons = SourceComparisons(self.ctx.config.source)
        """Where keys that only the source can order are compared (``etl.postgres.key_order``)."""
        self._workers = self.ctx.config.pipeline.table_sync_workers
        self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="chunk")
        self._flights: dict[TableId, Flight] = {}
        self._abandoned: list[Future[ChunkRead]] = []
        """Reads of copies that ended meanwhile: what they staged is dropped once they end."""
        self._cancel = threading.Event()
        self._stream_upto = Lsn.ZERO
        """The end of the last transaction the stream handed over (``prepared``), before any limit."""

    def close(self) -> None:
        """Stop the chunks' reads; drop what they staged. The changes waiting for them are not durable: the next run
        receives them again."""
        self._cancel.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for future in [*(f.future for f in self._flights.values()), *self._abandoned]:
            self._discard(future)
        self._flights.clear()
        self._comparisons.close()

    def _order(self, schema: TableSchema, key: tuple[str, ...]) -> KeyOrder:
        return IntegerKeyOrder() if integer_key(schema) else SourceKeyOrder(self._comparisons, schema.id, key)

    # -- the stream's hooks --------------------------------------------------------------------------------
    def began(self, xid: int) -> None:
        for copy in self.copies.values():
            copy.streamed.add(xid)

    def prepared(self, batch: EventBatch) -> EventBatch:
        """``batch`` as the copies take it: the changes of tables whose chunk is being read held back for it
        (``Flight``), the rest as each copy filters it; progress no further than the earliest held change."""
        self._stream_upto = max(self._stream_upto, batch.last_commit_lsn)
        for copy in list(self.copies.values()):
            flight = self._flights.get(copy.table_id)
            if flight is not None and not flight.overflowed:
                batch = self._hold(flight, batch)
            try:
                batch = copy.filtered(batch)
            except TableError as exc:  # its key column is gone: the table errors, and is copied again
                self.forget(copy.table_id)
                self.stream.table_failed(copy.table_id, exc)
                batch = batch.without_table(copy.table_id)
        holding = [f.start for f in self._flights.values() if f.held]
        if holding and batch.last_commit_lsn > min(holding):
            batch = replace(batch, last_commit_lsn=min(holding))
        return batch

    def forget(self, table_id: TableId) -> None:
        """The table leaves the copy (copied again from the start, or out of the publication); the changes that
        waited for its chunk go with it."""
        self.copies.pop(table_id, None)
        flight = self._flights.pop(table_id, None)
        if flight is not None:
            self._abandoned.append(flight.future)

    # -- taking tables on ------------------------------------------------------------------------------------
    def take_on(self, table_id: TableId) -> bool:
        """Begin an incremental copy of a table in Init, between two transactions of the stream; ``False`` when
        the table gets a snapshot copy instead (it has no key to order chunks by: ``chunk_key``)."""
        ctx, table = self.ctx, self.stream.tables[table_id]
        with connect(ctx.config.source) as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            generated = publication_options(conn, ctx.publication).generated_columns
            schema = table_schema(conn, table_id, table.column_list, include_generated=generated)
            key, why = chunk_key(conn, schema, table)
            if key is None:
                if table_id not in self._snapshot_copies:
                    self._snapshot_copies.add(table_id)
                    log.info(f"table copied by snapshot: {why}", table=str(table.name))
                return False
            barrier = _running(conn)
            estimate = estimated_rows(conn, [table.name])
        schema = schema.with_snapshot(self.stream.position)
        previous = ctx.store.get_table_schema(table_id)
        if previous is not None:
            ctx.destination.drop_table_for_copy(previous)
        ctx.store.prepare_table_for_copy(table_id)
        ctx.schemas.forget(table_id)
        ctx.destination.write_table_rows(schema, empty_table(schema))
        ctx.destination.flush()
        ctx.store.store_table_schema(schema)
        now = datetime.now(UTC)
        ctx.store.record_copy_progress(table_id, CopyProgress(0, estimate, now, now))
        ctx.states.set(table_id, TableState(TableStateKind.COPYING))
        order = self._order(schema, key)
        self.copies[table_id] = IncrementalCopy(
            table_id, key, table_key(schema), None, 0, NO_MARK, barrier, order, estimate=estimate, started_at=now
        )
        log.info("copying a table in chunks", table=str(table.name), key=key, chunk_rows=ctx.config.copy_.chunk_rows)
        return True

    def backfill(self, table_id: TableId, where: str) -> None:
        """Begin a backfill of a copied table (``etl resync --where``): chunks of the rows ``where`` picks, upserted
        into its destination table as it is, while its changes stream on."""
        ctx, table = self.ctx, self.stream.tables[table_id]
        schema = ctx.schemas.current(table_id)
        try:
            with connect(ctx.config.source) as conn:
                key, why = chunk_key(conn, schema, table)
                if key is None:
                    log.warning(
                        f"a backfill needs a key to order its chunks by: {why}; resync the whole table",
                        table=str(table.name),
                    )
                    return
                barrier = _running(conn)
                estimate = predicate_rows(conn, table.name, where)
        except ConfigError as exc:  # the table changed since the request was checked
            log.warning("a backfill's predicate no longer fits its table", table=str(table.name), error=exc.message)
            return
        # The chunks go after the last chunk written into the table (its copy's or an earlier backfill's): with no
        # transaction streamed since, they sit at the same stream position, and a destination that skips what it
        # applied before would skip them.
        earlier = ctx.store.get_copy_progress(table_id)
        mark = (
            NO_MARK
            if earlier is None or earlier.resume_after is None
            else ChunkMark.from_json(earlier.resume_after).mark
        )
        now = datetime.now(UTC)
        resume_after = mark.to_json(None, where)  # durable before its first chunk: a restart goes on with it
        ctx.store.record_copy_progress(table_id, CopyProgress(0, estimate, now, now, False, resume_after))
        ctx.states.set(table_id, TableState(TableStateKind.COPYING))
        order = self._order(schema, key)
        self.copies[table_id] = IncrementalCopy(
            table_id,
            key,
            table_key(schema),
            None,
            0,
            mark,
            barrier,
            order,
            where=where,
            estimate=estimate,
            started_at=now,
        )
        log.info("backfilling a table in chunks", table=str(table.name), key=key, where=where, estimate=estimate)

    def resume(self, table_id: TableId) -> None:
        """Go on with a table's incremental copy after the last chunk a run wrote (at a start)."""
        ctx, table = self.ctx, self.stream.tables[table_id]
        schema = ctx.schemas.current(table_id)
        progress = ctx.store.get_copy_progress(table_id)
        recorded = NOTHING_RECORDED
        if progress is not None and progress.resume_after is not None:
            recorded = ChunkMark.from_json(progress.resume_after)
        with connect(ctx.config.source) as conn:
            key, _ = chunk_key(conn, schema, table)
            if key is None or progress is None or recorded.key not in ((), table_key(schema)):
                log.info("copying a table again from the start: its key changed since", table=str(table.name))
                ctx.states.set(table_id, TableState.init())
                return
            barrier = _running(conn)
            row = conn.execute(f"SELECT {WAL_POSITION}::text").fetchone()
            assert row is not None
            wal = Lsn.parse(row[0])
        after, where = recorded.after, recorded.where
        # A run that died may have written past its stored progress (a destination writes, then progress is
        # stored): the next chunk waits until the stream is past all it may have written, and so goes after it.
        self._resume_at[table_id] = wal
        self.copies[table_id] = IncrementalCopy(
            table_id,
            key,
            recorded.key or table_key(schema),  # an earlier release's record has none: the key the copy knows
            after,
            progress.rows,
            recorded.mark,
            barrier,
            self._order(schema, key),
            where=where,
            estimate=progress.estimate,
            started_at=progress.started_at,
            upto=recorded.upto,
            read_before=recorded.read_before,
            finished=progress.finished,
        )
        what = "going on with a table's backfill in chunks" if where else "going on with a table's copy in chunks"
        log.info(what, table=str(table.name), after=after, rows=progress.rows, where=where)

    def awaiting_position(self) -> bool:
        """Whether a finished copy waits for the stream to pass its last chunk's read (``_end_or_later``): on an idle
        source no change moves the stream there, so the stream asks the server where it is."""
        position = self.stream.position
        return any(copy.finished and position < copy.read_before for copy in self.copies.values())

    # -- chunks ------------------------------------------------------------------------------------------------
    def due(self) -> bool:
        """Whether a chunk's read ended, or a table under copy may take its next chunk now."""
        if any(f.future.done() for f in self._flights.values()) or any(f.done() for f in self._abandoned):
            return True
        if len(self._flights) >= self._workers:
            return False
        now = time.monotonic()
        return any(t not in self._flights and now >= self._not_before.get(t, 0.0) for t in self.copies)

    def in_flight(self) -> bool:
        """Whether a chunk is being read: the stream looks for its end often."""
        return bool(self._flights)

    def holding(self) -> bool:
        """Whether changes of a table wait for its chunk (``Flight.held``): the stream's position is not durable."""
        return any(f.held for f in self._flights.values())

    def copy_chunks(self) -> None:
        """Between two transactions of the stream: place each chunk whose read ended, and start reading the next chunk
        of each table whose turn it is, up to ``[pipeline] table_sync_workers`` at once."""
        for future in [f for f in self._abandoned if f.done()]:
            self._abandoned.remove(future)
            self._discard(future)
        for flight in [f for f in self._flights.values() if f.future.done()]:
            self._place(flight)
        now = time.monotonic()
        for copy in list(self.copies.values()):
            if len(self._flights) >= self._workers:
                break
            if copy.table_id not in self._flights and now >= self._not_before.get(copy.table_id, 0.0):
                self._launch(copy)

    def _launch(self, copy: IncrementalCopy) -> None:
        """Start reading a copy's next chunk on a copy thread; the stream goes on meanwhile (``Flight``)."""
        ctx, table_id = self.ctx, copy.table_id
        table = self.stream.tables.get(table_id)
        if table is None:
            return
        state = ctx.states.get(table_id)
        if state is None or state.kind is not TableStateKind.COPYING:  # errored meanwhile
            self.forget(table_id)
            return
        if copy.finished or self.stream.position < self._resume_at.get(table_id, Lsn.ZERO):
            self._end_or_later(copy, table)
            return
        try:
            if copy.barrier is not None and self._barrier_holds(copy, table):
                self._later(table_id)  # a transaction running when the copy began is still running
                return
        except EtlError as exc:
            log.warning("copying a chunk failed; copying it again shortly", table=str(table.name), error=exc.message)
            self._later(table_id)
            return
        schema = ctx.schemas.current(table_id)
        chunk = KeyChunk(copy.key, copy.after, ctx.config.copy_.chunk_rows, copy.where)
        before, copy.streamed = frozenset(copy.streamed), set()
        start, copier = self.stream.position, ctx.destination
        job: Callable[[], ChunkRead]
        if isinstance(copier, ChunkCopier) and copy.adds_new_keys:
            # The table's changes before ``start`` reach the destination before the chunk is staged: a chunk
            # commits only onto the state it was staged on (DuckLake's snapshot), and those changes precede it.
            if self.stream.holds(table_id):
                self.stream.flush()
            at, earlier = (copy.mark, start), self.write_in_flight()
            job = partial(
                self._stage, copier, schema, table, chunk, at=at, table_key=copy.table_key, before=before, after=earlier
            )
        else:
            job = partial(self._read, schema, table, chunk, before)
        self._flights[table_id] = Flight(copy, str(table.name), start, schema, before, self._pool.submit(job))

    def _read(self, schema: TableSchema, table: PublishedTable, chunk: KeyChunk, before: frozenset[int]) -> ChunkRead:
        """On a copy thread: read the chunk here, for the apply worker to write as a batch."""
        connections = self.ctx.config.copy_.connections
        read, found, rows, keys, chunk = copy_chunk(
            self.ctx.config.source, schema, table.row_filter, chunk, connections=connections
        )
        missed = _missed(before, read)
        lacking = [] if missed else self._lacking(read, table)
        return ChunkRead(read, found, chunk, rows.num_rows, keys.last, missed, lacking, rows_read=rows)

    def _stage(
        self,
        copier: ChunkCopier,
        schema: TableSchema,
        table: PublishedTable,
        chunk: KeyChunk,
        *,
        at: tuple[ChunkMark, Lsn],
        table_key: ChunkKey,
        before: frozenset[int],
        after: Future[None] | None,
    ) -> ChunkRead:
        """On a copy thread: plan the chunk and have the destination read and stage it (``ChunkCopier``), at the mark
        it gets after the copy's last (``at``: that mark and the stream's position, ``ChunkMark.next``), once the
        write that was in flight at the launch (``after``) has ended."""
        if after is not None:
            with suppress(Exception):  # a failed write is the apply worker's to report
                after.result()
        parts = self.ctx.config.copy_.connections
        with plan_chunk(self.ctx.config.source, schema, table.row_filter, chunk, parts=parts) as planned:
            read, found, keys, plan, chunk = planned
            missed = _missed(before, read)
            lacking = [] if missed else self._lacking(read, table)
            staged = None
            if keys.rows and not missed and not lacking and found.key == table_key:
                mark = at[0].next(at[1], keys.rows)
                staged = copier.stage_chunk(plan, (mark.position, mark.ordinal), self._cancel)
        return ChunkRead(read, found, chunk, keys.rows, keys.last, missed, lacking, staged=staged)

    def _place(self, flight: Flight) -> None:
        """Write a chunk whose read ended at its place in the stream, before the changes of its table that waited for
        it; or, when it cannot be used, let them go and read it again later."""
        ctx, copy, table_id = self.ctx, flight.copy, flight.copy.table_id
        self.stream.flush()  # everything the stream gave so far, the table's changes since the read began held
        del self._flights[table_id]
        table = self.stream.tables.get(table_id)
        try:
            got = flight.future.result()
        except TableError as exc:
            self._chunk_failed(flight, exc)
            return
        except EtlError as exc:
            log.warning("copying a chunk failed; copying it again shortly", table=flight.table_name, error=exc.message)
            copy.streamed |= flight.before  # not checked: the next read checks them
            self._release(flight)
            self._later(table_id)
            return
        state = ctx.states.get(table_id)
        if table is None or table_id not in self.copies or state is None or state.kind is not TableStateKind.COPYING:
            self._discard(got)  # errored, copied again or gone meanwhile: its changes go with it
            self.copies.pop(table_id, None)
            return
        if self._key_moved(copy, got.found, table):
            self._discard(got)
            return
        if not self._usable(flight, got, table):
            self._discard(got)
            self._release(flight)
            self._later(table_id)
            return
        try:
            written = self._write(flight, got)
        except TableError as exc:
            self._chunk_failed(flight, exc)
            return
        except EtlError as exc:
            log.warning("copying a chunk failed; copying it again shortly", table=str(table.name), error=exc.message)
            self._release(flight)
            self._later(table_id)
            return
        state = ctx.states.get(table_id)
        if state is None or state.kind is not TableStateKind.COPYING:  # its write errored the table
            self.copies.pop(table_id, None)
            return
        last = got.chunk.reach(got.last)
        copy.read_before = got.read.wal
        copy.after, copy.rows, copy.finished = (
            copy.after if last is None else last,
            copy.rows + written,
            got.chunk.ends_copy(written),
        )
        self._release(flight)  # after the chunk: the keys it holds are copied
        ctx.metrics.copied_rows.labels(str(table.name)).inc(written)
        self._record(copy, copy.finished)
        if copy.finished:
            self._end_or_later(copy, table)

    def _write(self, flight: Flight, got: ChunkRead) -> int:
        """Write the chunk at the flight's start among the stream's changes, durable; its row count."""
        copy = flight.copy
        try:
            self.wait_written()  # the stream's changes so far are durable before a chunk's mark after them is recorded
            copy.mark = copy.mark.next(flight.start, got.rows)
            rows = got.rows_read
            batch = None if rows is None else copy.chunk_batch(flight.schema, rows, copy.mark, datetime.now(UTC))
            copy.will_write(got.last)
            self._record(copy, finished=False)  # the mark and the chunk's last key, before the chunk (see ChunkMark)
        except BaseException:  # before the chunk's write: what was staged goes
            self._discard(got)
            raise
        if batch is not None:
            self.stream.submit(batch)
            self.wait_written()  # durable before the copy's position moves past it
            return got.rows
        if got.staged is None:  # no row in it
            return 0
        assert got.staged.watermark == (copy.mark.position, copy.mark.ordinal)
        copier = self.ctx.destination
        assert isinstance(copier, ChunkCopier)
        written = copier.commit_chunk(got.staged)
        if written != got.rows:
            raise EtlError(
                f"{flight.table_name}: the destination wrote {written} rows of a chunk of {got.rows}",
                hint="a fault of the destination plugin's commit_chunk; the chunk is copied again",
            )
        return written

    def _usable(self, flight: Flight, got: ChunkRead, table: PublishedTable) -> bool:
        """Whether a chunk read may be written now; else, said why, it is read again later."""
        copy = flight.copy
        if got.missed:  # a transaction already streamed, whose changes to keys not copied yet were left out
            log.info("a chunk did not see a transaction already streamed; reading it again", table=str(table.name))
            copy.streamed |= got.missed
            return False
        if got.lacking:
            log.warning(
                "a chunk is read again later: a standby in synchronized_standby_slots lacks what it read",
                table=str(table.name),
                standbys=got.lacking,
            )
            return False
        if flight.overflowed:
            log.warning(
                "a chunk's table changed more than busy_max_bytes during its read; reading it again",
                table=str(table.name),
                hint="a smaller [copy] chunk_rows reads faster",
            )
            return False
        if self.ctx.schemas.current(copy.table_id) != flight.schema:
            log.info("a chunk's table changed its columns during the read; reading it again", table=str(table.name))
            return False
        return True

    def _chunk_failed(self, flight: Flight, error: TableError) -> None:
        """A chunk's rows cannot be written (a value the destination cannot hold): the table errors, or a backfill
        is dropped (``_backfill_failed``), the changes that waited for it then applied."""
        copy = flight.copy
        table = self.stream.tables.get(copy.table_id)
        if copy.where is not None and table is not None:
            self._release(flight)  # the table stays whole and streams on: the changes that waited are applied
            self._backfill_failed(copy, table, error)
            return
        self.copies.pop(copy.table_id, None)
        self.stream.table_failed(copy.table_id, error)

    def _release(self, flight: Flight) -> None:
        """Hand the changes that waited for a chunk to the writer, as the copy now takes them (``filtered``),
        durable up to where the stream has been, but before what other chunks hold."""
        copy, table_id = flight.copy, flight.copy.table_id
        if not flight.held or self.copies.get(table_id) is not copy:
            return
        holding = [f.start for f in self._flights.values() if f.held]
        batch = replace(joined(flight.held), last_commit_lsn=min([self._stream_upto, *holding]))
        flight.held = []
        try:
            batch = copy.filtered(batch)
        except TableError as exc:  # its key column is gone: the table errors, and is copied again
            self.forget(table_id)
            self.stream.table_failed(table_id, exc)
            batch = batch.without_table(table_id)
        self.stream.submit(batch)

    def _hold(self, flight: Flight, batch: EventBatch) -> EventBatch:
        """``batch`` without the changes of the flight's table from its start on, which wait for its chunk; all of
        them given back once they outgrow ``busy_max_bytes`` (the chunk is then read again)."""
        table_id = flight.copy.table_id
        rest, held = batch.parted(table_id, flight.start, holding=bool(flight.held))
        if held is None:
            return rest
        held_bytes = flight.held_bytes + sum(s.table.nbytes for s in held.changes[table_id])
        if held_bytes <= self.ctx.config.batch.busy_limit:
            flight.held.append(held)
            flight.held_bytes = held_bytes
            return rest
        flight.overflowed = True  # the earlier batches' held changes, then this one whole: the table's order
        batch = joined([*flight.held, batch])
        flight.held = []
        return batch

    def _discard(self, read: ChunkRead | Future[ChunkRead]) -> None:
        """Drop what a chunk's read staged on the destination, if anything."""
        if isinstance(read, Future):
            if read.cancelled() or read.exception() is not None:
                return
            read = read.result()
        if read.staged is None:
            return
        copier = self.ctx.destination
        assert isinstance(copier, ChunkCopier)
        try:
            copier.discard_chunk(read.staged)
        except Exception as exc:  # what is left is the destination's to clean up (orphan files, staging tables)
            log.warning("a staged chunk could not be dropped", error=str(exc))

    def _lacking(self, read: ChunkSnapshot, table: PublishedTable) -> list[str]:
        """The standbys a failover may promote that still lack what a chunk read (``etl.postgres.standby_slots``)
        after a short wait: then it is read again later rather than written."""
        ctx = self.ctx
        return wait_for_standbys(
            ctx.config.source, read.standby_slots, read.wal, what=str(table.name), stop=ctx.stop, timeout=STANDBY_WAIT_S
        )

    def _end_or_later(self, copy: IncrementalCopy, table: PublishedTable) -> None:
        """End a finished copy once the stream is past every transaction its last chunk saw committed (until then
        their inserts are upserts: ``IncrementalCopy.read_before``); else look again later."""
        if not copy.finished or self.stream.position < copy.read_before:
            if copy.finished and copy.read_before > self._nudged:
                with connect(self.ctx.config.source) as conn:
                    self._nudged = max(self._nudged, nudge_decoding(conn) or copy.read_before)  # 0: a standby
            self._later(copy.table_id)
            return
        self.copies.pop(copy.table_id, None)
        self.ctx.states.set(copy.table_id, TableState(TableStateKind.READY))
        if copy.where is None:
            log.info("table copied in chunks", table=str(table.name), rows=copy.rows)
        elif not copy.failed:
            log.info("table backfilled", table=str(table.name), rows=copy.rows)

    def _backfill_failed(self, copy: IncrementalCopy, table: PublishedTable, error: TableError) -> None:
        """A backfill's chunk failed (its predicate's error on some row, say): the backfill is dropped, and the
        table, whole before it, streams on. The operator sees why: the log, ``etl status`` (the copy's note) and
        ``etl_backfills_failed_total``."""
        copy.failed, copy.finished = True, True
        copy.note = f"backfill of the rows where {copy.where} failed and was dropped: {error.message}"
        self._record(copy, finished=True)
        self.ctx.metrics.backfills_failed.labels(str(table.name)).inc()
        log.error(
            "a backfill failed and was dropped; the table streams on",
            table=str(table.name),
            where=copy.where,
            error=error.message,
            hint=f"fix the predicate, then ask again: etl resync --table {table.name} --where '...'",
        )
        self._end_or_later(copy, table)

    def ignored(self, table_id: TableId, what: str) -> None:
        """Say in the table's copy record (``etl status``) that a request for it was ignored (``what``)."""
        copy = self.copies.get(table_id)
        if copy is not None:
            copy.note = what
            self._record(copy, copy.finished)
            return
        progress = self.ctx.store.get_copy_progress(table_id)
        if progress is not None:
            noted = ChunkMark.noted(progress.resume_after or NO_MARK.to_json(None), what)
            self.ctx.store.record_copy_progress(table_id, replace(progress, resume_after=noted))

    def _key_moved(self, copy: IncrementalCopy, found: ChunkTable, table: PublishedTable) -> bool:
        """Whether the table's key, in the chunk's snapshot, is not the one the copy began with (``table_key``): then
        the table is copied again from the start (its chunks so far were cut by keys that may not be unique now)."""
        if found.key == copy.table_key:
            return False
        log.warning(
            "a table's key changed during its incremental copy; copying it again from the start",
            table=str(found.name),
            key=[name for name, _ in found.key],
            was=[name for name, _ in copy.table_key],
        )
        self.copies.pop(copy.table_id, None)
        self.ctx.states.set(copy.table_id, TableState.init())
        return True

    def _barrier_holds(self, copy: IncrementalCopy, table: PublishedTable) -> bool:
        """Whether a transaction running when the copy was taken on still runs (``barrier``). One that holds it back
        for ``BARRIER_NOTE_S`` is logged once and named in the copy's record (``etl status``): any login's
        transaction that took an xid and stays open holds the copy at its first chunk."""
        assert copy.barrier is not None
        with connect(self.ctx.config.source) as conn:
            snapshot = _snapshot(conn)
            copy.barrier = snapshot.still_running(copy.barrier) or None
            if copy.barrier is None:
                if copy.note is not None and copy.note.startswith(BARRIER_NOTE):
                    log.info("the transactions an incremental copy waited for have ended", table=str(table.name))
                    copy.note = None
                return False
            since = self._held_since.setdefault(copy.table_id, time.monotonic())
            if copy.note is None and time.monotonic() - since >= BARRIER_NOTE_S:
                holders = _holders(conn, snapshot, copy.barrier)
                copy.note = BARRIER_NOTE + "; ".join(holders)
                self._record(copy, finished=False)  # before the log: who reads the line finds it in etl status
                log.warning(
                    "an incremental copy waits for transactions open since it began",
                    table=str(table.name),
                    transactions=holders,
                    hint="they must commit or roll back before its first chunk: end them (pg_terminate_backend(pid),"
                    " COMMIT/ROLLBACK PREPARED) if they are forgotten",
                )
        return True

    def _record(self, copy: IncrementalCopy, finished: bool) -> None:
        now = datetime.now(UTC)
        resume_after = copy.mark.to_json(
            copy.after, copy.where, copy.upto, copy.read_before, key=copy.table_key, note=copy.note
        )
        progress = CopyProgress(copy.rows, copy.estimate, copy.started_at or now, now, finished, resume_after)
        self.ctx.store.record_copy_progress(copy.table_id, progress)

    def _later(self, table_id: TableId) -> None:
        self._not_before[table_id] = time.monotonic() + RETRY_S


def check_backfill(conn: psycopg.Connection[Any], table: PublishedTable, where: str) -> int:
    """The planner's estimate of the rows a backfill of ``table`` with ``where`` copies; ``EtlError`` saying why
    there can be none (no key to order its chunks by: ``chunk_key``; a predicate the table cannot take)."""
    schema = table_schema(conn, table.id, table.column_list)
    key, why = chunk_key(conn, schema, table)
    if key is None:
        raise EtlError(
            f"--where needs a table with a key to copy its rows in chunks by; {table.name}: {why}",
            hint=f"copy the whole table again instead: etl resync --table {table.name}",
        )
    return predicate_rows(conn, table.name, where)


def chunk_key(
    conn: psycopg.Connection[Any], schema: TableSchema, table: PublishedTable
) -> tuple[tuple[str, ...] | None, str]:
    """The columns an incremental copy of ``table`` orders its chunks by (``incremental_key``, in its index's order:
    ``key_index_order``), or ``None`` and why it has none, in words."""
    key = incremental_key(schema, table.partitioned)
    if key is None:
        return None, PARTITION_ROOT if table.partitioned else NO_KEY
    return key_index_order(conn, table.id, key)


def _missed(before: frozenset[int], read: ChunkSnapshot) -> frozenset[int]:
    """Of the transactions streamed before a chunk's read began (since the last read), those its snapshot saw not
    completed (``IncrementalCopy.misses``)."""
    return frozenset(xid for xid in before if read.snapshot.saw_running(xid))


def _snapshot(conn: psycopg.Connection[Any]) -> XidSnapshot:
    row = conn.execute(SNAPSHOT_QUERY).fetchone()
    assert row is not None
    return XidSnapshot.parse(row[0])


def _running(conn: psycopg.Connection[Any]) -> frozenset[int]:
    """The transactions running now (``running_xids``): a snapshot, then those in progress after it."""
    snapshot = _snapshot(conn)
    return running_xids(snapshot, (int(xid) for (xid,) in conn.execute(RUNNING_QUERY).fetchall()))


def _holders(conn: psycopg.Connection[Any], snapshot: XidSnapshot, xids: frozenset[int]) -> list[str]:
    """Who holds the transactions ``xids`` open, in words: ``pid 123 (xid 731, open 2m05s, idle in transaction)``."""
    found = []
    for pid, xid, age, state in conn.execute(HOLDERS_QUERY).fetchall():
        if snapshot.full(int(xid)) in xids:
            open_for = "" if age is None else f", open {age:.0f}s"
            found.append(f"{pid} (xid {xid}{open_for}{'' if state is None else ', ' + state})")
    return found or [f"xids {', '.join(str(x) for x in sorted(xids))}"]
