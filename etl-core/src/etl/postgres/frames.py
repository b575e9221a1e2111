"""The frames of a replication stream, inside its CopyData messages: bytes in, values out, no I/O.

The server sends XLogData (``w``: a WAL record's pgoutput message) and primary keepalives (``k``); the
client sends Standby Status Updates (``r``). See "Streaming Replication Protocol" in the Postgres manual.
"""

from __future__ import annotations

import struct
from datetime import datetime
from typing import Final, NamedTuple

from etl.lsn import Lsn
from etl.postgres.pgtime import pg_timestamp

_XLOG_HEADER: Final = struct.Struct(">QQq")  # after the b"w" tag: wal start, wal end, server time
_KEEPALIVE: Final = struct.Struct(">Qq?")  # after the b"k" tag: wal end, server time, reply requested
_STATUS: Final = struct.Struct(">cQQQq?")  # Standby Status Update
_XLOG_TAG: Final = ord("w")
_KEEPALIVE_TAG: Final = ord("k")
_MESSAGE_TAG: Final = ord("M")
_new_tuple: Final = tuple.__new__
"""``tuple.__new__(XLogData, fields)``: a named tuple without the cost of its ``__new__`` (argument binding)."""


class XLogData(NamedTuple):
    """One WAL data message; ``payload`` is a pgoutput message (``bytes``; a ``memoryview`` for a logical message)."""

    wal_start: Lsn
    wal_end: Lsn
    server_time: int
    """Microseconds since 2000-01-01 UTC (see ``server_datetime``)."""
    payload: bytes | memoryview

    @property
    def server_datetime(self) -> datetime:
        return pg_timestamp(self.server_time)


class Keepalive(NamedTuple):
    """A primary keepalive; answer it with a status update soon when ``reply_requested``."""

    wal_end: Lsn
    server_time: int
    """Microseconds since 2000-01-01 UTC (see ``server_datetime``)."""
    reply_requested: bool

    @property
    def server_datetime(self) -> datetime:
        return pg_timestamp(self.server_time)


def parse_frame(data: bytes | memoryview) -> XLogData | Keepalive | None:
    """The frame in one CopyData message from the server; ``None`` for a kind this client does not know."""
    tag = data[0]
    if tag == _XLOG_TAG:  # every change comes this way: built with as few calls as possible
        start, end, sent = _XLOG_HEADER.unpack_from(data, 1)
        wal_end = Lsn(end)  # a logical walsender sends a record's LSN as both start and end
        # A logical message stays a view of the CopyData message, uncopied: most are dropped unread (any role can
        # emit them, of up to 1 GB); the stream copies those of its own prefixes that it reads (``StreamWorker``).
        payload = memoryview(data)[25:] if len(data) > 25 and data[25] == _MESSAGE_TAG else bytes(data[25:])
        return _new_tuple(XLogData, (wal_end if start == end else Lsn(start), wal_end, sent, payload))
    if tag == _KEEPALIVE_TAG:
        end, sent, reply = _KEEPALIVE.unpack_from(data, 1)
        return Keepalive(Lsn(end), sent, reply)
    return None


def status_update(write: Lsn, flush: Lsn, apply: Lsn, now_us: int, reply: bool) -> bytes:
    """A Standby Status Update: WAL written, flushed (what the slot may forget) and applied, at ``now_us``
    (microseconds since 2000-01-01 UTC); ``reply`` asks the server to answer at once."""
    return _STATUS.pack(b"r", write, flush, apply, now_us, reply)
