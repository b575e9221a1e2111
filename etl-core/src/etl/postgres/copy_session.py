"""One COPY session of a copy: ``COPY ... TO STDOUT (FORMAT csv)`` of ctid ranges, parsed into Arrow batches.

Each COPY row arrives as one protocol message, so rows are gathered as raw CSV bytes into a buffer of
``batch_rows`` rows and handed to ``pyarrow.csv`` in one piece (every value read as a string; unquoted
empty fields are NULL, quoted ones are ''), then each column is converted by ``codecs.decode_text_column``.
No Python object is made per value. Copies run inside ``REPEATABLE READ`` transactions that import
the slot's exported snapshot, so every range sees the table as of the slot's consistent point.

No wait on the server is unbounded: connecting is bounded by ``connect_timeout``, and every later wait
by ``read_timeout`` (a server that sends nothing for that long, a frozen one say, counts as a lost
connection: ``TransientError``). Every wait also watches the caller's ``stop`` event and gives up
within ``POLL`` seconds once it is set, raising ``CopyStopped``.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Final, TypeAlias, TypeVar

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import structlog
from psycopg import pq
from psycopg.errors import error_from_result
from psycopg.pq.abc import PGconn, PGresult

from etl.config import PostgresConnection
from etl.copy_plan import CopyStopped, CtidRange
from etl.errors import EtlError, SourceError, TableError, TransientError
from etl.key_chunk import KeyChunk
from etl.key_sql import KeyValue, parse_key
from etl.lsn import Lsn
from etl.postgres import generators
from etl.postgres.catalog import WAL_INSERTED
from etl.postgres.codecs import arrow_field, decode_text_column
from etl.postgres.connection import check_pinned, connection_error, conninfo_string
from etl.postgres.errors import passes
from etl.postgres.generators import PQGen
from etl.postgres.standby_slots import SETTING as STANDBY_SLOTS
from etl.postgres.standby_slots import parse_setting
from etl.postgres.waiting import POLL, Expired, Waiter
from etl.postgres.xid_snapshot import XidSnapshot
from etl.schema import TableId, TableName, TableSchema, quote_ident, quote_literal

log = structlog.get_logger(__name__)

T = TypeVar("T")

MAX_BATCH_BYTES: Final = 64 * 1024 * 1024
"""A batch is cut early when its CSV text reaches this size (wide rows)."""
COPY_READ_TIMEOUT_S: Final = 300.0
"""How long a copy connection waits for the server to send (or take) anything before it counts as lost.

A COPY streams rows as its scan finds them, so a healthy server goes quiet this long only when a row
filter rejects every row of a very long stretch of a table, or the COPY waits for a lock (behind an
``ALTER TABLE``, say); either way the copy is retried. A frozen or vanished server is noticed here.
"""
IMPORTED_LOCK_TIMEOUT_MS: Final = 1000
"""How long a session that imported a snapshot waits for a table's lock: the exporter holds it, so only a request
queued behind the exporter's (which waits for the exporter to end) can hold it back; waiting would not end."""
LOCK_NOT_AVAILABLE: Final = "55P03"

_PARSE_OPTIONS: Final = pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False)
_CONVERT_OPTIONS_ARGS: Final[dict[str, Any]] = {
    "null_values": [""],
    "strings_can_be_null": True,
    "quoted_strings_can_be_null": False,
}


class ConsumerGone(Exception):
    """The copy's own consumer went away (the iterator was closed): stop quietly."""


@dataclass(frozen=True)
class ChunkSnapshot:
    """What a chunk was read in: its snapshot, and a WAL position past the commit of every transaction the snapshot
    saw committed (the stream may deliver such a transaction after the chunk: the chunk holds its changes)."""

    snapshot: XidSnapshot
    wal: Lsn
    standby_slots: tuple[str, ...] = ()
    """The standbys' slots that must hold ``wal`` before the chunk is written (``etl.postgres.standby_slots``)."""

    QUERY: ClassVar[str] = (
        f"SELECT pg_catalog.pg_current_snapshot()::text || ' ' || {WAL_INSERTED}::text || ' ' || {STANDBY_SLOTS}"
    )
    """Takes the snapshot, then reads the WAL position: as one statement's, in that order."""

    @classmethod
    def parse(cls, text: str) -> ChunkSnapshot:
        snapshot, wal, slots = text.split(" ", 2)
        return cls(XidSnapshot.parse(snapshot), Lsn.parse(wal), parse_setting(slots))


