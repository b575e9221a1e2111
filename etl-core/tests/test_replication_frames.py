"""The replication stream's frames (``etl.postgres.frames``), from bytes laid out as the protocol documents them."""

from __future__ import annotations

import struct

from etl.lsn import Lsn
from etl.postgres.frames import Keepalive, XLogData, parse_frame, status_update


def test_xlogdata_carries_its_positions_time_and_payload() -> None:
    frame = parse_frame(b"w" + struct.pack(">QQq", 0x10, 0x20, 123) + b"B\x00payload")
    assert frame == XLogData(Lsn(0x10), Lsn(0x20), 123, b"B\x00payload")
    assert isinstance(frame, XLogData) and type(frame.payload) is bytes


def test_a_record_sent_with_equal_start_and_end_shares_one_lsn() -> None:
    frame = parse_frame(memoryview(b"w" + struct.pack(">QQq", 0x30, 0x30, 0) + b"C"))
    assert isinstance(frame, XLogData) and frame.wal_start == frame.wal_end == Lsn(0x30) and frame.payload == b"C"


def test_keepalive_says_whether_to_reply() -> None:
    assert parse_frame(b"k" + struct.pack(">Qq?", 0x40, 7, True)) == Keepalive(Lsn(0x40), 7, True)
    assert parse_frame(b"k" + struct.pack(">Qq?", 0x40, 7, False)) == Keepalive(Lsn(0x40), 7, False)


def test_an_unknown_kind_is_none() -> None:
    assert parse_frame(b"x\x00\x01") is None


def test_status_update_layout() -> None:
    message = status_update(Lsn(1), Lsn(2), Lsn(3), 456, True)
    assert message == b"r" + struct.pack(">QQQq?", 1, 2, 3, 456, True)
    assert len(message) == 34
