"""The replication connection: slots, START_REPLICATION and standby feedback on ``psycopg.pq``.

psycopg 3 has no replication API, so this drives libpq through ``psycopg.pq.PGconn`` in
non-blocking mode: the libpq steps are ``generators``, run by a ``waiting.Waiter`` whose every wait is a
``select`` with the GIL released. This class keeps the commands and the connection's state.

A ``ReplicationConnection`` belongs to one thread at a time.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal

import psycopg
import structlog
from psycopg import pq
from psycopg.conninfo import conninfo_attempts, make_conninfo
from psycopg.errors import error_from_result
from psycopg.pq.abc import PGconn, PGresult

from etl.config import PostgresConnection
from etl.errors import ConfigError, EtlError, SourceError, TransientError
from etl.lsn import Lsn
from etl.postgres import generators
from etl.postgres.connection import check_pinned, connection_error, conninfo_params
from etl.postgres.errors import CONFIGURATION_LIMIT_EXCEEDED, passes
from etl.postgres.frames import Keepalive, XLogData, parse_frame, status_update
from etl.postgres.pgtime import now_pg_us
from etl.postgres.slot_state import SlotNotFoundError
from etl.postgres.waiting import Expired, Waiter
from etl.schema import quote_ident, quote_literal

log = structlog.get_logger(__name__)

_SLOT_NAME: Final = re.compile(r"^[a-z0-9_]{1,63}$")
_SEND_TIMEOUT: Final = 30.0  # seconds a status update may wait for room in the socket buffer


@dataclass(frozen=True)
class SystemInfo:
    system_id: str
    timeline: int
    xlogpos: Lsn
    dbname: str | None


@dataclass(frozen=True)
class SlotInfo:
    name: str
    consistent_point: Lsn
    snapshot_name: str | None
    """The exported snapshot (``snapshot="export"``); valid until the next command on the connection."""


_told_unsynchronized = threading.Event()
"""That failover slots are off for want of ``synchronized_standby_slots`` is said once per process."""


def choose_protocol(server_version: int) -> tuple[int, bool]:
    """The pgoutput ``(proto_version, streaming)`` to use with a server: 2 with streaming from 14 on, else 1."""
    return (2, True) if server_version >= 140000 else (1, False)


def check_slot_name(name: str) -> str:
    if not _SLOT_NAME.match(name):
        raise ConfigError(
            f"invalid replication slot name {name!r}",
            hint="slot names are 1-63 characters of lower-case letters, digits and underscores",
        )
    return name


class ReplicationConnection:
    """A ``replication=database`` connection (the session settings and TLS/keepalives from the config)."""

    def __init__(self, pgconn: PGconn, config: PostgresConnection, waiter: Waiter) -> None:
        self._pgconn = pgconn
        self._config = config
        self._waiter = waiter
        self._flush_pending = False
        self._streaming = False
        self._closed = False
        self._skipped: PublicationMissingError | None = None
        pgconn.notice_handler = self._on_notice

    # -- lifecycle -----------------------------------------------------------------------------------
    @classmethod
    def connect(cls, config: PostgresConnection, settings: dict[str, str] | None = None) -> ReplicationConnection:
        """Open a replication connection; ``settings`` adds session GUCs (e.g. ``wal_sender_timeout``).

        Each host (of several, ``host = "pg1,pg2"``) gets its own ``connect_timeout``, as libpq gives it in a
        blocking connect: libpq's non-blocking connect has none, so a first host that does not answer (a dead
        primary's address) would use up the whole time and the next host would never be tried.
        """
        params = conninfo_params(config, {"replication": "database"}, settings)
        errors: list[str] = []
        try:
            attempts = conninfo_attempts(params)
        except psycopg.OperationalError as exc:
            raise connection_error(config, exc, "open a replication connection to") from None
        for attempt in attempts:
            pgconn: PGconn = pq.PGconn.connect_start(make_conninfo("", **attempt).encode())
            waiter = Waiter(pgconn)
            try:
                try:
                    waiter.run(generators.connect(pgconn), deadline=time.monotonic() + config.connect_timeout)
                except Expired:
                    raise psycopg.OperationalError(
                        f"connection to server at {attempt.get('host')!r}, port {attempt.get('port')} failed: timeout"
                        f" expired after {config.connect_timeout}s"
                    ) from None
            except psycopg.OperationalError as exc:
                waiter.close()
                pgconn.finish()
                errors.append(str(exc).strip())
                continue
            try:
                check_pinned(pgconn, config)
            except BaseException:
                waiter.close()
                pgconn.finish()
                raise
            pgconn.nonblocking = 1
            log.debug("replication connection opened", target=config.describe(), server_version=pgconn.server_version)
            return cls(pgconn, config, waiter)
        failed = psycopg.OperationalError("\n".join(errors))
        raise connection_error(config, failed, "open a replication connection to") from None

    def close(self) -> None:
        """Close the connection (idempotent); the server ends the stream and frees the slot."""
        if not self._closed:
            self._closed = True
            self._streaming = False
            self._waiter.close()
            self._pgconn.finish()

    @property
    def closed(self) -> bool:
        return self._closed or self._pgconn.status == pq.ConnStatus.BAD

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("streaming" if self._streaming else "open")
        return f"<ReplicationConnection {self._config.describe()} {state}>"

    @property
    def server_version(self) -> int:
        """The server's version number, e.g. 150004."""
        return self._pgconn.server_version

    # -- commands ------------------------------------------------------------------------------------
    def execute(self, command: str) -> list[tuple[str | None, ...]]:
        """Run one replication or SQL command; return the text rows of its result."""
        if self._streaming:
            raise SourceError("the replication connection is streaming; it accepts no more commands")
        try:
            results = self._waiter.run(generators.execute(self._pgconn, command))
        except psycopg.OperationalError as exc:
            raise self._lost(exc) from None
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise self._error(result, command.split(None, 1)[0])
        last = results[-1]
        if last.status == pq.ExecStatus.COPY_BOTH:
            self._streaming = True
            return []
        return [
            tuple(None if (v := last.get_value(r, c)) is None else v.decode() for c in range(last.nfields))
            for r in range(last.ntuples)
        ]

    def identify_system(self) -> SystemInfo:
        system_id, timeline, xlogpos, dbname = self.execute("IDENTIFY_SYSTEM")[0]
        assert system_id is not None and timeline is not None and xlogpos is not None
        return SystemInfo(system_id, int(timeline), Lsn.parse(xlogpos), dbname)

    def create_slot(
        self,
        name: str,
        *,
        snapshot: Literal["export", "use", "nothing"] = "nothing",
        temporary: bool = False,
        failover: bool = False,
    ) -> SlotInfo:
        """Create a logical pgoutput slot; ``failover`` (Postgres 17+, see ``failover_slots``) has standbys keep it.

        ``"export"`` exports a snapshot that other sessions import with ``SET TRANSACTION SNAPSHOT``
        (inside ``REPEATABLE READ``) to see the data exactly as of ``consistent_point``. The snapshot
        lives only until this connection runs its next command (``START_REPLICATION`` included), so
        keep the connection idle until every importer has imported it. ``"use"`` makes the current
        transaction of this connection use it (``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`` first).
        """
        check_slot_name(name)
        kind = " TEMPORARY" if temporary else ""
        if failover and self.server_version < 170000:
            raise ValueError("failover slots need Postgres 17 or later")
        if self.server_version >= 150000:
            options = f"SNAPSHOT '{snapshot}'" + (", FAILOVER true" if failover else "")
            command = f"CREATE_REPLICATION_SLOT {name}{kind} LOGICAL pgoutput ({options})"
        else:
            option = {"export": "EXPORT_SNAPSHOT", "use": "USE_SNAPSHOT", "nothing": "NOEXPORT_SNAPSHOT"}[snapshot]
            command = f"CREATE_REPLICATION_SLOT {name}{kind} LOGICAL pgoutput {option}"
        slot_name, consistent_point, snapshot_name, _plugin = self.execute(command)[0]
        assert slot_name is not None and consistent_point is not None
        log.info("replication slot created", slot=slot_name, consistent_point=consistent_point, snapshot=snapshot)
        return SlotInfo(slot_name, Lsn.parse(consistent_point), snapshot_name)

    def set_failover(self, name: str, failover: bool) -> None:
        """Make an existing slot a failover slot, or no longer one (Postgres 17+)."""
        check_slot_name(name)
        self.execute(f"ALTER_REPLICATION_SLOT {name} (FAILOVER {'true' if failover else 'false'})")
        log.info("replication slot changed", slot=name, failover=failover)

    def failover_slots(self, wanted: bool) -> bool:
        """Whether the pipeline's slots here are failover slots: ``wanted`` (the setting), on a primary of Postgres
        17+ that holds logical changes back until its standbys have them (``synchronized_standby_slots``).

        Without that setting a promoted standby may lack changes the pipeline already wrote, and a synced slot
        would go on past them on the new timeline, skipping what the new primary commits there: such a slot is
        not made a failover slot, so that a failover ends in the slot-lost stop instead.
        """
        if not wanted or self.server_version < 170000:
            return False
        in_recovery, standbys, physical = self.execute(
            "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('synchronized_standby_slots'),"
            " EXISTS (SELECT FROM pg_catalog.pg_replication_slots WHERE slot_type = 'physical')"
        )[0]
        if in_recovery == "t":
            return False
        if not standbys:
            if not _told_unsynchronized.is_set():
                _told_unsynchronized.set()
                # A primary with physical slots has standbys, whose promotion would lose the pipeline's slots:
                # worth a warning. A lone primary has nothing to fail over to: a line at info is enough.
                tell = log.warning if physical == "t" else log.info
                tell(
                    "slots are not failover slots: the primary's synchronized_standby_slots is empty",
                    hint="set synchronized_standby_slots to the standbys' physical slots (docs/configuration.md,"
                    " Source failover), or [pipeline] failover_slots = false to silence this",
                )
            return False
        return True

    def drop_slot(self, name: str, wait: bool = True) -> None:
        """Drop a slot; with ``wait`` wait for a connection still using it to end. Missing slot: ``SourceError``."""
        check_slot_name(name)
        self.execute(f"DROP_REPLICATION_SLOT {name}{' WAIT' if wait else ''}")
        log.info("replication slot dropped", slot=name)

    def drop_slot_if_exists(self, name: str, wait: bool = True) -> bool:
        """Drop a slot if it exists; return whether one was dropped."""
        try:
            self.drop_slot(name, wait)
        except SlotNotFoundError:
            return False
        return True

    def start_replication(  # noqa: PLR0917 - the positional order is the command's
        self,
        slot: str,
        start_lsn: Lsn,
        publications: Sequence[str],
        protocol_version: int,
        streaming: bool,
        messages: bool = True,
    ) -> None:
        """Start streaming pgoutput changes from ``slot`` (see ``choose_protocol``); then ``read`` and ``send_status``.

        ``messages`` asks for logical decoding messages (``pg_logical_emit_message``; Postgres 14+).
        """
        check_slot_name(slot)
        if not publications:
            raise ValueError("start_replication needs at least one publication")
        if streaming and protocol_version < 2:
            raise ValueError("streaming of in-progress transactions needs protocol_version >= 2")
        if (streaming or messages) and self.server_version < 140000:
            raise SourceError(
                f"Postgres {self.server_version // 10000} cannot stream in-progress transactions or send messages",
                hint="use choose_protocol() and messages=False with servers older than 14",
            )
        self._check_publications(publications)
        names = ",".join(quote_ident(p) for p in publications)
        options = [f"proto_version '{protocol_version}'", f"publication_names {quote_literal(names)}"]
        if streaming:
            options.append("streaming 'on'")
        if messages:
            options.append("messages 'true'")
        self.execute(f"START_REPLICATION SLOT {slot} LOGICAL {start_lsn} ({', '.join(options)})")
        log.info(
            "replication started", slot=slot, start_lsn=str(start_lsn), proto=protocol_version, streaming=streaming
        )

    def _check_publications(self, publications: Sequence[str]) -> None:
        # Postgres 18 merely warns about a missing publication and streams nothing; fail clearly instead
        wanted = ", ".join(quote_literal(p) for p in publications)
        found = {
            row[0] for row in self.execute(f"SELECT pubname FROM pg_catalog.pg_publication WHERE pubname IN ({wanted})")
        }
        missing = [p for p in publications if p not in found]
        if missing:
            raise SourceError(
                f"publication {', '.join(missing)} does not exist in {self._config.describe()}",
                hint="create it on the source: CREATE PUBLICATION <name> FOR TABLE <tables> (or FOR ALL TABLES)",
            )

    # -- streaming -----------------------------------------------------------------------------------
    def read(self, timeout: float) -> XLogData | Keepalive | None:
        """The next message, waiting at most ``timeout`` seconds; ``None`` when none came in time."""
        if self._skipped is not None:
            raise self._skipped
        deadline = time.monotonic() + timeout
        try:
            while True:
                step = generators.copy_data(self._pgconn, self._flush_pending)
                data, self._flush_pending = self._waiter.run(step, deadline=deadline)
                if (frame := self._frame(data)) is not None:
                    return frame
        except Expired:
            return None
        except psycopg.OperationalError as exc:
            raise self._lost(exc) from None

    def poll(self) -> XLogData | Keepalive | None:
        """The next message if one was already received (by libpq or the socket), without waiting;
        ``None`` otherwise. For reading a burst: one ``read`` that waits, then ``poll`` until ``None``.

        Called once per change, so it reads libpq's buffer itself: a ``generators`` step per call cost the
        decoding thread about 0.6 s of CPU per million changes (bench_streaming.py).
        """
        pgconn = self._pgconn
        try:
            while True:
                nbytes, data = pgconn.get_copy_data(1)
                if nbytes == 0:  # nothing buffered: take what the socket holds (it is non-blocking), look again
                    pgconn.consume_input()
                    nbytes, data = pgconn.get_copy_data(1)
                    if nbytes == 0:
                        return None
                if (frame := self._frame(data if nbytes > 0 else None)) is not None:
                    return frame
        except psycopg.OperationalError as exc:
            raise self._lost(exc) from None

    def _frame(self, data: memoryview | bytes | None) -> XLogData | Keepalive | None:
        """The frame of a CopyData message; ``None`` for an unknown kind (logged and skipped)."""
        if data is None:
            raise self._stream_ended()
        frame = parse_frame(data)
        if frame is None:
            log.warning("unknown replication message ignored", tag=chr(data[0]))
        return frame

    def send_status(self, write: Lsn, flush: Lsn, apply: Lsn, reply: bool = False) -> None:
        """Send a Standby Status Update: ``flush`` is what the slot may forget (its confirmed_flush_lsn).

        Sending never blocks for long: what the socket does not take now goes out during ``read``.
        """
        message = status_update(write, flush, apply, now_pg_us(), reply)
        step = generators.put_copy_data(self._pgconn, message)
        try:
            self._flush_pending = self._waiter.run(step, deadline=time.monotonic() + _SEND_TIMEOUT)
        except Expired:
            raise TransientError(
                f"replication connection to {self._config.describe()} accepts no data; status update not sent",
                hint="the network or the server is stalled; the connection is re-opened",
            ) from None
        except psycopg.OperationalError as exc:
            raise self._lost(exc) from None

    # -- internals -----------------------------------------------------------------------------------
    def _on_notice(self, result: PGresult) -> None:
        text = _log_notice(result)
        # Postgres 18 warns and goes on decoding without a publication it cannot find at a WAL position
        # (dropped, perhaps created again later): the changes there are skipped. Stop instead, as 15 does.
        if text.startswith("skipped loading publication"):
            self._skipped = PublicationMissingError(
                f"replication on {self._config.describe()}: the server {text}, so it skips the changes there",
                hint="create it on the source: CREATE PUBLICATION <name> FOR TABLE <tables>",
            )

    def _stream_ended(self) -> EtlError:
        self._streaming = False
        result = generators.end_results(self._pgconn)
        if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
            return self._error(result, "replication")
        return TransientError(
            f"the server at {self._config.describe()} ended the replication stream"
            + (f": {generators.error_message(self._pgconn)}" if self._pgconn.status == pq.ConnStatus.BAD else ""),
            hint="the server may be shutting down; replication resumes after a reconnect",
        )

    def _lost(self, exc: BaseException) -> EtlError:
        self._streaming = False
        return TransientError(
            f"lost the replication connection to {self._config.describe()}: {str(exc).strip()}",
            hint="replication resumes after a reconnect; check the server and the network if it persists",
        )

    def _error(self, result: PGresult, doing: str) -> EtlError:
        error = error_from_result(result)
        return replication_error(error, self._config.describe(), doing)


