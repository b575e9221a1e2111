"""The replication connection against a real Postgres: slots, snapshots, streaming, feedback, errors."""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time

import psycopg
import pytest
import structlog
from pydantic import SecretStr

from etl.errors import ConfigError, SourceError, TransientError
from etl.lsn import Lsn
from etl.postgres import replication
from etl.postgres.replication import (
    Keepalive,
    PublicationMissingError,
    ReplicationConnection,
    XLogData,
    choose_protocol,
)
from etl.postgres.slot_state import SlotNotFoundError, SlotState, slot_state
from etl.testing.pipelines import poll
from etl.testing.pytest_plugin import TestDatabase


def start_stream(
    db: TestDatabase, slot: str = "s1", publication: str = "pub", settings: dict[str, str] | None = None
) -> ReplicationConnection:
    """A connection streaming from a fresh slot on ``publication`` (protocol picked for the server)."""
    conn = ReplicationConnection.connect(db.connection(), settings)
    info = conn.create_slot(slot)
    proto, streaming = choose_protocol(conn.server_version)
    conn.start_replication(slot, info.consistent_point, [publication], protocol_version=proto, streaming=streaming)
    return conn


def read_until(conn: ReplicationConnection, tag: bytes, timeout: float = 10.0) -> list[XLogData]:
    """Read XLogData messages until one whose pgoutput tag is ``tag``."""
    got: list[XLogData] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = conn.read(0.5)
        if isinstance(message, XLogData):
            got.append(message)
            if message.payload[:1] == tag:
                return got
        elif isinstance(message, Keepalive) and message.reply_requested:
            conn.send_status(Lsn.ZERO, Lsn.ZERO, Lsn.ZERO)
    raise AssertionError(f"no {tag!r} message within {timeout}s; got {[m.payload[:1] for m in got]}")


def test_identify_system_and_session(pg_database: TestDatabase) -> None:
    with ReplicationConnection.connect(pg_database.connection()) as conn:
        info = conn.identify_system()
        system_id, lsn, version = pg_database.execute(
            "SELECT system_identifier::text, pg_current_wal_lsn()::text, current_setting('server_version_num')::int"
            " FROM pg_control_system()"
        )[0]
        assert info.system_id == system_id
        assert info.timeline == 1
        assert info.dbname == pg_database.name
        assert 0 < info.xlogpos <= Lsn.parse(lsn)
        assert conn.server_version == version
        # the pinned session settings hold on replication connections too
        assert conn.execute("SHOW TimeZone") == [("UTC",)]
        assert conn.execute("SHOW IntervalStyle") == [("postgres",)]
    assert conn.closed
    conn.close()  # idempotent


def test_a_silent_first_host_is_left_after_its_own_timeout(pg_database: TestDatabase) -> None:
    """With several hosts each gets its own connect_timeout: a first host that accepts and never answers (as a dead
    primary's address can) does not use up the time of the next, which is a working server."""
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    real = pg_database.connection()
    config = real.model_copy(
        update={"host": "127.0.0.1,127.0.0.1", "port": [silent.getsockname()[1], real.port], "connect_timeout": 2}
    )
    try:
        began = time.monotonic()
        with ReplicationConnection.connect(config) as conn:
            assert conn.identify_system().dbname == pg_database.name
        assert accepted, "the silent host was tried first"
        assert time.monotonic() - began < 10
    finally:
        silent.close()
        for sock in accepted:
            sock.close()


def test_unsynchronized_failover_slots_warn_only_where_a_standby_could_take_over(pg_database: TestDatabase) -> None:
    """Without ``synchronized_standby_slots`` slots are not made failover slots. That is worth a warning on a
    primary with physical slots (standbys a failover would promote) and only an info line on a lone server."""

    def told() -> list[str]:
        replication._told_unsynchronized.clear()
        with structlog.testing.capture_logs() as logs, ReplicationConnection.connect(pg_database.connection()) as conn:
            assert conn.failover_slots(True) is False
        return [e["log_level"] for e in logs if "not failover slots" in e["event"]]

    if pg_database.major < 17:  # no failover slots before 17: nothing to say
        assert told() == []
        return
    assert told() == ["info"]
    slot = f"standby_{pg_database.name}"
    pg_database.execute("SELECT pg_create_physical_replication_slot(%s)", (slot,))
    try:
        assert told() == ["warning"]
    finally:
        pg_database.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_repr_names_target_but_not_password(pg_database: TestDatabase) -> None:
    config = pg_database.connection().model_copy(update={"password": SecretStr("hunter2-secret")})
    with ReplicationConnection.connect(config) as conn:
        assert "hunter2-secret" not in repr(conn)
        assert pg_database.name in repr(conn)