ChunkKey: TypeAlias = tuple[tuple[str, int], ...]
"""A table's replica identity key as an incremental copy orders by it: each column's name and type OID."""


@dataclass(frozen=True)
class ChunkTable:
    """The table a chunk reads, found by its OID in the chunk's own transaction (``find``): a rename, or a swap of
    names, between two chunks neither reads another table nor stops the copy."""

    name: TableName
    """Its name now, which the transaction holds a lock on the table under: it stays the table's until the end."""
    key: ChunkKey
    """Its key in the chunk's snapshot (``ChunkKey``)."""

    @classmethod
    def find(cls, session: CopySession, table_id: TableId, doing: str) -> ChunkTable:
        """Find the table by OID (its name and key as of the snapshot), lock it by that name, and check that the
        name is still the table's (a swap of names since the snapshot: ``TransientError``, the chunk is read
        again later)."""
        found = session.scalar(_table_query(table_id), doing)
        if not found:
            raise TransientError(
                f"the table of oid {table_id} is gone from the source", hint="it was dropped; it leaves the copy"
            )
        schema, name, key = json.loads(found)
        table = cls(TableName(schema, name), tuple((column, int(type_oid)) for column, type_oid in key or ()))
        try:
            session._command(f"LOCK TABLE ONLY {table.name.quoted()} IN ACCESS SHARE MODE", doing)
        except psycopg.errors.UndefinedTable:
            now = ""  # no table of that name any more
        except psycopg.Error as exc:
            raise _copy_error(exc, session.config, doing) from None
        else:
            regclass = f"pg_catalog.to_regclass({quote_literal(table.name.quoted())})"
            now = session.scalar(f"SELECT coalesce({regclass}::oid::text, '')", doing)
        if now != str(table_id):
            raise TransientError(
                f"{table.name} was renamed while a chunk of it was read",
                hint="the chunk is read again, from the table of that OID under its new name",
            )
        return table


def _table_query(table_id: TableId) -> str:
    """The name and replica identity key (as ``catalog.table_schema`` finds it) of table ``table_id``, as JSON."""
    eq = "OPERATOR(pg_catalog.=)"
    key = (
        "SELECT pg_catalog.json_agg(pg_catalog.json_build_array(a.attname, a.atttypid::int) ORDER BY a.attnum)"
        " FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a"
        f" ON a.attrelid {eq} i.indrelid AND a.attnum {eq} ANY (i.indkey)"
        f" WHERE i.indrelid {eq} c.oid"
        f" AND CASE WHEN c.relreplident {eq} 'i' THEN i.indisreplident ELSE i.indisprimary END"
    )
    return (
        f"SELECT coalesce((SELECT pg_catalog.json_build_array(n.nspname, c.relname, ({key}))::text"
        " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
        f" WHERE c.oid OPERATOR(pg_catalog.=) {int(table_id)}), '')"
    )


@dataclass(frozen=True)
class ChunkKeys:
    """What a chunk's first connection finds of its keys (``KeyChunk.split_query``)."""

    rows: int
    last: KeyValue | None
    """Its last key; ``None`` when it holds no row."""
    bounds: list[KeyValue]
    """Where ``KeyChunk.split`` splits it."""

    @classmethod
    def parse(cls, text: str) -> ChunkKeys:
        rows, last, bounds = json.loads(text)
        return cls(int(rows), parse_key(last[0]) if last else None, [parse_key(b) for b in bounds])

    @classmethod
    def of_integer_rows(cls, rows: pa.Table, column: str) -> ChunkKeys:
        """What ``parse`` would find of a chunk's ``rows`` (in key order, not split) keyed by one integer
        ``column`` (``key_sql.integer_key``)."""
        last = (str(rows.column(column)[-1].as_py()),) if rows.num_rows else None
        return cls(rows.num_rows, last, [])