class PublicationMissingError(SourceError):
    """The server found no publication of that name where it decoded the stream."""


def replication_error(error: psycopg.Error, target: str, doing: str) -> EtlError:
    """Translate a server error of a replication command into an ``EtlError`` with a hint."""
    sqlstate = error.sqlstate or ""
    detail = (error.diag.message_primary or str(error)).strip()
    if error.diag.message_detail:
        detail += f" ({error.diag.message_detail.strip()})"
    message = f"{doing} on {target} failed: {detail}"
    lowered = detail.lower()
    if sqlstate == "42704" and "replication slot" in lowered:
        return SlotNotFoundError(message, hint="the slot was dropped; the pipeline must create it and copy again")
    if sqlstate == "42704" and "publication" in lowered:
        return PublicationMissingError(
            message, hint="create it on the source: CREATE PUBLICATION <name> FOR TABLE <tables>"
        )
    if sqlstate == "55006":  # object_in_use
        return TransientError(message, hint="another process uses this slot; stop it, or wait until it lets go")
    if sqlstate == "55000" and ("invalidated" in lowered or "can no longer" in lowered):
        return SourceError(
            message,
            hint="the slot was invalidated (its WAL was removed, see max_slot_wal_keep_size); drop it and copy the"
            " tables again (pipeline.invalidated_slot = 'recreate')",
        )
    if "logical decoding cannot be used while in recovery" in lowered:  # before Postgres 16
        return SourceError(
            message,
            hint="the source is a standby, and logical decoding on a standby needs Postgres 16 or later: point"
            " [source] at the primary, or upgrade",
        )
    if sqlstate == "55000" and "wal_level" in lowered:
        where = "the primary" if "primary" in lowered else "the source"
        return SourceError(message, hint=f"set wal_level = logical on {where} and restart it")
    if sqlstate == CONFIGURATION_LIMIT_EXCEEDED:
        return SourceError(message, hint="raise max_replication_slots / max_wal_senders, or drop unused slots")
    if sqlstate == "42710":
        return SourceError(message, hint="the slot exists already; drop it or reuse it")
    if sqlstate == "42501":
        return SourceError(message, hint="the role needs the REPLICATION attribute")
    if passes(error):
        return TransientError(message, hint="the server is restarting, unreachable or short of resources; retried")
    return SourceError(message)


def _log_notice(result: PGresult) -> str:
    """Pass a server notice on to the log; return its text."""
    severity = (result.error_field(pq.DiagnosticField.SEVERITY_NONLOCALIZED) or b"NOTICE").decode()
    text = (result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b"").decode(errors="replace")
    emit = log.warning if severity == "WARNING" else log.info
    emit("postgres notice", severity=severity, message=text)
    return text