def test_exported_snapshot_sees_rows_committed_before_the_slot(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int)")
    pg_database.execute("INSERT INTO t SELECT generate_series(1, 3)")
    with ReplicationConnection.connect(pg_database.connection()) as repl:
        slot = repl.create_slot("snap_slot", snapshot="export")
        assert slot.name == "snap_slot" and slot.snapshot_name
        assert slot.consistent_point > 0
        pg_database.execute("INSERT INTO t VALUES (4)")  # committed after the slot: not in the snapshot
        with pg_database.connect() as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute(f"SET TRANSACTION SNAPSHOT '{slot.snapshot_name}'")
            assert reader.execute("SELECT id FROM t ORDER BY id").fetchall() == [(1,), (2,), (3,)]
            reader.execute("COMMIT")
        assert sorted(pg_database.execute("SELECT id FROM t")) == [(1,), (2,), (3,), (4,)]
        # the snapshot lives only until the next command on the exporting connection
        repl.identify_system()
        with pg_database.connect() as late:
            late.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            # Postgres < 18: invalid_parameter_value, 18+: undefined_object
            with pytest.raises((psycopg.errors.InvalidParameterValue, psycopg.errors.UndefinedObject)):
                late.execute(f"SET TRANSACTION SNAPSHOT '{slot.snapshot_name}'")
        with pg_database.connect() as conn:
            state = slot_state(conn, "snap_slot")
            assert state.exists and state.wal_status == "reserved" and not state.invalidated
            assert state.confirmed_flush_lsn == slot.consistent_point
        repl.drop_slot("snap_slot")
        with pg_database.connect() as conn:
            assert slot_state(conn, "snap_slot") == SlotState(exists=False)
            assert SlotState(exists=False).confirmed_flush_lsn == Lsn.ZERO


def test_drop_missing_slot_is_an_error_and_drop_if_exists_is_not(pg_database: TestDatabase) -> None:
    with ReplicationConnection.connect(pg_database.connection()) as repl:
        with pytest.raises(SlotNotFoundError) as info:
            repl.drop_slot("no_such_slot")
        assert "no_such_slot" in str(info.value) and info.value.hint
        assert repl.drop_slot_if_exists("no_such_slot") is False
        repl.create_slot("to_drop")
        assert repl.drop_slot_if_exists("to_drop") is True
        with pg_database.connect() as conn:
            assert not slot_state(conn, "to_drop").exists


def test_temporary_slot_goes_with_the_connection(pg_database: TestDatabase) -> None:
    with ReplicationConnection.connect(pg_database.connection()) as repl:
        repl.create_slot("temp_slot", temporary=True)
        with pg_database.connect() as conn:
            assert slot_state(conn, "temp_slot").exists
    with pg_database.connect() as conn:
        poll(
            lambda: slot_state(conn, "temp_slot"),
            "the temporary slot dropped",
            until=lambda s: not s.exists,
            timeout=10,
            least=0.02,
        )


def test_use_snapshot_in_the_replication_transaction(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int)")
    pg_database.execute("INSERT INTO t VALUES (1)")
    with ReplicationConnection.connect(pg_database.connection()) as repl:
        repl.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        repl.create_slot("use_slot", snapshot="use")
        pg_database.execute("INSERT INTO t VALUES (2)")
        assert repl.execute("SELECT id FROM public.t") == [("1",)]
        repl.execute("COMMIT")
        repl.drop_slot("use_slot")


def test_invalid_slot_name_is_rejected(pg_database: TestDatabase) -> None:
    with ReplicationConnection.connect(pg_database.connection()) as repl, pytest.raises(ConfigError):
        repl.create_slot("Bad-Name; DROP")