class CopySession:
    """One connection in a read-only ``REPEATABLE READ`` transaction on the snapshot; copies ranges.

    It speaks libpq's asynchronous API directly, so that every wait on the server (connecting
    included) is a ``select`` that watches ``stop`` (the session's owner went away: ``ConsumerGone``),
    ``cancel`` (the caller's stop request: ``CopyStopped``) and ``read_timeout``.
    """

    def __init__(
        self,
        config: PostgresConnection,
        snapshot: str | None,
        stop: threading.Event | None = None,
        *,
        cancel: threading.Event | None = None,
        read_timeout: float = COPY_READ_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.stop = stop
        self.cancel = cancel
        self.read_timeout = read_timeout
        self.pgconn, self._waiter = self._connect()
        try:
            # A session that copies several ranges sits idle in its transaction between them while its owner
            # writes what it read: the source's idle_in_transaction_session_timeout must not end it.
            self._command(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL idle_in_transaction_session_timeout = 0",
                "start the copy",
            )
            if snapshot is not None:
                self._command(import_snapshot(snapshot), "start the copy")
                # The exporting session holds the table's share lock, so one of ours waits only behind a request
                # that waits for the exporter (an ALTER TABLE, say): a cycle Postgres cannot see, which would stall
                # the table for everyone until the read timeout. Give way at once instead (``_copy_error``).
                self._command(f"SET LOCAL lock_timeout = {IMPORTED_LOCK_TIMEOUT_MS}", "start the copy")
        except psycopg.Error as exc:
            self.close()
            if exc.sqlstate in ("22023", "42704"):  # invalid parameter value / undefined object (18+)
                raise SourceError(
                    f"cannot import snapshot {snapshot!r} on {config.describe()}: {exc.diag.message_primary}",
                    hint="the exporting replication connection must stay open and idle until the copy has started",
                ) from None
            raise _copy_error(exc, config, "start the copy") from None
        except BaseException:
            self.close()
            raise

    def _connect(self) -> tuple[PGconn, Waiter]:
        """Connect within ``connect_timeout``, giving up early when asked to stop."""
        config = self.config
        pgconn: PGconn = pq.PGconn.connect_start(conninfo_string(config).encode())
        waiter = Waiter(pgconn)
        try:
            try:
                step = generators.connect(pgconn)
                waiter.run(step, deadline=time.monotonic() + config.connect_timeout, check=self._checking(None))
            except Expired:
                raise psycopg.OperationalError(f"timeout expired after {config.connect_timeout}s") from None
            check_pinned(pgconn, config)
        except psycopg.OperationalError as exc:
            waiter.close()
            pgconn.finish()
            raise connection_error(config, exc, retried=True) from None
        except BaseException:
            waiter.close()
            pgconn.finish()
            raise
        pgconn.nonblocking = 1
        pgconn.notice_handler = _log_notice
        return pgconn, waiter

    def scalar(self, query: str, doing: str) -> str:
        """The one value ``query`` returns, as text."""
        try:
            results = self._run(generators.execute(self.pgconn, query), None)
        except psycopg.OperationalError as exc:
            raise _copy_error(exc, self.config, doing) from None
        result = results[-1]
        if result.status != pq.ExecStatus.TUPLES_OK:
            raise _copy_error(error_from_result(result), self.config, doing)
        value = result.get_value(0, 0)
        assert value is not None
        return bytes(value).decode()

    def _command(self, command: str, doing: str) -> None:
        """Run one statement that returns no rows."""
        try:
            results = self._run(generators.execute(self.pgconn, command), None)
        except psycopg.OperationalError as exc:
            raise _copy_error(exc, self.config, doing) from None
        for result in results:
            if result.status != pq.ExecStatus.COMMAND_OK:
                raise error_from_result(result)

    def close(self) -> None:
        self._waiter.close()
        self.pgconn.finish()

    def __enter__(self) -> CopySession:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def copy(
        self,
        schema: TableSchema,
        source: TableName,
        ctid_range: CtidRange | None,
        row_filter: str | None,
        batch_rows: int,
        *,
        key_chunk: KeyChunk | None = None,
    ) -> Iterator[pa.RecordBatch]:
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        check_columns(schema)
        names = [c.name for c in schema.columns]
        output = pa.schema([arrow_field(c) for c in schema.columns])
        convert = pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()), **_CONVERT_OPTIONS_ARGS)
        query = _copy_query(names, source, ctid_range, row_filter, key_chunk)
        halt = threading.Event()
        chunks = _ReadAhead(self._csv_chunks(query, batch_rows, f"copy {source}", halt), halt, f"copy-read-{source}")
        try:
            for chunk in chunks:
                self._check_stop(None)
                # one parse block per chunk: one Arrow chunk per column, so no concatenation afterwards
                options = pacsv.ReadOptions(column_names=names, block_size=len(chunk) + 1)
                text = pacsv.read_csv(pa.py_buffer(chunk), options, _PARSE_OPTIONS, convert)
                arrays = [decode_text_column(column, text.column(i)) for i, column in enumerate(schema.columns)]
                yield from pa.Table.from_arrays(arrays, schema=output).combine_chunks().to_batches()
        finally:
            chunks.close()

    def _csv_chunks(
        self, query: str, batch_rows: int, doing: str, halt: threading.Event
    ) -> Generator[bytearray, None, None]:
        """Run ``query`` (a COPY TO STDOUT) and yield its rows in buffers of up to ``batch_rows`` rows."""
        pgconn = self.pgconn
        try:
            result = self._run(generators.execute(pgconn, query), halt)[0]
            if result.status != pq.ExecStatus.COPY_OUT:
                raise _copy_error(error_from_result(result), self.config, doing)
            ended = False
            while not ended:
                rows, ended = self._run(generators.copy_rows(pgconn, batch_rows, MAX_BATCH_BYTES), halt)
                if rows:
                    yield rows
            final = generators.end_results(pgconn)
            if final is not None and final.status != pq.ExecStatus.COMMAND_OK:
                raise _copy_error(error_from_result(final), self.config, doing)
        except psycopg.OperationalError as exc:
            raise _copy_error(exc, self.config, doing) from None

    def _run(self, step: PQGen[T], halt: threading.Event | None) -> T:
        """Run a libpq step, checking the stop flags while it waits.

        ``TransientError`` when the server stays silent for ``read_timeout`` seconds.
        """
        try:
            return self._waiter.run(step, silence=self.read_timeout, check=self._checking(halt))
        except Expired:
            raise _silent_server(self.config, self.read_timeout) from None

    def _checking(self, halt: threading.Event | None) -> Callable[[], None]:
        return lambda: self._check_stop(halt)

    def _check_stop(self, halt: threading.Event | None) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise CopyStopped(f"the copy from {self.config.describe()} was stopped")
        if (halt is not None and halt.is_set()) or (self.stop is not None and self.stop.is_set()):
            raise ConsumerGone


