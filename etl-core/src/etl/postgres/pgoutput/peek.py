"""What a payload is, read from its first bytes without decoding it: the relation of an Insert, the xid of a
streamed change, runs of Inserts into one relation."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Final

from etl.postgres.pgoutput.tuples import PgOutputError

_U32: Final = struct.Struct("!I")
_U64: Final = struct.Struct("!Q")
_INSERT: Final = ord("I")
_NEW: Final = ord("N")

STREAMABLE: Final = frozenset({b"R", b"Y", b"I", b"U", b"D", b"T", b"M"})
"""First bytes (``payload[:1]``) of messages that belong to the transaction when sent inside a stream.

Inside a stream they carry the xid of their (sub)transaction before their body (see ``stream_xid``).
"""
CARRIES_XID: Final = frozenset(b"".join(STREAMABLE))


INSERT_TUPLE_START: Final = 6
"""Where the new tuple of an Insert starts: after ``I``, the relation oid and ``N``."""
STREAMED_INSERT_TUPLE_START: Final = 10
"""Where the new tuple of an Insert received inside a stream starts: its xid comes before the relation oid."""


def insert_relation(payload: bytes) -> int | None:
    """The relation oid of an Insert received outside a stream, read without decoding the message into
    objects (the row is ``payload[INSERT_TUPLE_START:]``); ``None`` for any other message: decode it."""
    if payload[0] != _INSERT or len(payload) < INSERT_TUPLE_START or payload[5] != _NEW:
        return None
    oid: int = _U32.unpack_from(payload, 1)[0]
    return oid


def streamed_insert_runs(payloads: Iterable[bytes], longest: int) -> Iterator[tuple[int | None, list[bytes]]]:
    """Payloads received inside a stream, in order: runs of Inserts into one relation as ``(oid, run)``
    (at most ``longest`` each; rows at ``payload[STREAMED_INSERT_TUPLE_START:]``), any other message
    alone as ``(None, [payload])``. A transaction replayed at its commit goes into batches a run at a time."""
    run: list[bytes] = []
    oid = b""
    for payload in payloads:
        if payload[0] == _INSERT and len(payload) >= STREAMED_INSERT_TUPLE_START and payload[9] == _NEW:
            if run and (len(run) >= longest or not payload.startswith(oid, 5)):
                yield _U32.unpack(oid)[0], run
                run = []
            if not run:
                oid = payload[5:9]
            run.append(payload)
            continue
        if run:
            yield _U32.unpack(oid)[0], run
            run = []
        yield None, [payload]
    if run:
        yield _U32.unpack(oid)[0], run


MESSAGE: Final = ord("M")
"""First byte of a logical message (``pg_logical_emit_message``)."""


def message_prefix(payload: bytes | memoryview, in_stream: bool, prefixes: Iterable[str]) -> str | None:
    """Which of ``prefixes`` the logical message ``payload`` has (``None``: another), read without copying it.

    ``in_stream``: the message was received inside a stream (its xid comes first). Only as many bytes
    as a prefix has are compared, however long the message's own prefix or content.
    """
    start = 14 if in_stream else 10  # after "M", the xid inside a stream, the flags and the LSN
    for prefix in prefixes:
        wanted = prefix.encode() + b"\0"
        if payload[start : start + len(wanted)] == wanted:
            return prefix
    return None


def message_lsn(payload: bytes | memoryview, in_stream: bool) -> int:
    """The LSN of the logical message ``payload``, read without decoding it."""
    lsn: int = _U64.unpack_from(payload, 6 if in_stream else 2)[0]
    return lsn


def stream_xid(payload: bytes | memoryview) -> int:
    """The (sub)transaction xid of a ``STREAMABLE`` message received inside a stream, without decoding it."""
    if len(payload) < 5 or payload[0] not in CARRIES_XID:
        first = bytes(payload[:1])
        raise PgOutputError(f"not a streamed change: a {len(payload)}-byte payload starting with {first!r}")
    xid: int = _U32.unpack_from(payload, 1)[0]
    return xid