def test_streams_changes_made_after_the_slot(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int primary key, v text)")
    pg_database.execute("INSERT INTO t VALUES (0, 'before the slot')")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    with start_stream(pg_database) as repl:
        pg_database.execute("INSERT INTO t VALUES (1, 'hello-stream')")
        messages = read_until(repl, b"C")
        tags = [m.payload[:1] for m in messages]
        assert tags == [b"B", b"R", b"I", b"C"]
        insert = messages[2].payload
        assert b"hello-stream" in insert and b"before the slot" not in b"".join(m.payload for m in messages)
        assert all(m.wal_end >= m.wal_start for m in messages)
        assert abs(messages[0].server_datetime.timestamp() - time.time()) < 60


def test_send_status_moves_confirmed_flush_lsn(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int primary key)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    with start_stream(pg_database) as repl, pg_database.connect() as sql:
        before = slot_state(sql, "s1").confirmed_flush_lsn
        assert before > 0
        pg_database.execute("INSERT INTO t VALUES (1)")
        commit = read_until(repl, b"C")[-1].payload
        end_lsn = Lsn(struct.unpack_from(">Q", commit, 10)[0])  # tag, flags, commit lsn, end lsn
        assert end_lsn > before
        assert slot_state(sql, "s1").confirmed_flush_lsn == before  # nothing confirmed yet
        repl.send_status(end_lsn, end_lsn, end_lsn)
        repl.read(0.2)  # lets a partial flush finish, if any
        state = poll(
            lambda: slot_state(sql, "s1"),
            f"the slot to confirm {end_lsn}",
            until=lambda s: s.confirmed_flush_lsn == end_lsn,
            timeout=10,
            least=0.02,
        )
        assert state.active_pid is not None


