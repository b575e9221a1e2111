"""The pgoutput decoder on payloads captured from real Postgres 15 and 18 servers (protocol 1 and 2).

The captures are checked in under ``data/pgoutput/`` (``<workload>.pg<major>.json``), so these tests need
no server; ``etl.testing.pgoutput_capture.WORKLOADS`` defines what each file holds (the SQL, and the
facts recorded with the payloads: xids, OIDs, LSNs). After changing a workload, or to follow new
server releases, capture them again (starts a throwaway cluster of each major)::

    python -m etl.testing.pgoutput_capture --refresh etl-core/tests/data/pgoutput

Only ``test_live_capture_decodes_like_the_checked_in_one`` needs Postgres (``pg_database``): it captures
each workload afresh and checks that it decodes like the file, so that a server that sends something
else is noticed. ``-k 'not live'`` runs the rest without a server.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import struct
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from etl.lsn import Lsn
from etl.postgres.pgoutput import (
    INSERT_TUPLE_START,
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
    RelationColumn,
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
    insert_relation,
    stream_xid,
    tuple_columns,
)
from etl.schema import ReplicaIdentity
from etl.testing.pgoutput_capture import (
    CAPTURED_MAJORS,
    WORKLOADS,
    Captured,
    capture_path,
    capture_workload,
    load_capture,
)
from etl.testing.pytest_plugin import TestDatabase

DATA = Path(__file__).parent / "data" / "pgoutput"
FIRST_USER_OID = 16384
"""OIDs from here on are those of objects a workload created; they differ between two captures."""


@functools.cache
def captured(workload: str, major: int) -> Captured:
    return load_capture(DATA, workload, major)


@pytest.fixture(params=CAPTURED_MAJORS, ids=[f"pg{m}" for m in CAPTURED_MAJORS])
def major(request: pytest.FixtureRequest) -> int:
    """The Postgres major whose captures a test reads."""
    value: int = request.param
    return value


def decode_all(capture: Captured) -> list[Message]:
    decoder = PgOutputDecoder(capture.proto_version)
    return [decoder.decode(p) for p in capture.payloads]


def of_type(messages: Sequence[object], kind: type[Any]) -> list[Any]:
    return [m for m in messages if isinstance(m, kind)]


def row(*values: Value) -> TupleData:
    """A tuple of these values, to compare with decoded ones."""
    return TupleData.of(values)


def kinds(messages: list[Message]) -> list[str]:
    return [type(m).__name__ for m in messages]


def transactions(messages: list[Message]) -> list[list[Message]]:
    """What each transaction holds between its Begin and Commit (a message outside one stands alone), checking
    that they pair up: same commit LSN and time, commits in WAL order."""
    found: list[list[Message]] = []
    begin: Begin | None = None
    last_end = Lsn.ZERO
    for message in messages:
        if isinstance(message, Begin):
            assert begin is None
            begin = message
            found.append([])
        elif isinstance(message, Commit):
            assert begin is not None
            assert last_end <= begin.final_lsn == message.commit_lsn < message.end_lsn
            assert (begin.commit_ts, message.flags) == (message.commit_ts, 0)
            last_end, begin = message.end_lsn, None
        elif begin is not None:
            found[-1].append(message)
        else:
            assert isinstance(message, LogicalMessage) and not message.transactional
            found.append([message])
    assert begin is None
    return found


def parse(rows: list[TupleData | None], width: int) -> TupleColumns:
    """``tuple_columns`` over tuples given as ``TupleData`` (``None``: an absent row)."""
    payloads = [None if row is None else row.data for row in rows]
    return tuple_columns(payloads, [0 if row is None else row.start for row in rows], width)


def test_captures_are_those_of_the_workloads(major: int) -> None:
    """Each file holds its workload on its major, written as the refresh tool writes it (no hand edits)."""
    for name, workload in WORKLOADS.items():
        path = capture_path(DATA, name, major)
        capture = captured(name, major)
        assert (capture.workload, capture.major) == (name, major)
        assert (capture.proto_version, capture.streaming) == (workload.proto_version, workload.streaming)
        assert capture.facts and capture.payloads
        assert capture.to_json() == path.read_text(encoding="utf-8"), f"{path} is stale: refresh the captures"


def test_transaction_relation_and_insert(major: int) -> None:
    capture = captured("transaction", major)
    facts = capture.facts
    messages = decode_all(capture)
    begin, relation, first, second, commit = messages
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert transactions(messages) == [[relation, first, second]]
    assert begin.xid == facts["xid"]
    assert begin.final_lsn == commit.commit_lsn < commit.end_lsn <= Lsn.parse(facts["wal_lsn_after"])
    after, before = (datetime.fromisoformat(facts[key]) for key in ("committed_after", "committed_before"))
    assert begin.commit_ts == commit.commit_ts and after <= commit.commit_ts <= before
    assert commit.commit_ts.tzinfo is UTC

    columns = [(True, "id"), (False, "a"), (False, "b"), (False, "n"), (False, "e")]
    assert relation == Relation(
        facts["oid"],
        "public",
        "t",
        ReplicaIdentity.DEFAULT,
        tuple(
            RelationColumn(key, name, *types) for (key, name), types in zip(columns, facts["column_types"], strict=True)
        ),
    )
    assert relation.xid is None

    assert first == Insert(facts["oid"], row("1", "héllo ☃", None, "12.50", ""))
    assert second == Insert(facts["oid"], row("2", None, "7", None, "x"))


def test_updates_deletes_toast_and_old_rows(major: int) -> None:
    capture = captured("updates", major)
    facts = capture.facts
    big = "x" * facts["big_length"]
    messages = decode_all(capture)
    assert [kinds(changes) for changes in transactions(messages)] == [
        ["Relation", "Insert"],
        ["Update"],
        ["Update"],
        ["Delete"],
        ["Relation", "Insert"],
        ["Update"],
        ["Delete"],
    ]
    relations = {r.name: r for r in of_type(messages, Relation)}
    assert (relations["t"].oid, relations["f"].oid) == (facts["t"], facts["f"])
    assert relations["t"].replica_identity is ReplicaIdentity.DEFAULT
    assert [c.flags_key for c in relations["t"].columns] == [True, False, False]
    assert relations["f"].replica_identity is ReplicaIdentity.FULL
    assert all(c.flags_key for c in relations["f"].columns)  # FULL: every column identifies the row
    t, f = facts["t"], facts["f"]

    assert of_type(messages, Insert) == [Insert(t, row("1", big, "1")), Insert(f, row("1", "a", big))]
    updates = of_type(messages, Update)
    assert updates == [
        Update(t, None, None, row("1", UNCHANGED_TOAST, "2")),  # the big value untouched: not sent
        Update(t, "K", row("1", None, None), row("10", UNCHANGED_TOAST, "2")),  # key changed: the old key sent
        Update(f, "O", row("1", "a", big), row("1", "b", big)),  # FULL: the whole old row, big value included
    ]
    deletes = of_type(messages, Delete)
    assert deletes == [Delete(t, "K", row("10", None, None)), Delete(f, "O", row("1", "b", big))]


def test_truncate_messages_type_and_origin(major: int) -> None:
    capture = captured("truncate_type_message_origin", major)
    facts = capture.facts
    messages = decode_all(capture)
    assert [kinds(changes) for changes in transactions(messages)] == [
        ["Type", "Relation", "Insert"],
        ["Relation", "Insert"],
        ["Type", "Relation", "Relation", "Truncate"],  # the truncate invalidated them: described again
        ["Relation", "Truncate"],
        ["Relation", "Insert", "LogicalMessage"],
        ["LogicalMessage"],
        ["Origin", "Insert"],
    ]

    mood = Type(facts["mood"], "public", "mood")
    assert of_type(messages, Type) == [mood, mood]
    parent = next(i for i, m in enumerate(messages) if isinstance(m, Relation) and m.name == "parent")
    assert messages[parent - 1] == mood  # the type is described before the relation using it
    relation = messages[parent]
    assert isinstance(relation, Relation) and [c.type_oid for c in relation.columns] == [23, facts["mood"]]

    assert of_type(messages, Truncate) == [
        Truncate(True, True, (facts["parent"], facts["child"])),
        Truncate(False, False, (facts["other"],)),
    ]

    in_transaction, alone = of_type(messages, LogicalMessage)
    assert (in_transaction.transactional, in_transaction.prefix, in_transaction.content) == (
        True,
        "etl",
        b"in a transaction",
    )
    begin = of_type(messages[: messages.index(in_transaction)], Begin)[-1]
    assert in_transaction.lsn <= begin.final_lsn
    assert alone == LogicalMessage(False, Lsn.parse(facts["message_lsn"]), "etl", b"\x00\xff")

    (origin,) = of_type(messages, Origin)
    assert origin == Origin(Lsn.ZERO, "upstream")  # no origin LSN was set in the session
    assert messages[messages.index(origin) + 1] == Insert(facts["other"], row("2"))


def test_protocol_2_streamed_transactions(major: int) -> None:
    capture = captured("streamed", major)
    facts = capture.facts
    decoder = PgOutputDecoder(2)
    current: StreamStart | None = None
    segments: dict[int, list[bool]] = {}
    inserted: dict[tuple[int | None, str], int] = {}
    in_stream_relations: list[Relation] = []
    logical: list[LogicalMessage] = []
    ends: list[StreamCommit | StreamAbort] = []
    for payload in capture.payloads:
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
        else:
            assert current is not None, f"{message} outside a stream: every transaction of the workload streams"
            assert isinstance(message, Insert | Relation | LogicalMessage), message
            assert message.xid is not None
            if isinstance(message, Insert):
                label = str(message.new[1])
                inserted[(message.xid, label)] = inserted.get((message.xid, label), 0) + 1
            elif isinstance(message, Relation):
                assert message.xid == current.xid and message.name == "s"
                in_stream_relations.append(message)
            else:
                logical.append(message)
    assert current is None and not decoder.in_stream

    assert in_stream_relations, "the relation is described inside the stream"
    committed, kept, aborted = facts["committed"], facts["kept"], facts["aborted"]
    assert list(segments) == [committed, kept, aborted]
    for flags in segments.values():
        assert flags[0] and not any(flags[1:])  # only the first segment of a transaction is flagged first
    assert len(segments[kept]) > 1
    commits = of_type(ends, StreamCommit)
    assert [c.xid for c in commits] == [committed, kept]
    assert all(c.commit_lsn < c.end_lsn and c.flags == 0 for c in commits)
    assert commits[0].end_lsn <= commits[1].commit_lsn
    subxact_abort, whole_abort = of_type(ends, StreamAbort)
    assert subxact_abort.xid == kept and subxact_abort.subxid not in (committed, kept, aborted)
    assert whole_abort == StreamAbort(aborted, aborted)
    assert ends == [commits[0], subxact_abort, commits[1], whole_abort]
    (message,) = logical
    assert (message.transactional, message.prefix, message.content, message.xid) == (True, "etl", b"streamed", kept)
    # Changes made in the subtransaction carry its own xid; the others the toplevel xid.
    rows = facts["rows"]
    assert inserted == {
        (committed, "committed"): rows,
        (kept, "kept"): rows,
        (subxact_abort.subxid, "subxact"): rows,
        (kept, "after"): 1,
        (aborted, "aborted"): rows,
    }


def test_decode_streamed_replays_a_change_outside_the_stream(major: int) -> None:
    payloads = captured("streamed", major).payloads
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
    assert len(buffered) == len([p for p in payloads if p[:1] in STREAMABLE]) > 0
    replay = PgOutputDecoder(2)
    assert [replay.decode_streamed(payload) for payload, _ in buffered] == [m for _, m in buffered]
    assert not replay.in_stream
    with pytest.raises(PgOutputError, match="not a streamed change"):
        stream_xid(b"E")
    with pytest.raises(PgOutputError, match="stream control"):
        replay.decode_streamed(next(p for p in payloads if p[:1] == b"E"))


def test_errors_name_the_problem(major: int) -> None:
    # The second insert of the transaction: ('2', NULL, '7', NULL, 'x'), ending with a one-character value.
    insert = [p for p in captured("transaction", major).payloads if p[:1] == b"I"][1]
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
    readers: list[Callable[[TupleData], object]] = [tuple, lambda row: parse([row], 5)]
    # The first value of the captured insert is ('t', length, '2'): mark it binary instead.
    first_value = insert.index(b"t\x00\x00\x00\x012")
    assert first_value == INSERT_TUPLE_START + 2  # after the column count
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
        parse([decoder.decode(insert).new], 6)  # type: ignore[union-attr]
    with pytest.raises(PgOutputError, match="malformed pgoutput 'B' message"):
        decoder.decode(b"B\x00\x01")
    with pytest.raises(PgOutputError, match="protocol version 9"):
        PgOutputDecoder(9)


def test_inserts_of_common_types_parse_column_wise_as_one_by_one(major: int) -> None:
    """Inserts of ten columns of common types: the text the server sends, and the batch parse agrees with the
    values read one by one. (Formerly ``test_decoding_rate``; the decoding rate belongs in bench/.)"""
    capture = captured("inserts", major)
    rows = capture.facts["rows"]
    messages = decode_all(capture)
    assert transactions(messages) == [messages[1:-1]]
    relation = messages[1]
    assert isinstance(relation, Relation) and relation.name == "w"
    payloads = [p for p in capture.payloads if p[:1] == b"I"]
    decoded = [m for m in messages if isinstance(m, Insert)]
    assert len(payloads) == len(decoded) == rows
    assert all(insert_relation(p) == m.relation_oid == relation.oid for p, m in zip(payloads, decoded, strict=True))
    assert all(TupleData(p, INSERT_TUPLE_START) == m.new for p, m in zip(payloads, decoded, strict=True))

    # The engine's session settings (UTC, ISO dates, shortest exact floats) shape the text.
    assert decoded[0].new == (
        "1",
        "1",
        "name 1",
        "2024-01-02 03:04:06+00",
        "0.14",
        "f",
        None,
        "1.5",
        "2024-01-03",
        "c4ca4238-a0b9-2382-0dcc-509a6f75849b",
    )
    columns = parse([m.new for m in decoded], 10)
    for c in range(10):
        assert columns.text[c].to_pylist() == [m.new[c] for m in decoded]
    assert columns.text[6].null_count == rows and columns.unchanged == [None] * 10
    assert [int(str(m.new[0])) for m in decoded] == list(range(1, rows + 1))


def shape(capture: Captured) -> list[tuple[object, ...]]:
    """The decoded messages with what differs between two captures of a workload made generic: xids and the
    OIDs of created objects numbered in order of appearance, LSNs and times left out."""
    xids: dict[int, int] = {}
    oids: dict[int, int] = {}

    def generic(name: str, value: Any) -> object:
        if isinstance(value, Lsn | datetime):
            return type(value).__name__
        if value is None or isinstance(value, bool | str | bytes):
            return value
        if name in ("xid", "subxid"):
            return xids.setdefault(value, len(xids))
        if name in ("oid", "relation_oid", "type_oid"):
            return oids.setdefault(value, len(oids)) if value >= FIRST_USER_OID else value
        if name == "relation_oids":
            return tuple(generic("oid", oid) for oid in value)
        if name == "columns":
            return tuple(fields(column) for column in value)
        if isinstance(value, TupleData):
            return tuple(value)
        return value

    def fields(item: Any) -> tuple[object, ...]:
        return (type(item).__name__, *(generic(f.name, getattr(item, f.name)) for f in dataclasses.fields(item)))

    return [fields(message) for message in decode_all(capture)]


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_live_capture_decodes_like_the_checked_in_one(pg_database: TestDatabase, workload: str) -> None:
    """The server under test sends what the checked-in capture of its major holds (up to xids, OIDs, LSNs and
    times); when it does not, the captures need a refresh (see the module docstring)."""
    if pg_database.major not in CAPTURED_MAJORS:
        pytest.skip(f"no checked-in captures of Postgres {pg_database.major}")
    fresh = capture_workload(pg_database, WORKLOADS[workload])
    stored = captured(workload, pg_database.major)
    assert fresh.facts.keys() == stored.facts.keys()
    assert shape(fresh) == shape(stored)


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
