"""The apply worker's incremental copies (``[copy] method = "incremental"``): taking tables on, and a chunk of each
between two transactions of the stream. What a chunk means for the stream's changes is ``incremental``'s."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import psycopg
import structlog

from etl.destination.base import ChunkCopier
from etl.errors import ConfigError, EtlError, TableError
from etl.events import EventBatch
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
from etl.postgres.copy_session import ChunkSnapshot, KeyChunk
from etl.postgres.predicate import predicate_rows
from etl.postgres.standby_slots import wait_for_standbys
from etl.postgres.xid_snapshot import XidSnapshot
from etl.replication.context import WorkerContext
from etl.replication.incremental import NO_MARK, ChunkMark, IncrementalCopy, incremental_key
from etl.replication.tablesync import empty_table
from etl.schema import TableId
from etl.store.base import CopyProgress, TableState, TableStateKind

log = structlog.get_logger(__name__)

RETRY_S: Final = 2.0
"""How long a copy waits after a chunk it could not read or use, or while its barrier holds."""
STANDBY_WAIT_S: Final = 5.0
"""Seconds a chunk waits for the standby slots to have what it read before it is read again later."""
SNAPSHOT_QUERY: Final = "SELECT pg_catalog.pg_current_snapshot()::text"


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
        the table gets a snapshot copy instead (it has no one-column integer key)."""
        ctx, table = self.ctx, self.stream.tables[table_id]
        with connect(ctx.config.source) as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            generated = publication_options(conn, ctx.publication).generated_columns
            schema = table_schema(conn, table_id, table.column_list, include_generated=generated)
            key = incremental_key(schema, table.partitioned)
            if key is None:
                if table_id not in self._snapshot_copies:
                    self._snapshot_copies.add(table_id)
                    log.info("table copied by snapshot: it has no one-column integer key", table=str(table.name))
                return False
            barrier = _snapshot(conn)
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
        self.copies[table_id] = IncrementalCopy(
            table_id, key, None, 0, NO_MARK, barrier, estimate=estimate, started_at=now
        )
        log.info("copying a table in chunks", table=str(table.name), key=key, chunk_rows=ctx.config.copy_.chunk_rows)
        return True

    def backfill(self, table_id: TableId, where: str) -> None:
        """Begin a backfill of a copied table (``etl resync --where``): chunks of the rows ``where`` picks, upserted
        into its destination table as it is, while its changes stream on."""
        ctx, table = self.ctx, self.stream.tables[table_id]
        key = incremental_key(ctx.schemas.current(table_id), table.partitioned)
        if key is None:
            log.warning("a backfill needs a one-column integer key; resync the whole table", table=str(table.name))
            return
        try:
            with connect(ctx.config.source) as conn:
                barrier = _snapshot(conn)
                estimate = predicate_rows(conn, table.name, where)
        except ConfigError as exc:  # the table changed since the request was checked
            log.warning("a backfill's predicate no longer fits its table", table=str(table.name), error=exc.message)
            return
        now = datetime.now(UTC)
        resume_after = NO_MARK.to_json(None, where)  # durable before its first chunk: a restart goes on with it
        ctx.store.record_copy_progress(table_id, CopyProgress(0, estimate, now, now, False, resume_after))
        ctx.states.set(table_id, TableState(TableStateKind.COPYING))
        self.copies[table_id] = IncrementalCopy(
            table_id, key, None, 0, NO_MARK, barrier, where=where, estimate=estimate, started_at=now
        )
        log.info("backfilling a table in chunks", table=str(table.name), key=key, where=where, estimate=estimate)

    def resume(self, table_id: TableId) -> None:
        """Go on with a table's incremental copy after the last chunk a run wrote (at a start)."""
        ctx, table = self.ctx, self.stream.tables[table_id]
        key = incremental_key(ctx.schemas.current(table_id), table.partitioned)
        progress = ctx.store.get_copy_progress(table_id)
        if key is None or progress is None:  # its key changed since: copy it again from the start
            ctx.states.set(table_id, TableState.init())
            return
        with connect(ctx.config.source) as conn:
            barrier = _snapshot(conn)
            row = conn.execute(f"SELECT {WAL_POSITION}::text").fetchone()
            assert row is not None
            wal = Lsn.parse(row[0])
        recorded = None if progress.resume_after is None else ChunkMark.from_json(progress.resume_after)
        after, mark, where, upto, read_before = recorded or (None, NO_MARK, None, None, Lsn.ZERO)
        # A run that died may have written past its stored progress (a destination writes, then progress is
        # stored): the next chunk waits until the stream is past all it may have written, and so goes after it.
        self._resume_at[table_id] = wal
        self.copies[table_id] = IncrementalCopy(
            table_id,
            key,
            after,
            progress.rows,
            mark,
            barrier,
            where=where,
            estimate=progress.estimate,
            started_at=progress.started_at,
            upto=upto,
            read_before=read_before,
            finished=progress.finished,
        )
        what = "going on with a table's backfill in chunks" if where else "going on with a table's copy in chunks"
        log.info(what, table=str(table.name), after=after, rows=progress.rows, where=where)

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
            if copy.barrier is not None:
                with connect(ctx.config.source) as conn:
                    if not _snapshot(conn).finished_since(copy.barrier):
                        self._later(table_id)  # a transaction running when the copy began is still running
                        return
                copy.barrier = None
            self.stream.flush()  # the stream's changes so far go first (a copy leaves out keys not copied yet)
            self.wait_written()  # and are durable before a chunk's mark after them is recorded
            chunk = KeyChunk(copy.key, copy.after, limit, copy.where)
            copier = ctx.destination
            if isinstance(copier, ChunkCopier) and copy.adds_new_keys:
                written = self._copy_on_destination(copier, copy, table, chunk)
            else:
                written = self._copy_here(copy, table, chunk)
        except TableError as exc:
            self.copies.pop(table_id, None)
            self.stream.table_failed(table_id, exc)
            return
        except EtlError as exc:
            log.warning("copying a chunk failed; copying it again shortly", table=str(table.name), error=exc.message)
            self._later(table_id)
            return
        if written is None:
            return
        rows, last = written
        state = ctx.states.get(table_id)
        if state is None or state.kind is not TableStateKind.COPYING:  # its write errored the table
            self.copies.pop(table_id, None)
            return
        copy.after, copy.rows = copy.after if last is None else last, copy.rows + rows
        ctx.metrics.copied_rows.labels(str(table.name)).inc(rows)
        copy.finished = rows < limit
        self._record(copy, copy.finished)
        if copy.finished:
            self._end_or_later(copy, table)

    def _end_or_later(self, copy: IncrementalCopy, table: PublishedTable) -> None:
        """End a finished copy once the stream is past every transaction its last chunk saw committed (until then
        their inserts are upserts: ``IncrementalCopy.read_before``); else look again later."""
        if not copy.finished or self.stream.position < copy.read_before:
            self._later(copy.table_id)
            return
        self.copies.pop(copy.table_id, None)
        self.ctx.states.set(copy.table_id, TableState(TableStateKind.READY))
        what = "table backfilled" if copy.where else "table copied in chunks"
        log.info(what, table=str(table.name), rows=copy.rows)

    def _copy_here(
        self, copy: IncrementalCopy, table: PublishedTable, chunk: KeyChunk
    ) -> tuple[int, int | None] | None:
        """Read the chunk in this process and write it as a batch, at its place in the stream: its row count and
        last key, durable; ``None`` when it is to be read again later."""
        ctx, schema = self.ctx, self.ctx.schemas.current(copy.table_id)
        connections = ctx.config.copy_.connections
        read, rows = copy_chunk(ctx.config.source, schema, table.name, table.row_filter, chunk, connections=connections)
        if self._missed(copy, read, table) or self._standbys_lack(copy, read, table):
            return None
        last = copy.chunk_after(rows) if rows.num_rows else None
        copy.mark = copy.mark.next(self.stream.position, rows.num_rows)
        batch = copy.chunk_batch(schema, rows, copy.mark, datetime.now(UTC))
        copy.will_write(last)
        self._record(copy, finished=False)  # the mark and the chunk's last key, before the chunk (see ChunkMark)
        self.stream.submit(batch)
        self.wait_written()  # durable before the copy's position moves past it
        copy.read_before = read.wal
        return rows.num_rows, last

    def _copy_on_destination(
        self, copier: ChunkCopier, copy: IncrementalCopy, table: PublishedTable, chunk: KeyChunk
    ) -> tuple[int, int | None] | None:
        """Plan the chunk and have the destination read and write it (``ChunkCopier``): as ``_copy_here``."""
        ctx, schema = self.ctx, self.ctx.schemas.current(copy.table_id)
        parts = ctx.config.copy_.connections
        with plan_chunk(ctx.config.source, schema, table.name, table.row_filter, chunk, parts=parts) as planned:
            read, keys, plan = planned
            if self._missed(copy, read, table) or self._standbys_lack(copy, read, table):
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
        return keys.rows, keys.last

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

    def _record(self, copy: IncrementalCopy, finished: bool) -> None:
        now = datetime.now(UTC)
        resume_after = copy.mark.to_json(copy.after, copy.where, copy.upto, copy.read_before)
        progress = CopyProgress(copy.rows, copy.estimate, copy.started_at or now, now, finished, resume_after)
        self.ctx.store.record_copy_progress(copy.table_id, progress)

    def _later(self, table_id: TableId) -> None:
        self._not_before[table_id] = time.monotonic() + RETRY_S


def check_backfill(conn: psycopg.Connection[Any], table: PublishedTable, where: str) -> int:
    """The planner's estimate of the rows a backfill of ``table`` with ``where`` copies; ``EtlError`` saying why
    there can be none (no one-column integer key to order its chunks by, a predicate the table cannot take)."""
    schema = table_schema(conn, table.id, table.column_list)
    if incremental_key(schema, table.partitioned) is None:
        raise EtlError(
            f"--where needs a table with a one-column integer primary key to copy in chunks; {table.name} has none",
            hint=f"copy the whole table again instead: etl resync --table {table.name}",
        )
    return predicate_rows(conn, table.name, where)


def _snapshot(conn: psycopg.Connection[Any]) -> XidSnapshot:
    row = conn.execute(SNAPSHOT_QUERY).fetchone()
    assert row is not None
    return XidSnapshot.parse(row[0])