def _silent_server(config: PostgresConnection, read_timeout: float) -> TransientError:
    return TransientError(
        f"the copy connection to {config.describe()} got nothing from the server for {read_timeout:g}s;"
        " counting it as lost",
        hint="check that the source server is running and responsive; the copy is retried",
    )


def import_snapshot(name: str) -> str:
    """The statement that makes a repeatable-read transaction see the exported snapshot ``name`` (its first)."""
    return f"SET TRANSACTION SNAPSHOT {quote_literal(name)}"


def _log_notice(result: PGresult) -> None:
    """Pass a server notice on to the log (libpq would print it to stderr)."""
    severity = (result.error_field(pq.DiagnosticField.SEVERITY_NONLOCALIZED) or b"NOTICE").decode()
    text = (result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b"").decode(errors="replace")
    (log.warning if severity == "WARNING" else log.info)("postgres notice", severity=severity, message=text)


class Unblock:
    """Unblocks a psycopg ``conn`` busy in a call on the server when ``stop`` is set (``CopyStopped``) or the
    call takes longer than ``read_timeout`` (``TransientError``), by shutting down the socket under it.

    For the few calls made through psycopg, whose waits cannot watch an event of ours.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        config: PostgresConnection,
        stop: threading.Event | None,
        read_timeout: float,
        doing: str,
    ) -> None:
        self.conn, self.config, self.stop, self.read_timeout, self.doing = conn, config, stop, read_timeout, doing
        self.fired: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="copy-unblock", daemon=True)

    def __enter__(self) -> Unblock:
        if self.stop is not None and self.stop.is_set():
            raise CopyStopped(f"the copy from {self.config.describe()} was stopped")
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join()
        if self.fired is not None:  # whatever the call raised (or not), the connection is gone
            raise self.fired from None
        if isinstance(exc, psycopg.OperationalError):
            raise _copy_error(exc, self.config, self.doing) from None

    def _watch(self) -> None:
        deadline = time.monotonic() + self.read_timeout
        while not self._done.wait(POLL):
            if self.stop is not None and self.stop.is_set():
                self.fired = CopyStopped(f"the copy from {self.config.describe()} was stopped")
            elif time.monotonic() >= deadline:
                self.fired = _silent_server(self.config, self.read_timeout)
            else:
                continue
            with socket.socket(fileno=os.dup(self.conn.pgconn.socket)) as sock:
                sock.shutdown(socket.SHUT_RDWR)  # the blocked call sees the connection end
            return


class _ReadAhead:
    """Runs a COPY read loop in its own thread, so that parsing one chunk overlaps reading the next.

    ``halt`` (set by ``close``) makes the loop give up at its next wait.
    """

    _END: Final = object()

    def __init__(self, chunks: Generator[bytearray, None, None], halt: threading.Event, name: str) -> None:
        self._chunks = chunks
        self._halt = halt
        self._queue: queue.Queue[object] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[bytearray]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, bytearray)
            yield item

    def close(self) -> None:
        self._halt.set()
        self._thread.join()

    def _run(self) -> None:
        last: object = self._END
        try:
            for chunk in self._chunks:
                if not self._put(chunk):
                    return
        except BaseException as exc:
            last = exc
        finally:
            self._chunks.close()
        self._put(last)

    def _put(self, item: object) -> bool:
        return put_unless_halted(self._queue, item, self._halt)


def put_unless_halted(into: queue.Queue[object], item: object, halt: threading.Event) -> bool:
    """Put ``item`` into a bounded queue unless ``halt`` is set first (checked every ``POLL`` seconds); return
    whether it was put."""
    while not halt.is_set():
        try:
            into.put(item, timeout=POLL)
            return True
        except queue.Full:
            pass
    return False


def check_columns(schema: TableSchema) -> None:
    if not schema.columns:
        raise TableError(
            f"{schema.name} has no columns to copy", hint="add a column, or leave it out of the publication"
        )


def _copy_query(
    names: list[str],
    source: TableName,
    ctid_range: CtidRange | None,
    row_filter: str | None,
    chunk: KeyChunk | None = None,
) -> str:
    where = _conditions(ctid_range, row_filter, chunk)
    # ONLY: rows of inheritance children are published (and copied) as those tables
    select = f"SELECT {', '.join(quote_ident(n) for n in names)} FROM ONLY {source.quoted()}"
    order = chunk.order() if chunk is not None else ""
    return f"COPY ({select}{' WHERE ' + where if where else ''}{order}) TO STDOUT (FORMAT csv)"


def _conditions(ctid_range: CtidRange | None, row_filter: str | None, chunk: KeyChunk | None) -> str:
    conditions = [
        ctid_range.predicate() if ctid_range is not None else None,
        f"({row_filter})" if row_filter else None,
        chunk.predicate() if chunk is not None else None,
    ]
    return " AND ".join(c for c in conditions if c)


def _copy_error(exc: psycopg.Error, config: PostgresConnection, doing: str) -> EtlError:
    sqlstate = exc.sqlstate or ""
    detail = (exc.diag.message_primary or str(exc)).strip()
    message = f"{doing} on {config.describe()} failed: {detail}"
    if passes(exc):
        return TransientError(message, hint="the connection to the source was lost or refused; the copy is retried")
    if sqlstate == LOCK_NOT_AVAILABLE:  # behind another session's lock request: see IMPORTED_LOCK_TIMEOUT_MS
        return TransientError(
            f"{message}: another session asks for a lock on the table that the copy's snapshot holds",
            hint="the copy gives way to it (an ALTER TABLE, say) and is read again shortly",
        )
    if sqlstate in ("42P01", "42703"):  # undefined table / column: the table changed under the copy
        return TableError(message, hint="the table changed while it was being copied; copy it again")
    if sqlstate == "42501" and "row-level security" in detail:  # row_security = off: see SESSION_SETTINGS
        return TableError(
            f"{message}: a copy would hold only the rows the policies show the role",
            hint=f'let the role read every row: ALTER ROLE "{config.user}" BYPASSRLS (as a superuser), or ALTER TABLE'
            " ... DISABLE ROW LEVEL SECURITY; then etl resync the table",
        )
    return TableError(message, hint="see the server's message; fix the table or the publication, then copy again")