def test_reply_request_gets_a_keepalive(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    with start_stream(pg_database) as repl:
        repl.send_status(Lsn.ZERO, Lsn.ZERO, Lsn.ZERO, reply=True)
        message = poll(lambda: repl.read(0.5), "a message", timeout=10, least=0.02)
        assert isinstance(message, Keepalive)
        assert message.wal_end > 0


@pytest.mark.alone  # answers within a one-second wal_sender_timeout
def test_answering_keepalives_keeps_the_stream_alive(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    with start_stream(pg_database, settings={"wal_sender_timeout": "1s"}) as repl:
        requested = 0
        deadline = time.monotonic() + 3.5  # more than three timeouts
        while time.monotonic() < deadline:
            message = repl.read(0.2)
            if isinstance(message, Keepalive) and message.reply_requested:
                requested += 1
                repl.send_status(message.wal_end, message.wal_end, message.wal_end)
        assert requested >= 2
        pg_database.execute("INSERT INTO t VALUES (7)")
        assert read_until(repl, b"C")


def test_unanswered_keepalives_end_the_stream(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    with start_stream(pg_database, settings={"wal_sender_timeout": "1s"}) as repl:
        deadline = time.monotonic() + 15
        with pytest.raises(TransientError) as info:
            while time.monotonic() < deadline:
                repl.read(0.5)  # never answered
        assert pg_database.name in str(info.value) and info.value.hint


@pytest.mark.alone  # times a one-second read
def test_read_does_not_block_other_threads(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    with start_stream(pg_database) as repl:
        while repl.read(0.3) is not None:  # drain the initial keepalives
            pass
        counter = itertools.count()
        stop = threading.Event()

        def spin() -> None:
            while not stop.is_set():
                next(counter)

        thread = threading.Thread(target=spin)
        started = time.monotonic()
        thread.start()
        try:
            while (left := started + 1.0 - time.monotonic()) > 0:  # a keepalive may come meanwhile: no data
                assert not isinstance(repl.read(left), XLogData)
        finally:
            stop.set()
            thread.join()
        assert 0.9 <= time.monotonic() - started < 5
        assert next(counter) > 10_000  # the spinning thread ran while read() waited


def test_missing_slot_is_a_clear_error(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    with ReplicationConnection.connect(pg_database.connection()) as repl:
        proto, streaming = choose_protocol(repl.server_version)
        with pytest.raises(SlotNotFoundError) as info:
            repl.start_replication("gone", Lsn.ZERO, ["pub"], protocol_version=proto, streaming=streaming)
        assert "gone" in str(info.value) and "slot" in str(info.value)
        assert info.value.hint


def test_missing_publication_is_a_clear_error(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    with ReplicationConnection.connect(pg_database.connection()) as repl:
        repl.create_slot("s1")
        with pytest.raises(SourceError) as info:
            repl.start_replication("s1", Lsn.ZERO, ["pub", "nopub"], protocol_version=1, streaming=False)
        assert "nopub" in str(info.value) and "pub," not in str(info.value)
        assert info.value.hint is not None and "CREATE PUBLICATION" in info.value.hint


def test_publication_dropped_while_streaming(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    with start_stream(pg_database) as repl:
        pg_database.execute("DROP PUBLICATION pub")
        pg_database.execute("INSERT INTO t VALUES (1)")
        # Postgres 15 fails on the missing publication; 18 warns and would skip the change: both stop here.
        with structlog.testing.capture_logs() as logs, pytest.raises(PublicationMissingError) as info:
            read_until(repl, b"C")
        assert "pub" in str(info.value)
        assert info.value.hint is not None and "CREATE PUBLICATION" in info.value.hint
        if pg_database.major >= 18:  # the warning also reaches the log
            notices = [e for e in logs if e["event"] == "postgres notice"]
            assert any(e["severity"] == "WARNING" and "pub" in e["message"] for e in notices), notices


def test_terminated_backend_is_transient(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    with start_stream(pg_database) as repl, pg_database.connect() as sql:
        pid = poll(lambda: slot_state(sql, "s1").active_pid, "the slot active", timeout=10, least=0.02)
        sql.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(TransientError):
            for _ in range(100):
                repl.read(0.1)


def test_slot_in_use_is_transient(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    with start_stream(pg_database), ReplicationConnection.connect(pg_database.connection()) as second:
        with pytest.raises(TransientError) as info:
            second.start_replication("s1", Lsn.ZERO, ["pub"], protocol_version=1, streaming=False)
        assert "s1" in str(info.value) and info.value.hint


def test_choose_protocol() -> None:
    assert choose_protocol(130011) == (1, False)
    assert choose_protocol(140000) == (2, True)
    assert choose_protocol(180001) == (2, True)


def test_invalidated_slot(pg_database: TestDatabase) -> None:
    """A slot whose WAL was removed (max_slot_wal_keep_size) reads as invalidated and cannot stream."""
    pg_database.execute("CREATE TABLE t (id int, pad text)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    with ReplicationConnection.connect(pg_database.connection()) as repl:
        repl.create_slot("doomed")
    with pg_database.connect() as sql:
        sql.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        try:
            sql.execute("SELECT pg_reload_conf()")
            poll(
                lambda: sql.execute("SHOW max_slot_wal_keep_size").fetchone(),
                "the setting reloaded",
                until=lambda row: row == ("1MB",),
                timeout=10,
                least=0.02,
            )
            for _ in range(4):  # move past a few WAL segments, then let a checkpoint remove them
                sql.execute("INSERT INTO t SELECT i, repeat('x', 100) FROM generate_series(1, 1000) i")
                sql.execute("SELECT pg_switch_wal()")
            sql.execute("CHECKPOINT")
            state = poll(
                lambda: slot_state(sql, "doomed"),
                "the slot invalidated",
                until=lambda s: s.invalidated,
                timeout=10,
                least=0.02,
            )
        finally:
            sql.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            sql.execute("SELECT pg_reload_conf()")
    assert state.exists and state.wal_status == "lost" and state.invalidation_reason == "wal_removed"
    with ReplicationConnection.connect(pg_database.connection()) as repl:
        with pytest.raises(SourceError) as info:
            repl.start_replication("doomed", Lsn.ZERO, ["pub"], 1, False, messages=False)
            read_until(repl, b"C")
        assert "doomed" in str(info.value)
        assert info.value.hint is not None and "invalidated" in info.value.hint
