"""The pgoutput decoder: one payload in, one message out."""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import datetime
from typing import Final

from etl.lsn import Lsn
from etl.postgres.pgoutput.messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    OldKind,
    Origin,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from etl.postgres.pgoutput.peek import CARRIES_XID
from etl.postgres.pgoutput.tuples import PgOutputError, TupleData, read_string, read_tuple
from etl.postgres.pgtime import PG_EPOCH, pg_timestamp
from etl.schema import ReplicaIdentity

_U8: Final = struct.Struct("!B")
_U16: Final = struct.Struct("!H")
_U32: Final = struct.Struct("!I")
_I32: Final = struct.Struct("!i")
_U32_B: Final = struct.Struct("!IB")
_BEGIN: Final = struct.Struct("!QqI")
_COMMIT: Final = struct.Struct("!BQQq")
_STREAM_COMMIT: Final = struct.Struct("!IBQQq")
_STREAM_ABORT: Final = struct.Struct("!II")
_U32_U32: Final = struct.Struct("!II")
_I32_I32: Final = struct.Struct("!Ii")
_MESSAGE_HEAD: Final = struct.Struct("!BQ")
_U64: Final = struct.Struct("!Q")
_NEW: Final = ord("N")
_KEY: Final = ord("K")
_OLD: Final = ord("O")
_STREAM_CONTROL: Final = frozenset(b"SEcA")
_TWO_PHASE: Final = frozenset(b"bPKrp")


