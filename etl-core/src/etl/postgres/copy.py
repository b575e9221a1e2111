"""A table's copy: its ranges planned (``plan_copy``), read over several connections at once (``copy_table``), or
read by whoever holds the plan (``read_ranges``); and an incremental copy's chunks, read here (``copy_chunk``) or
planned for readers elsewhere (``plan_chunk``). Each read runs in a ``copy_session.CopySession``: ``COPY ... TO
STDOUT`` into Arrow, with every wait bounded.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Final

import pyarrow as pa
import structlog

from etl.config import PostgresConnection
from etl.copy_plan import RANGES_PER_CONNECTION, CopyPlan, CopyRange, CopyStopped
from etl.key_chunk import KeyChunk
from etl.key_sql import integer_key
from etl.postgres.catalog import PublishedTable, ctid_ranges, table_bytes
from etl.postgres.codecs import arrow_field
from etl.postgres.connection import connect
from etl.postgres.copy_session import (
    COPY_READ_TIMEOUT_S,
    ChunkKeys,
    ChunkSnapshot,
    ChunkTable,
    ConsumerGone,
    CopySession,
    Unblock,
    check_columns,
    put_unless_halted,
)
from etl.postgres.waiting import POLL
from etl.schema import TableName, TableSchema, quote_literal

log = structlog.get_logger(__name__)

MIN_PART_ROWS: Final = 1000
"""The fewest rows per connection worth splitting an incremental copy's chunk for."""
EXPORT: Final = "SELECT pg_catalog.pg_export_snapshot()"


def copy_chunk(
    config: PostgresConnection,
    schema: TableSchema,
    row_filter: str | None,
    chunk: KeyChunk,
    *,
    connections: int = 1,
) -> tuple[ChunkSnapshot, ChunkTable, pa.Table, ChunkKeys, KeyChunk]:
    """Read one chunk of table ``schema.id`` in a short ``REPEATABLE READ`` transaction of its own: the snapshot it
    read in, the table as it found it by OID (``ChunkTable``: by its name now), its rows, as a table of
    ``schema``'s columns in key order, what it found of its keys (``ChunkKeys``: its last key in the source's text
    form) and the chunk as read (a backfill's ``bounded``).

    With ``connections`` above 1, a chunk of at least ``MIN_PART_ROWS`` rows per connection is split by key into
    that many parts, read at once: the first connection exports its snapshot for the others to import, so every
    part sees the same rows one connection would, and no snapshot outlives the chunk's read."""
    output = pa.schema([arrow_field(c) for c in schema.columns])
    with CopySession(config, None) as session:
        snapshot = ChunkSnapshot.parse(session.scalar(ChunkSnapshot.QUERY, "read a chunk"))  # takes it
        table = ChunkTable.find(session, schema.id, "read a chunk")
        source = table.name
        chunk = _bounded(session, source, chunk, "read a chunk")
        step = chunk.limit // max(1, connections)
        split = connections > 1 and step >= MIN_PART_ROWS
        keys = None
        if split or not integer_key(schema):  # an integer key's last value is read off the rows: no extra scan
            query = chunk.split_query(source, row_filter, step if split else max(1, chunk.limit))
            keys = ChunkKeys.parse(session.scalar(query, "read a chunk's keys"))
        parts = chunk.split(keys.bounds, step) if keys is not None and split else [chunk]
        if keys is None or len(parts) == 1:
            batches = list(session.copy(schema, source, None, row_filter, max(1, chunk.limit), key_chunk=chunk))
            rows = pa.Table.from_batches(batches, schema=output)
            return snapshot, table, rows, keys or ChunkKeys.of_integer_rows(rows, chunk.columns[0]), chunk
        exported = session.scalar(EXPORT, "read a chunk")
        with ThreadPoolExecutor(len(parts) - 1, thread_name_prefix=f"chunk-{source}") as pool:
            others = [
                pool.submit(_read_part, config, exported, schema, source, row_filter=row_filter, part=p)
                for p in parts[1:]
            ]
            batches = list(session.copy(schema, source, None, row_filter, parts[0].limit, key_chunk=parts[0]))
            for part in others:
                batches.extend(part.result())
    return snapshot, table, pa.Table.from_batches(batches, schema=output), keys, chunk


