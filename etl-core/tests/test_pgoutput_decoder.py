"""The pgoutput decoder on payloads captured from a real Postgres (protocol 1 and 2)."""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from etl.lsn import Lsn
from etl.postgres.pgoutput import (
    STREAMABLE,
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    PgOutputDecoder,
    PgOutputError,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleColumns,
    TupleData,
    TupleWidthError,
    Type,
    Update,
    Value,
    stream_xid,
    tuple_columns,
)
from etl.schema import ReplicaIdentity
from etl.testing.pgoutput_capture import capture

Conn = psycopg.Connection[Any]


def decode_all(payloads: list[bytes], protocol_version: int = 1) -> list[Message]:
    decoder = PgOutputDecoder(protocol_version)
    return [decoder.decode(p) for p in payloads]


def of_type(messages: list[Message], kind: type[Any]) -> list[Any]:
    return [m for m in messages if isinstance(m, kind)]


def scalar(conn: Conn, sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def parse(rows: list[TupleData | None], width: int) -> TupleColumns:
    """``tuple_columns`` over tuples given as ``TupleData`` (``None``: an absent row)."""
    payloads = [None if row is None else row.data for row in rows]
    return tuple_columns(payloads, [0 if row is None else row.start for row in rows], width)


def oid(conn: Conn, regclass: str) -> int:
    return int(scalar(conn, "SELECT %s::regclass::oid", (regclass,)))


def test_transaction_relation_and_insert(pg_database: Any) -> None:
    facts: dict[str, Any] = {}

    def workload(conn: Conn) -> None:
        with conn.transaction():
            conn.execute("INSERT INTO t VALUES (1, 'héllo ☃', NULL, 12.50, ''), (2, NULL, 7, NULL, 'x')")
            facts["xid"] = scalar(conn, "SELECT txid_current()")
        facts["after"] = Lsn.parse(scalar(conn, "SELECT pg_current_wal_lsn()::text"))
        facts["oid"] = oid(conn, "t")
        facts["types"] = conn.execute(
            "SELECT atttypid, atttypmod FROM pg_attribute WHERE attrelid = 't'::regclass AND attnum > 0 ORDER BY attnum"
        ).fetchall()

    started = datetime.now(UTC)
    messages = decode_all(
        capture(
            pg_database,
            workload,
            setup="CREATE TABLE t (id int PRIMARY KEY, a text, b int, n numeric(10, 2), e varchar(5))",
        )
    )
    begin, relation, first, second, commit = messages
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.xid == facts["xid"]
    assert begin.final_lsn == commit.commit_lsn < commit.end_lsn <= facts["after"]
    assert begin.commit_ts == commit.commit_ts
    assert started - timedelta(seconds=5) < commit.commit_ts < datetime.now(UTC) + timedelta(seconds=5)

    assert isinstance(relation, Relation)
    assert (relation.oid, relation.namespace, relation.name) == (facts["oid"], "public", "t")
    assert relation.replica_identity is ReplicaIdentity.DEFAULT
    assert [c.name for c in relation.columns] == ["id", "a", "b", "n", "e"]
    assert [c.flags_key for c in relation.columns] == [True, False, False, False, False]
    assert [(c.type_oid, c.type_modifier) for c in relation.columns] == [tuple(t) for t in facts["types"]]
    assert relation.xid is None

    assert first == Insert(facts["oid"], ("1", "héllo ☃", None, "12.50", ""))
    assert second == Insert(facts["oid"], ("2", None, "7", None, "x"))


def test_updates_deletes_toast_and_old_rows(pg_database: Any) -> None:
    big = "x" * 5000

    def workload(conn: Conn) -> None:
        conn.execute("INSERT INTO t VALUES (1, %s, 1)", (big,))
        conn.execute("UPDATE t SET b = 2 WHERE id = 1")  # big value untouched: unchanged TOAST
        conn.execute("UPDATE t SET id = 10 WHERE id = 1")  # key change: old key sent
        conn.execute("DELETE FROM t WHERE id = 10")
        conn.execute("INSERT INTO f VALUES (1, 'a', %s)", (big,))
        conn.execute("UPDATE f SET v = 'b'")
        conn.execute("DELETE FROM f")

    setup = (
        "CREATE TABLE t (id int PRIMARY KEY, a text, b int);"
        "ALTER TABLE t ALTER COLUMN a SET STORAGE EXTERNAL;"
        "CREATE TABLE f (id int, v text, big text);"
        "ALTER TABLE f REPLICA IDENTITY FULL"
    )
    messages = decode_all(capture(pg_database, workload, setup=setup))
    relations = {r.name: r for r in of_type(messages, Relation)}
    assert relations["f"].replica_identity is ReplicaIdentity.FULL
    assert all(c.flags_key for c in relations["f"].columns)  # FULL: every column identifies the row
    t, f = relations["t"].oid, relations["f"].oid

    updates = of_type(messages, Update)
    assert updates[0] == Update(t, None, None, ("1", UNCHANGED_TOAST, "2"))
    assert updates[1] == Update(t, "K", ("1", None, None), ("10", UNCHANGED_TOAST, "2"))
    assert updates[2] == Update(f, "O", ("1", "a", big), ("1", "b", big))
    deletes = of_type(messages, Delete)
    assert deletes == [Delete(t, "K", ("10", None, None)), Delete(f, "O", ("1", "b", big))]
    assert len(of_type(messages, Begin)) == len(of_type(messages, Commit)) == 7


def test_truncate_messages_type_and_origin(pg_database: Any) -> None:
    facts: dict[str, Any] = {}

    def workload(conn: Conn) -> None:
        conn.execute("INSERT INTO parent VALUES (1, 'happy')")
        conn.execute("INSERT INTO child VALUES (1)")
        conn.execute("TRUNCATE parent RESTART IDENTITY CASCADE")
        conn.execute("TRUNCATE other")
        with conn.transaction():
            conn.execute("INSERT INTO other VALUES (1)")
            conn.execute("SELECT pg_logical_emit_message(true, 'etl', 'in a transaction')")
        facts["message_lsn"] = scalar(conn, "SELECT pg_logical_emit_message(false, 'etl', '\\x00ff'::bytea)::text")
        conn.execute("SELECT pg_replication_origin_create('upstream')")
        conn.execute("SELECT pg_replication_origin_session_setup('upstream')")
        conn.execute("INSERT INTO other VALUES (2)")
        conn.execute("SELECT pg_replication_origin_session_reset()")
        facts.update(parent=oid(conn, "parent"), child=oid(conn, "child"), other=oid(conn, "other"))
        facts["mood"] = scalar(conn, "SELECT 'mood'::regtype::oid")

    setup = (
        "CREATE TYPE mood AS ENUM ('sad', 'happy');"
        "CREATE TABLE parent (id int GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, m mood);"
        "CREATE TABLE child (id int REFERENCES parent);"
        "CREATE TABLE other (id int)"
    )
    messages = decode_all(capture(pg_database, workload, setup=setup))

    types = of_type(messages, Type)
    assert types[0] == Type(facts["mood"], "public", "mood")
    relation_index = next(i for i, m in enumerate(messages) if isinstance(m, Relation) and m.name == "parent")
    assert messages[relation_index - 1] == types[0]  # the type is described before the relation using it

    truncates = of_type(messages, Truncate)
    assert truncates[0] == Truncate(True, True, (facts["parent"], facts["child"]))
    assert truncates[1] == Truncate(False, False, (facts["other"],))

    logical = of_type(messages, LogicalMessage)
    assert logical[0].transactional and logical[0].prefix == "etl" and logical[0].content == b"in a transaction"
    begin = [m for m in messages[: messages.index(logical[0])] if isinstance(m, Begin)][-1]
    assert logical[0].lsn <= begin.final_lsn
    assert logical[1] == LogicalMessage(False, Lsn.parse(facts["message_lsn"]), "etl", b"\x00\xff")

    (origin,) = of_type(messages, Origin)
    assert origin.name == "upstream"
    after_origin = messages[messages.index(origin) + 1 :]
    assert isinstance(after_origin[0], Insert) and after_origin[0].new == ("2",)


def _streaming_workload(conn: Conn) -> None:
    conn.execute("INSERT INTO s SELECT g, repeat('c', 50) FROM generate_series(1, 2000) g")
    with conn.transaction():
        conn.execute("INSERT INTO s SELECT g, 'kept' FROM generate_series(10001, 12000) g")
        conn.execute("SELECT pg_logical_emit_message(true, 'etl', 'streamed')")
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO s SELECT g, 'subxact' FROM generate_series(20001, 22000) g")
            raise RuntimeError("roll back to the savepoint")
        conn.execute("INSERT INTO s VALUES (30000, 'after')")
    with pytest.raises(RuntimeError), conn.transaction():
        conn.execute("INSERT INTO s SELECT g, 'aborted' FROM generate_series(40001, 42000) g")
        raise RuntimeError("roll back")


def test_protocol_2_streamed_transactions(pg_database: Any) -> None:
    payloads = capture(
        pg_database, _streaming_workload, proto_version=2, streaming=True, setup="CREATE TABLE s (id int, v text)"
    )
    decoder = PgOutputDecoder(2)
    current: StreamStart | None = None
    segments: dict[int, list[bool]] = {}
    inserted: dict[tuple[int | None, str], int] = {}
    in_stream_relations = []
    ends: list[StreamCommit | StreamAbort] = []
    for payload in payloads:
        message = decoder.decode(payload)
        if isinstance(message, StreamStart):
            assert current is None and decoder.in_stream
            current = message
            segments.setdefault(message.xid, []).append(message.first_segment)
        elif isinstance(message, StreamStop):
            assert current is not None and not decoder.in_stream
            current = None
        elif isinstance(message, StreamCommit | StreamAbort):
            assert current is None
            ends.append(message)
        elif isinstance(message, Insert):
            if current is None:
                assert message.xid is None
            else:
                assert message.xid is not None
            label = "big" if message.new[1] == "c" * 50 else str(message.new[1])
            inserted[(message.xid, label)] = inserted.get((message.xid, label), 0) + 1
        elif isinstance(message, Relation) and current is not None:
            in_stream_relations.append(message)
            assert message.xid is not None

    assert in_stream_relations, "the relation is described inside the stream"
    streamed_xids = list(segments)
    for flags in segments.values():
        assert flags[0] and not any(flags[1:])  # only the first segment of a transaction is flagged first
    big, kept, aborted = streamed_xids[-3:]
    commits = [e for e in ends if isinstance(e, StreamCommit)]
    aborts = [e for e in ends if isinstance(e, StreamAbort)]
    assert [c.xid for c in commits][-2:] == [big, kept]
    assert all(c.commit_lsn < c.end_lsn for c in commits)
    subxact_abort, whole_abort = aborts[-2:]
    assert subxact_abort.xid == kept and subxact_abort.subxid != kept
    assert whole_abort == StreamAbort(aborted, aborted)
    # Changes made in the subtransaction carry its own xid; the others the toplevel xid.
    assert inserted[(big, "big")] == 2000
    assert inserted[(kept, "kept")] == 2000
    assert inserted[(kept, "after")] == 1
    assert inserted.get((subxact_abort.subxid, "subxact"), 0) > 0
    assert inserted.get((aborted, "aborted"), 0) > 0


def test_decode_streamed_replays_a_change_outside_the_stream(pg_database: Any) -> None:
    payloads = capture(
        pg_database, _streaming_workload, proto_version=2, streaming=True, setup="CREATE TABLE s (id int, v text)"
    )
    decoder = PgOutputDecoder(2)
    buffered: list[tuple[bytes, Message]] = []
    for payload in payloads:
        message = decoder.decode(payload)
        if decoder.in_stream and not isinstance(message, StreamStart):
            assert payload[:1] in STREAMABLE
            assert stream_xid(payload) == message.xid  # type: ignore[union-attr]
            buffered.append((payload, message))
        else:
            assert payload[:1] not in STREAMABLE or message.xid is None  # type: ignore[union-attr]
    assert not decoder.in_stream
    replay = PgOutputDecoder(2)
    assert [replay.decode_streamed(payload) for payload, _ in buffered] == [m for _, m in buffered]
    assert not replay.in_stream
    with pytest.raises(PgOutputError, match="not a streamed change"):
        stream_xid(b"E")
    with pytest.raises(PgOutputError, match="stream control"):
        replay.decode_streamed(next(p for p in payloads if p[:1] == b"E"))


def _insert_payload(pg_database: Any) -> bytes:
    payloads = capture(
        pg_database, lambda conn: conn.execute("INSERT INTO t VALUES (1, 'a')"), setup="CREATE TABLE t (id int, v text)"
    )
    return next(p for p in payloads if p[:1] == b"I")


def test_errors_name_the_problem(pg_database: Any) -> None:
    insert = _insert_payload(pg_database)
    decoder = PgOutputDecoder(1)
    assert isinstance(decoder.decode(memoryview(insert)), Insert)

    with pytest.raises(PgOutputError, match=r"unknown pgoutput message type 'Z' \(byte 0x5a\)"):
        decoder.decode(b"Z" + insert[1:])
    with pytest.raises(PgOutputError, match=r"byte 0x00"):
        decoder.decode(b"\x00")
    with pytest.raises(PgOutputError, match="two-phase") as two_phase:
        decoder.decode(b"P" + insert[1:])
    assert two_phase.value.hint is not None and "two_phase" in two_phase.value.hint
    with pytest.raises(PgOutputError, match="empty"):
        decoder.decode(b"")

    # Tuples are parsed when their values are read: one by one, or a batch column-wise (as the builder does).
    readers: list[Callable[[TupleData], object]] = [tuple, lambda row: parse([row], 2)]
    # The first value of the captured insert is ('t', length, '1'): mark it binary instead.
    first_value = insert.index(b"t\x00\x00\x00\x011")
    binary = decoder.decode(insert[:first_value] + b"b" + insert[first_value + 1 :])
    truncated = decoder.decode(insert[:-1])
    unknown = decoder.decode(insert[:first_value] + b"x" + insert[first_value + 1 :])
    assert isinstance(binary, Insert) and isinstance(truncated, Insert) and isinstance(unknown, Insert)
    for read in readers:
        with pytest.raises(PgOutputError, match="binary format") as binary_error:
            read(binary.new)
        assert binary_error.value.hint is not None and "binary" in binary_error.value.hint
        with pytest.raises(PgOutputError, match="truncated"):
            read(truncated.new)
        with pytest.raises(PgOutputError, match=r"unknown tuple value kind 'x'"):
            read(unknown.new)
    with pytest.raises(TupleWidthError):
        parse([decoder.decode(insert).new], 3)  # type: ignore[union-attr]
    with pytest.raises(PgOutputError, match="malformed pgoutput 'B' message"):
        decoder.decode(b"B\x00\x01")
    with pytest.raises(PgOutputError, match="protocol version 9"):
        PgOutputDecoder(9)


def test_decoding_rate(pg_database: Any, record_property: Callable[[str, object], None]) -> None:
    """Decode a realistic stream of 10-column inserts and record the rate (informational, not asserted)."""
    rows = 20_000
    setup = (
        "CREATE TABLE w (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric(12, 2),"
        " e boolean, f text, g double precision, h date, i uuid)"
    )

    def workload(conn: Conn) -> None:
        conn.execute(
            "INSERT INTO w SELECT g, g %% 1000, 'name ' || g, now(), g / 7.0, g %% 2 = 0, NULL, g * 1.5,"
            " current_date, gen_random_uuid() FROM generate_series(1, %s) g",
            (rows,),
        )

    payloads = [p for p in capture(pg_database, workload, setup=setup) if p[:1] == b"I"]
    assert len(payloads) == rows
    decoder = PgOutputDecoder(1)
    started = time.perf_counter()
    decoded = [decoder.decode(p) for p in payloads]
    columns = parse([m.new for m in decoded], 10)  # type: ignore[union-attr]
    elapsed = time.perf_counter() - started
    record_property("pgoutput_insert_rows_per_second", round(rows / elapsed))
    assert columns.text[0].to_pylist() == [m.new[0] for m in decoded]  # type: ignore[union-attr]
    assert columns.text[6].null_count == rows and columns.unchanged == [None] * 10
    assert all(isinstance(m, Insert) and len(m.new) == 10 and m.new[6] is None for m in decoded)
    assert sorted(int(m.new[0]) for m in decoded) == list(range(1, rows + 1))  # type: ignore[union-attr, arg-type]


def test_timestamps_are_microseconds_since_2000() -> None:
    # A Commit built by hand: flags 0, commit/end LSN, timestamp 1 day + 1 microsecond after 2000-01-01.
    payload = b"C" + struct.pack("!BQQq", 0, 0x16_B374D848, 0x16_B374D878, 86_400_000_001)
    commit = PgOutputDecoder(1).decode(payload)
    expected_ts = datetime(2000, 1, 2, 0, 0, 0, 1, UTC)
    assert commit == Commit(0, Lsn.parse("16/B374D848"), Lsn.parse("16/B374D878"), expected_ts)


def test_tuple_columns_match_values_read_one_by_one() -> None:
    """Many tuples parsed column-wise give the values each tuple gives alone, wherever it sits in its payload."""
    rng = random.Random(7)
    texts = ["", "a", "héllo ☃", "x" * 300, "line\nbreak", "t\x00\x00\x00"]
    width = 6

    def value() -> Value:
        pick = rng.random()
        if pick < 0.15:
            return None
        if pick < 0.25:
            return UNCHANGED_TOAST
        return rng.choice(texts) + str(rng.randrange(1000))

    rows: list[TupleData | None] = []
    for i in range(500):
        if i % 9 == 4:
            rows.append(None)  # an absent row (a truncate's row in the builder)
            continue
        encoded = TupleData.of(value() for _ in range(width))
        header = bytes(rng.randrange(20))  # the message header before the tuple
        rows.append(TupleData(header + encoded.data + bytes(rng.randrange(3)), len(header)))

    columns = parse(rows, width)
    for c in range(width):
        expected = [None if row is None else row[c] for row in rows]
        assert columns.text[c].to_pylist() == [None if v is UNCHANGED_TOAST else v for v in expected]
        mask = columns.unchanged[c]
        assert mask is not None and mask.tolist() == [v is UNCHANGED_TOAST for v in expected]
    assert parse([None, None], 2).text[1].to_pylist() == [None, None]
    assert [len(column) for column in parse([], 2).text] == [0, 0]
    assert parse([TupleData.of(["1"])], 1).unchanged == [None]