class PgOutputDecoder:
    """Decodes pgoutput payloads of one replication stream, in the order they arrive."""

    def __init__(self, protocol_version: int) -> None:
        if protocol_version not in (1, 2, 3, 4):
            raise PgOutputError(
                f"unsupported pgoutput protocol version {protocol_version}",
                hint="use proto_version 1, or 2 for streaming of large transactions",
            )
        self.protocol_version = protocol_version
        self._in_stream = False
        self._last_ts: tuple[int, datetime] = (0, PG_EPOCH)
        self._handlers: dict[int, Callable[[bytes, int, int | None], Message]] = {
            ord("B"): self._begin,
            ord("C"): self._commit,
            ord("O"): self._origin,
            ord("R"): self._relation,
            ord("Y"): self._type,
            ord("I"): self._insert,
            ord("U"): self._update,
            ord("D"): self._delete,
            ord("T"): self._truncate,
            ord("M"): self._message,
            ord("S"): self._stream_start,
            ord("E"): self._stream_stop,
            ord("c"): self._stream_commit,
            ord("A"): self._stream_abort,
        }

    @property
    def in_stream(self) -> bool:
        """True between ``StreamStart`` and ``StreamStop``: changes there belong to an in-progress transaction."""
        return self._in_stream

    def decode(self, payload: bytes | memoryview) -> Message:
        """Decode one XLogData payload (the bytes after the XLogData header)."""
        return self._decode(payload if type(payload) is bytes else bytes(payload), self._in_stream)

    def decode_streamed(self, payload: bytes | memoryview) -> Message:
        """Decode a payload that was received inside a stream, replayed later (for example on StreamCommit).

        Such payloads carry an xid whatever the decoder's current state; the state is not changed.
        """
        data = payload if type(payload) is bytes else bytes(payload)
        if data and data[0] in _STREAM_CONTROL:
            raise PgOutputError(f"stream control message {chr(data[0])!r} cannot be replayed as a streamed change")
        return self._decode(data, True)

    def _decode(self, data: bytes, with_xid: bool) -> Message:
        if not data:
            raise PgOutputError("empty pgoutput payload")
        kind = data[0]
        handler = self._handlers.get(kind)
        if handler is None:
            raise _unknown(kind)
        try:
            if with_xid and kind in CARRIES_XID:
                return handler(data, 5, _U32.unpack_from(data, 1)[0])
            return handler(data, 1, None)
        except (struct.error, IndexError, ValueError) as exc:
            raise PgOutputError(
                f"malformed pgoutput {chr(kind)!r} message ({len(data)} bytes): {exc}",
                hint="the replication stream is corrupt or not pgoutput; restart the pipeline to resume",
            ) from exc

    # -- transaction control ------------------------------------------------------------------------
    def _begin(self, data: bytes, pos: int, xid: int | None) -> Begin:
        final_lsn, ts, txid = _BEGIN.unpack_from(data, 1)
        return Begin(Lsn(final_lsn), self._timestamp(ts), txid)

    def _commit(self, data: bytes, pos: int, xid: int | None) -> Commit:
        flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
        return Commit(flags, Lsn(commit_lsn), Lsn(end_lsn), self._timestamp(ts))

    def _timestamp(self, microseconds: int) -> datetime:
        """``pg_timestamp``, remembering the last one: a transaction's BEGIN and COMMIT carry the same time."""
        if self._last_ts[0] != microseconds:
            self._last_ts = (microseconds, pg_timestamp(microseconds))
        return self._last_ts[1]

    def _origin(self, data: bytes, pos: int, xid: int | None) -> Origin:
        (lsn,) = _U64.unpack_from(data, 1)
        name, _ = read_string(data, 9)
        return Origin(Lsn(lsn), name)

    def _stream_start(self, data: bytes, pos: int, xid: int | None) -> StreamStart:
        txid, first = _U32_B.unpack_from(data, 1)
        self._in_stream = True
        return StreamStart(txid, first == 1)

    def _stream_stop(self, data: bytes, pos: int, xid: int | None) -> StreamStop:
        self._in_stream = False
        return StreamStop()

    def _stream_commit(self, data: bytes, pos: int, xid: int | None) -> StreamCommit:
        txid, flags, commit_lsn, end_lsn, ts = _STREAM_COMMIT.unpack_from(data, 1)
        return StreamCommit(txid, flags, Lsn(commit_lsn), Lsn(end_lsn), pg_timestamp(ts))

    def _stream_abort(self, data: bytes, pos: int, xid: int | None) -> StreamAbort:
        # Protocol 4 with streaming = parallel appends the abort LSN and time; they are not needed here.
        txid, subxid = _STREAM_ABORT.unpack_from(data, 1)
        return StreamAbort(txid, subxid)

    # -- schema ---------------------------------------------------------------------------------------
    def _relation(self, data: bytes, pos: int, xid: int | None) -> Relation:
        (oid,) = _U32.unpack_from(data, pos)
        namespace, pos = read_string(data, pos + 4)
        name, pos = read_string(data, pos)
        identity = chr(data[pos])
        (ncols,) = _U16.unpack_from(data, pos + 1)
        pos += 3
        columns = []
        for _ in range(ncols):
            flags = data[pos]
            column, pos = read_string(data, pos + 1)
            type_oid, typmod = _I32_I32.unpack_from(data, pos)
            pos += 8
            columns.append(RelationColumn(flags & 1 == 1, column, type_oid, typmod))
        try:
            replica_identity = ReplicaIdentity(identity)
        except ValueError:
            raise PgOutputError(f"relation {namespace}.{name}: unknown replica identity {identity!r}") from None
        return Relation(oid, namespace or "pg_catalog", name, replica_identity, tuple(columns), xid)

    def _type(self, data: bytes, pos: int, xid: int | None) -> Type:
        (oid,) = _U32.unpack_from(data, pos)
        namespace, pos = read_string(data, pos + 4)
        name, _ = read_string(data, pos)
        return Type(oid, namespace or "pg_catalog", name, xid)

    # -- changes --------------------------------------------------------------------------------------
    def _insert(self, data: bytes, pos: int, xid: int | None) -> Insert:
        (oid,) = _U32.unpack_from(data, pos)
        if data[pos + 4] != _NEW:
            raise PgOutputError(f"insert into relation {oid}: expected a new tuple ('N'), got {chr(data[pos + 4])!r}")
        return Insert(oid, TupleData(data, pos + 5), xid)

    def _update(self, data: bytes, pos: int, xid: int | None) -> Update:
        (oid,) = _U32.unpack_from(data, pos)
        pos += 4
        marker = data[pos]
        old: TupleData | None = None
        old_kind: OldKind | None = None
        if marker in (_KEY, _OLD):
            old_kind = "K" if marker == _KEY else "O"
            values, end = read_tuple(data, pos + 1)  # parsed now: the new tuple starts where it ends
            old = TupleData(data, pos + 1, values)
            pos = end
            marker = data[pos]
        if marker != _NEW:
            raise PgOutputError(f"update of relation {oid}: expected a new tuple ('N'), got {chr(marker)!r}")
        return Update(oid, old_kind, old, TupleData(data, pos + 1), xid)

    def _delete(self, data: bytes, pos: int, xid: int | None) -> Delete:
        (oid,) = _U32.unpack_from(data, pos)
        marker = data[pos + 4]
        if marker not in (_KEY, _OLD):
            raise PgOutputError(f"delete from relation {oid}: expected an old tuple ('K' or 'O'), got {chr(marker)!r}")
        return Delete(oid, "K" if marker == _KEY else "O", TupleData(data, pos + 5), xid)

    def _truncate(self, data: bytes, pos: int, xid: int | None) -> Truncate:
        nrels, options = _U32_B.unpack_from(data, pos)
        oids = struct.unpack_from(f"!{nrels}I", data, pos + 5)
        return Truncate(options & 1 == 1, options & 2 == 2, oids, xid)

    def _message(self, data: bytes, pos: int, xid: int | None) -> LogicalMessage:
        flags, lsn = _MESSAGE_HEAD.unpack_from(data, pos)
        prefix, pos = read_string(data, pos + 9)
        (length,) = _U32.unpack_from(data, pos)
        content = data[pos + 4 : pos + 4 + length]
        if len(content) != length:
            raise PgOutputError(f"logical message {prefix!r}: content truncated ({len(content)} of {length} bytes)")
        return LogicalMessage(flags & 1 == 1, Lsn(lsn), prefix, content, xid)


def _unknown(kind: int) -> PgOutputError:
    shown = f"{chr(kind)!r} (byte 0x{kind:02x})" if 32 <= kind < 127 else f"byte 0x{kind:02x}"
    if kind in _TWO_PHASE:
        return PgOutputError(
            f"pgoutput message {shown} is a two-phase commit message, which is not supported",
            hint="start replication without the 'two_phase' option",
        )
    return PgOutputError(
        f"unknown pgoutput message type {shown}",
        hint="the server speaks a newer protocol than this version understands; use proto_version 1 or 2",
    )
