"""The non-blocking libpq steps, as generators that wait for nothing themselves.

Each step yields the socket events it needs (``READ``, ``WRITE`` or both), is sent the events that came, and
returns its result: connecting, flushing output, collecting a command's results, and reading CopyData
(rows of a COPY TO STDOUT, frames of a replication stream). ``waiting.Waiter`` runs them, with a deadline
and a stop check, so every wait releases the GIL in a ``select``. (Blocking libpq calls hold the GIL
while they wait and would freeze every other thread of the process.) The steps raise
``psycopg.OperationalError`` when the connection fails.
"""

from __future__ import annotations

import selectors
from collections.abc import Generator
from typing import Final, TypeVar

import psycopg
from psycopg import pq
from psycopg.pq.abc import PGconn, PGresult

T = TypeVar("T")
PQGen = Generator[int, int, T]
"""Yields the events to wait for, is sent the events that came, returns ``T``."""

READ: Final = selectors.EVENT_READ
WRITE: Final = selectors.EVENT_WRITE
READ_WRITE: Final = READ | WRITE


def connect(pgconn: PGconn) -> PQGen[None]:
    """Finish a connection started with ``PGconn.connect_start``."""
    while True:
        if pgconn.status == pq.ConnStatus.BAD:
            raise psycopg.OperationalError(error_message(pgconn))
        status = pgconn.connect_poll()
        if status == pq.PollingStatus.OK:
            return
        if status == pq.PollingStatus.FAILED:
            raise psycopg.OperationalError(error_message(pgconn))
        yield READ if status == pq.PollingStatus.READING else WRITE


def flush(pgconn: PGconn) -> PQGen[None]:
    """Send all queued output (reading meanwhile, so the server never blocks on a full socket of ours)."""
    while pgconn.flush() == 1:
        yield READ_WRITE
        pgconn.consume_input()


def results(pgconn: PGconn) -> PQGen[list[PGresult]]:
    """The results of the command sent, to its end or to the COPY it starts."""
    collected: list[PGresult] = []
    while True:
        while pgconn.is_busy():
            yield READ
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            return collected
        collected.append(result)
        if result.status in (pq.ExecStatus.COPY_BOTH, pq.ExecStatus.COPY_OUT):
            return collected


def execute(pgconn: PGconn, command: str) -> PQGen[list[PGresult]]:
    """Send one command and return its results (``results``)."""
    pgconn.send_query(command.encode())
    yield from flush(pgconn)
    return (yield from results(pgconn))


def copy_rows(pgconn: PGconn, max_rows: int, max_bytes: int) -> PQGen[tuple[bytearray, bool]]:
    """The next rows of a COPY TO STDOUT, joined, up to ``max_rows`` rows or ``max_bytes``; and whether the
    copy has ended (its final result is then ready: ``end_results``)."""
    get_copy_data = pgconn.get_copy_data
    buffer = bytearray()
    rows = 0
    while True:  # the per-row loop: keep it lean
        nbytes, data = get_copy_data(1)
        if nbytes > 0:
            buffer += data
            rows += 1
            if rows == max_rows or len(buffer) >= max_bytes:
                return buffer, False
        elif nbytes == 0:
            yield READ
            pgconn.consume_input()
        else:
            return buffer, True


def copy_data(pgconn: PGconn, flush_pending: bool) -> PQGen[tuple[memoryview | bytes | None, bool]]:
    """The next CopyData message of a COPY BOTH (a replication stream), ``None`` once the server ended it; and
    whether output is still waiting to go (``flush_pending``: sent while waiting for input)."""
    while True:
        nbytes, data = pgconn.get_copy_data(1)
        if nbytes > 0:
            return data, flush_pending
        if nbytes < 0:
            return None, flush_pending
        if flush_pending:
            flush_pending = pgconn.flush() == 1
        ready = yield READ_WRITE if flush_pending else READ
        if ready & READ:
            pgconn.consume_input()


def put_copy_data(pgconn: PGconn, data: bytes) -> PQGen[bool]:
    """Queue one CopyData message, waiting for room in the output buffer; return whether output is still waiting
    to go (the rest goes out while waiting for input: ``copy_data``)."""
    while pgconn.put_copy_data(data) == 0:  # the output buffer is full
        pgconn.flush()
        yield WRITE
    return pgconn.flush() == 1


def end_results(pgconn: PGconn) -> PGresult | None:
    """The final result of a command whose output has all been read, the rest drained (no waiting)."""
    final = pgconn.get_result()
    while pgconn.get_result() is not None:
        pass
    return final


def error_message(pgconn: PGconn) -> str:
    return pgconn.get_error_message().strip() or "connection failed"
