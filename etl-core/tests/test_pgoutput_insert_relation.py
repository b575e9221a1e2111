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


def test_an_insert_received_inside_a_stream_carries_its_xid_first() -> None:
    payload = b"I" + struct.pack("!II", 731, 16_385) + b"N" + tuple_data("7")
    decoded = pg.PgOutputDecoder(2).decode_streamed(payload)
    assert isinstance(decoded, pg.Insert)
    assert pg.insert_relation(payload, streamed=True) == decoded.relation_oid == 16_385
    assert tuple(pg.TupleData(payload, pg.STREAMED_INSERT_TUPLE_START)) == ("7",)


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
