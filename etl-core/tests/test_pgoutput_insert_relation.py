"""``insert_relation``: the apply loop's way past the decoder for plain inserts agrees with the decoder."""

from __future__ import annotations

import struct

import pytest

from etl.postgres import pgoutput as pg


def tuple_data(*values: str | None) -> bytes:
    body = b"".join(b"n" if v is None else b"t" + struct.pack("!I", len(v.encode())) + v.encode() for v in values)
    return struct.pack("!H", len(values)) + body


def test_an_insert_gives_its_relation_and_where_its_row_starts() -> None:
    payload = b"I" + struct.pack("!I", 16_385) + b"N" + tuple_data("1", None, "x")
    decoded = pg.PgOutputDecoder(1).decode(payload)
    assert isinstance(decoded, pg.Insert)
    assert pg.insert_relation(payload) == decoded.relation_oid == 16_385
    assert tuple(pg.TupleData(payload, pg.INSERT_TUPLE_START)) == tuple(decoded.new) == ("1", None, "x")


def streamed_insert(oid: int, value: str) -> bytes:
    return b"I" + struct.pack("!II", 731, oid) + b"N" + tuple_data(value)


def test_streamed_inserts_come_in_runs_per_relation_and_other_messages_alone() -> None:
    update = b"U" + struct.pack("!II", 731, 1) + b"N" + tuple_data("u")
    payloads = [streamed_insert(1, "a"), streamed_insert(1, "b"), streamed_insert(2, "c"), update]
    payloads += [streamed_insert(1, str(i)) for i in range(5)]
    runs = list(pg.streamed_insert_runs(payloads, longest=3))
    assert [(oid, len(run)) for oid, run in runs] == [(1, 2), (2, 1), (None, 1), (1, 3), (1, 2)]
    assert [p for _, run in runs for p in run] == payloads  # nothing lost, nothing reordered
    decoder = pg.PgOutputDecoder(2)
    for oid, run in runs:
        for payload in run:
            decoded = decoder.decode_streamed(payload)
            assert oid is None or (isinstance(decoded, pg.Insert) and decoded.relation_oid == oid)
            if oid is not None:
                row = tuple(pg.TupleData(payload, pg.STREAMED_INSERT_TUPLE_START))
                assert row == tuple(decoded.new)


@pytest.mark.parametrize(
    "payload",
    [
        b"B" + struct.pack("!QqI", 0x16_B374D848, 0, 7),  # other messages
        b"D" + struct.pack("!I", 16_385) + b"K" + tuple_data("1"),
        b"I" + struct.pack("!I", 16_385) + b"K" + tuple_data("1"),  # malformed: left to the decoder's error
        b"I\x00\x00",
    ],
)
def test_anything_else_is_left_to_the_decoder(payload: bytes) -> None:
    assert pg.insert_relation(payload) is None