@contextmanager
def plan_chunk(
    config: PostgresConnection,
    schema: TableSchema,
    row_filter: str | None,
    chunk: KeyChunk,
    *,
    parts: int,
) -> Iterator[tuple[ChunkSnapshot, ChunkTable, ChunkKeys, CopyPlan, KeyChunk]]:
    """Plan one chunk of table ``schema.id`` for readers elsewhere (a destination's workers, ``read_ranges``): the
    snapshot its first connection took, the table as it found it by OID (``ChunkTable``), what it found of its keys,
    a plan of up to ``parts`` key ranges of at least ``MIN_PART_ROWS`` rows each, in that snapshot, exported,
    with about the bytes they hold, and the chunk as planned (a backfill's ``bounded``). The snapshot can be
    imported until the block ends, so the plan must be read inside it; so long, the first connection's lock keeps
    the table's name the one the plan reads it by."""
    with CopySession(config, None) as session:
        snapshot = ChunkSnapshot.parse(session.scalar(ChunkSnapshot.QUERY, "plan a chunk"))
        table = ChunkTable.find(session, schema.id, "plan a chunk")
        source = table.name
        chunk = _bounded(session, source, chunk, "plan a chunk")
        step = max(MIN_PART_ROWS, chunk.limit // max(1, parts))
        keys = ChunkKeys.parse(session.scalar(chunk.split_query(source, row_filter, step), "plan a chunk"))
        size = int(session.scalar(_rows_bytes(source, keys.rows), "plan a chunk"))
        exported = session.scalar(EXPORT, "plan a chunk")
        ranges = tuple(CopyRange(source, None, part) for part in chunk.split(keys.bounds, step))
        yield snapshot, table, keys, CopyPlan(config, exported, schema, ranges, row_filter, size), chunk


def _bounded(session: CopySession, source: TableName, chunk: KeyChunk, doing: str) -> KeyChunk:
    """A backfill's chunk bounded to the keys of ``limit`` rows (``KeyChunk.reach_query``); a copy's unchanged."""
    return chunk if chunk.where is None else chunk.bounded(session.scalar(chunk.reach_query(source), doing))


def _rows_bytes(source: TableName, rows: int) -> str:
    """About the bytes of ``rows`` rows of ``source``: its size (TOAST included) times the share of its rows they
    are, as the planner last counted them (all of it, when it never counted or counted fewer)."""
    # Operators qualified (as everywhere a type of theirs could be outmatched): see SESSION_SETTINGS' search_path.
    share = f"{int(rows)}::numeric OPERATOR(pg_catalog./) greatest(c.reltuples::numeric, {int(rows)}, 1)"
    table = f"{quote_literal(source.quoted())}::regclass"
    return (
        f"SELECT pg_catalog.round(pg_catalog.pg_table_size(c.oid) OPERATOR(pg_catalog.*) ({share}))::bigint::text"
        f" FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) {table}"
    )


def _read_part(
    config: PostgresConnection,
    snapshot: str,
    schema: TableSchema,
    source: TableName,
    *,
    row_filter: str | None,
    part: KeyChunk,
) -> list[pa.RecordBatch]:
    with CopySession(config, snapshot) as session:
        return list(session.copy(schema, source, None, row_filter, part.limit, key_chunk=part))


def read_ranges(
    plan: CopyPlan,
    indexes: Iterable[int],
    *,
    batch_rows: int = 65536,
    stop: threading.Event | None = None,
    read_timeout: float = COPY_READ_TIMEOUT_S,
) -> Generator[pa.RecordBatch, None, None]:
    """Read the ranges ``indexes`` of ``plan``, one after another, on one connection of their own: Arrow batches
    of the schema's columns in order, at most ``batch_rows`` rows each (an empty range yields none), of the rows
    that pass the row filter. One ``REPEATABLE READ`` transaction imports the snapshot (``None``: a fresh one) for
    all of them; a server backend per range would cost a connection, and the catalog lookups of its first query,
    each time. Setting ``stop`` makes it raise ``CopyStopped`` within a second; ``read_timeout``: see the module."""
    with CopySession(plan.connection, plan.snapshot, cancel=stop, read_timeout=read_timeout) as session:
        for index in indexes:
            piece = plan.ranges[index]
            pieces = session.copy(
                plan.schema, piece.source, piece.ctid_range, plan.row_filter, batch_rows, key_chunk=piece.key_chunk
            )
            yield from pieces


def plan_copy(
    config: PostgresConnection,
    schema: TableSchema,
    table: PublishedTable,
    snapshot: str | None,
    parts: int,
    *,
    stop: threading.Event | None = None,
    read_timeout: float = COPY_READ_TIMEOUT_S,
) -> CopyPlan:
    """Split ``table`` (a partitioned table: each of its leaves) into up to ``parts`` ranges per source table."""
    check_columns(schema)
    with connect(config, retried=True) as conn, Unblock(conn, config, stop, read_timeout, "plan the copy"):
        ranges = tuple(CopyRange(source, rng) for source in table.sources for rng in ctid_ranges(conn, source, parts))
        size = table_bytes(conn, table.sources)
    return CopyPlan(config, snapshot, schema, ranges, table.row_filter, size)


def copy_table(
    config: PostgresConnection,
    schema: TableSchema,
    table: PublishedTable,
    snapshot: str | None,
    connections: int,
    *,
    batch_rows: int = 65536,
    stop: threading.Event | None = None,
    read_timeout: float = COPY_READ_TIMEOUT_S,
) -> Generator[pa.RecordBatch, None, None]:
    """Copy every row of ``table`` (a partitioned table from its leaves) over ``connections`` connections.

    The heap of each source table is split into ctid ranges that worker threads, each with its own
    connection and the imported ``snapshot``, copy in parallel; batches are yielded as they come (in no
    particular order), each row exactly once. A bounded queue holds back workers when the consumer is
    slow. An error in any worker stops the others and is raised here; closing the iterator early stops
    them too. Keep the connection that exported ``snapshot`` idle until the copy is done. Without a
    snapshot each connection reads its own, so only a single-connection copy is then consistent.
    Setting ``stop`` makes it raise ``CopyStopped`` within a second (a frozen server included);
    ``read_timeout``: see the module.
    """
    if connections < 1:
        raise ValueError(f"connections must be at least 1, got {connections}")
    parts = copy_parts(connections)
    plan = plan_copy(config, schema, table, snapshot, parts, stop=stop, read_timeout=read_timeout)
    if not plan.ranges:  # a partitioned table without partitions
        return
    workers = min(connections, len(plan.ranges))
    log.info("copying table", table=str(table.name), ranges=len(plan.ranges), connections=workers)
    if workers <= 1:
        with CopySession(config, snapshot, cancel=stop, read_timeout=read_timeout) as session:
            for piece in plan.ranges:
                yield from session.copy(schema, piece.source, piece.ctid_range, table.row_filter, batch_rows)
        return
    yield from _ParallelCopy(plan, workers=workers, batch_rows=batch_rows, cancel=stop, read_timeout=read_timeout).run()


def copy_parts(connections: int) -> int:
    """Ranges to plan per source table for ``connections`` parallel copiers (several each, so uneven ranges
    still spread evenly)."""
    return 1 if connections == 1 else connections * RANGES_PER_CONNECTION


class _ParallelCopy:
    """Worker threads pull ranges from a shared list and push batches into one bounded queue."""

    _DONE: Final = object()

    def __init__(
        self,
        plan: CopyPlan,
        *,
        workers: int,
        batch_rows: int,
        cancel: threading.Event | None,
        read_timeout: float,
    ) -> None:
        self.plan, self.schema = plan, plan.schema
        self.batch_rows, self.cancel, self.read_timeout = batch_rows, cancel, read_timeout
        self.tasks: queue.SimpleQueue[CopyRange] = queue.SimpleQueue()
        for piece in plan.ranges:
            self.tasks.put(piece)
        self.out: queue.Queue[object] = queue.Queue(maxsize=2 * workers)
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._work, name=f"copy-{plan.schema.name}-{i}", daemon=True)
            for i in range(workers)
        ]

    def run(self) -> Iterator[pa.RecordBatch]:
        for thread in self.threads:
            thread.start()
        running = len(self.threads)
        try:
            while running:
                if self.cancel is not None and self.cancel.is_set():
                    raise CopyStopped(f"the copy of {self.schema.name} was stopped")
                try:
                    item = self.out.get(timeout=POLL)
                except queue.Empty:
                    continue
                if item is self._DONE:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    assert isinstance(item, pa.RecordBatch)
                    yield item
        finally:
            self.stop.set()
            for thread in self.threads:
                thread.join()

    def _work(self) -> None:
        try:
            plan = self.plan
            with CopySession(
                plan.connection, plan.snapshot, self.stop, cancel=self.cancel, read_timeout=self.read_timeout
            ) as session:
                while not self.stop.is_set():
                    try:
                        piece = self.tasks.get_nowait()
                    except queue.Empty:
                        break
                    pieces = session.copy(plan.schema, piece.source, piece.ctid_range, plan.row_filter, self.batch_rows)
                    for batch in pieces:
                        if not self._put(batch):
                            return
        except ConsumerGone:
            pass
        except BaseException as exc:
            self._put(exc)
        finally:
            self._put(self._DONE)

    def _put(self, item: object) -> bool:
        return put_unless_halted(self.out, item, self.stop)
