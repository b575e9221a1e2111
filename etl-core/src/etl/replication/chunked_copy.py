"""The apply worker's incremental copies (``[copy] method = "incremental"``): taking tables on, and a chunk of each
between two transactions of the stream. What a chunk means for the stream's changes is ``incremental``'s."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import psycopg
import structlog

from etl.destination.base import ChunkCopier
from etl.errors import ConfigError, EtlError, TableError
from etl.events import EventBatch
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
from etl.postgres.copy_session import ChunkSnapshot, ChunkTable
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

    def submit(self, batch: EventBatch) -> None: ...

    def table_failed(self, table_id: TableId, error: TableError) -> None: ...


@dataclass
class ChunkedCopies:
    ctx: WorkerContext
    stream: Stream
    wait_written: Callable[[], object]
    """Waits until the write in flight is durable (``BatchWriter.wait``)."""

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

    def close(self) -> None:
        self._comparisons.close()

    def _order(self, schema: TableSchema, key: tuple[str, ...]) -> KeyOrder:
        return IntegerKeyOrder() if integer_key(schema) else SourceKeyOrder(self._comparisons, schema.id, key)

    # -- the stream's hooks --------------------------------------------------------------------------------
    def began(self, xid: int) -> None:
        for copy in self.copies.values():
            copy.streamed.add(xid)

    def prepared(self, batch: EventBatch) -> EventBatch:
        for copy in list(self.copies.values()):
            try:
                batch = copy.filtered(batch)
            except TableError as exc:  # its key column is gone: the table errors, and is copied again
                self.copies.pop(copy.table_id, None)
                self.stream.table_failed(copy.table_id, exc)
                batch = batch.without_table(copy.table_id)
        return batch

    def forget(self, table_id: TableId) -> None:
        """The table leaves the copy (copied again from the start, or out of the publication)."""
        self.copies.pop(table_id, None)

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
        """Whether a table under copy may take its next chunk now."""
        now = time.monotonic()
        return any(now >= self._not_before.get(t, 0.0) for t in self.copies)

    def copy_chunks(self) -> None:
        """A chunk of each table under copy whose turn it is; between two transactions of the stream."""
        now = time.monotonic()
        for copy in list(self.copies.values()):
            if now >= self._not_before.get(copy.table_id, 0.0):
                self._copy_chunk(copy)

    def _copy_chunk(self, copy: IncrementalCopy) -> None:
        ctx, table_id = self.ctx, copy.table_id
        table = self.stream.tables.get(table_id)
        if table is None:
            return
        state = ctx.states.get(table_id)
        if state is None or state.kind is not TableStateKind.COPYING:  # errored meanwhile
            self.copies.pop(table_id, None)
            return
        if copy.finished or self.stream.position < self._resume_at.get(table_id, Lsn.ZERO):
            self._end_or_later(copy, table)
            return
        limit = ctx.config.copy_.chunk_rows
        try:
            if copy.barrier is not None and self._barrier_holds(copy, table):
                self._later(table_id)  # a transaction running when the copy began is still running
                return
            self.stream.flush()  # the stream's changes so far go first (a copy leaves out keys not copied yet)
            self.wait_written()  # and are durable before a chunk's mark after them is recorded
            chunk = KeyChunk(copy.key, copy.after, limit, copy.where)
            copier = ctx.destination
            if isinstance(copier, ChunkCopier) and copy.adds_new_keys:
                written = self._copy_on_destination(copier, copy, table, chunk)
            else:
                written = self._copy_here(copy, table, chunk)
        except TableError as exc:
            if copy.where is not None:
                self._backfill_failed(copy, table, exc)
                return
            self.copies.pop(table_id, None)
            self.stream.table_failed(table_id, exc)
            return
        except EtlError as exc:
            log.warning("copying a chunk failed; copying it again shortly", table=str(table.name), error=exc.message)
            self._later(table_id)
            return
        if written is None:
            return
        rows, last, copy.finished = written
        state = ctx.states.get(table_id)
        if state is None or state.kind is not TableStateKind.COPYING:  # its write errored the table
            self.copies.pop(table_id, None)
            return
        copy.after, copy.rows = copy.after if last is None else last, copy.rows + rows
        ctx.metrics.copied_rows.labels(str(table.name)).inc(rows)
        self._record(copy, copy.finished)
        if copy.finished:
            self._end_or_later(copy, table)

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

    def _copy_here(
        self, copy: IncrementalCopy, table: PublishedTable, chunk: KeyChunk
    ) -> tuple[int, KeyValue | None, bool] | None:
        """Read the chunk in this process and write it as a batch, at its place in the stream: its row count, the key
        the next chunk follows and whether it was the last, durable; ``None`` when it is to be read again later."""
        ctx, schema = self.ctx, self.ctx.schemas.current(copy.table_id)
        connections = ctx.config.copy_.connections
        config, row_filter = ctx.config.source, table.row_filter
        read, found, rows, keys, chunk = copy_chunk(config, schema, row_filter, chunk, connections=connections)
        moved = self._key_moved(copy, found, table)
        if moved or self._missed(copy, read, table) or self._standbys_lack(copy, read, table):
            return None
        last = keys.last
        copy.mark = copy.mark.next(self.stream.position, rows.num_rows)
        batch = copy.chunk_batch(schema, rows, copy.mark, datetime.now(UTC))
        copy.will_write(last)
        self._record(copy, finished=False)  # the mark and the chunk's last key, before the chunk (see ChunkMark)
        self.stream.submit(batch)
        self.wait_written()  # durable before the copy's position moves past it
        copy.read_before = read.wal
        return rows.num_rows, chunk.reach(last), chunk.ends_copy(rows.num_rows)

    def _copy_on_destination(
        self, copier: ChunkCopier, copy: IncrementalCopy, table: PublishedTable, chunk: KeyChunk
    ) -> tuple[int, KeyValue | None, bool] | None:
        """Plan the chunk and have the destination read and write it (``ChunkCopier``): as ``_copy_here``."""
        ctx, schema = self.ctx, self.ctx.schemas.current(copy.table_id)
        parts = ctx.config.copy_.connections
        with plan_chunk(ctx.config.source, schema, table.row_filter, chunk, parts=parts) as planned:
            read, found, keys, plan, chunk = planned
            moved = self._key_moved(copy, found, table)
            if moved or self._missed(copy, read, table) or self._standbys_lack(copy, read, table):
                return None
            copy.mark = copy.mark.next(self.stream.position, keys.rows)
            copy.will_write(keys.last)
            self._record(copy, finished=False)
            written = copier.copy_chunk(plan, (copy.mark.position, copy.mark.ordinal), ctx.stop) if keys.rows else 0
        if written != keys.rows:
            raise EtlError(
                f"{table.name}: the destination wrote {written} rows of a chunk of {keys.rows}",
                hint="a fault of the destination plugin's copy_chunk; the chunk is copied again",
            )
        copy.read_before = read.wal
        return keys.rows, chunk.reach(keys.last), chunk.ends_copy(keys.rows)

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

    def _missed(self, copy: IncrementalCopy, read: ChunkSnapshot, table: PublishedTable) -> bool:
        """Whether a chunk read in ``read`` misses a transaction already streamed: then it is read again."""
        if not copy.misses(read.snapshot):
            return False
        log.info("a chunk did not see a transaction already streamed; reading it again", table=str(table.name))
        self._later(copy.table_id)
        return True

    def _standbys_lack(self, copy: IncrementalCopy, read: ChunkSnapshot, table: PublishedTable) -> bool:
        """Whether the standbys a failover may promote still lack what a chunk read (``etl.postgres.standby_slots``)
        after a short wait: then it is read again later rather than written."""
        ctx = self.ctx
        lacking = wait_for_standbys(
            ctx.config.source, read.standby_slots, read.wal, what=str(table.name), stop=ctx.stop, timeout=STANDBY_WAIT_S
        )
        if not lacking:
            return False
        log.warning(
            "a chunk is read again later: a standby in synchronized_standby_slots lacks what it read",
            table=str(table.name),
            standbys=lacking,
        )
        self._later(copy.table_id)
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
