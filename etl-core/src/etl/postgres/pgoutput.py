"""Sans-IO decoder of the pgoutput logical replication protocol (versions 1 and 2).

Bytes in, message objects out: one call per XLogData payload, no sockets, no threads. The only
state is whether the decoder is between ``StreamStart`` and ``StreamStop``, because inside a
stream (protocol 2) data messages carry the xid of their (sub)transaction before their body.

Tuple values stay in Postgres text form (``str``); turning them into typed values is the job of
:mod:`etl.postgres.codecs`, column by column.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from etl.errors import SourceError
from etl.lsn import Lsn
from etl.schema import ReplicaIdentity


class PgOutputError(SourceError):
    """A pgoutput payload could not be decoded."""


class _UnchangedToast:
    """A TOASTed value the update did not change, so Postgres did not send it (``'u'``)."""

    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()

Value = str | _UnchangedToast | None
TupleData = tuple[Value, ...]
"""Column values in relation order: text, ``None`` for SQL NULL, or ``UNCHANGED_TOAST``."""

OldKind = Literal["K", "O"]
"""``K``: the old row holds the replica identity key columns only; ``O``: every column (REPLICA IDENTITY FULL)."""

PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)


def pg_timestamp(microseconds: int) -> datetime:
    """A pgoutput timestamp (microseconds since 2000-01-01 UTC) as an aware datetime."""
    return PG_EPOCH + timedelta(microseconds=microseconds)


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: Lsn
    """LSN of the transaction's commit record; every change of the transaction is ordered under it."""
    commit_ts: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    """The LSN just past the commit record: what the client confirms once the transaction is durable."""
    commit_ts: datetime


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: Lsn
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    flags_key: bool
    """Part of the replica identity key."""
    name: str
    type_oid: int
    type_modifier: int


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Type:
    oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    old_kind: OldKind | None
    old: TupleData | None
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old_kind: OldKind
    old: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    cascade: bool
    restart_identity: bool
    relation_oids: tuple[int, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: datetime


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    """The toplevel transaction."""
    subxid: int
    """The aborted subtransaction; equal to ``xid`` when the whole transaction aborted."""


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)

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

_BINARY: Final = ord("b")
_NEW: Final = ord("N")
_KEY: Final = ord("K")
_OLD: Final = ord("O")

STREAMABLE: Final = frozenset({b"R", b"Y", b"I", b"U", b"D", b"T", b"M"})
"""First bytes (``payload[:1]``) of messages that belong to the transaction when sent inside a stream.

Inside a stream they carry the xid of their (sub)transaction before their body (see ``stream_xid``).
"""
_CARRIES_XID: Final = frozenset(b"".join(STREAMABLE))
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
        return self._decode(bytes(payload), self._in_stream)

    def decode_streamed(self, payload: bytes | memoryview) -> Message:
        """Decode a payload that was received inside a stream, replayed later (for example on StreamCommit).

        Such payloads carry an xid whatever the decoder's current state; the state is not changed.
        """
        data = bytes(payload)
        if data[:1] and data[0] in _STREAM_CONTROL:
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
            if with_xid and kind in _CARRIES_XID:
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
        return Begin(Lsn(final_lsn), pg_timestamp(ts), txid)

    def _commit(self, data: bytes, pos: int, xid: int | None) -> Commit:
        flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
        return Commit(flags, Lsn(commit_lsn), Lsn(end_lsn), pg_timestamp(ts))

    def _origin(self, data: bytes, pos: int, xid: int | None) -> Origin:
        (lsn,) = _U64.unpack_from(data, 1)
        name, _ = _string(data, 9)
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
        namespace, pos = _string(data, pos + 4)
        name, pos = _string(data, pos)
        identity = chr(data[pos])
        (ncols,) = _U16.unpack_from(data, pos + 1)
        pos += 3
        columns = []
        for _ in range(ncols):
            flags = data[pos]
            column, pos = _string(data, pos + 1)
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
        namespace, pos = _string(data, pos + 4)
        name, _ = _string(data, pos)
        return Type(oid, namespace or "pg_catalog", name, xid)

    # -- changes --------------------------------------------------------------------------------------
    def _insert(self, data: bytes, pos: int, xid: int | None) -> Insert:
        (oid,) = _U32.unpack_from(data, pos)
        if data[pos + 4] != _NEW:
            raise PgOutputError(f"insert into relation {oid}: expected a new tuple ('N'), got {chr(data[pos + 4])!r}")
        new, _ = _tuple(data, pos + 5)
        return Insert(oid, new, xid)

    def _update(self, data: bytes, pos: int, xid: int | None) -> Update:
        (oid,) = _U32.unpack_from(data, pos)
        pos += 4
        marker = data[pos]
        old: TupleData | None = None
        old_kind: OldKind | None = None
        if marker in (_KEY, _OLD):
            old_kind = "K" if marker == _KEY else "O"
            old, pos = _tuple(data, pos + 1)
            marker = data[pos]
        if marker != _NEW:
            raise PgOutputError(f"update of relation {oid}: expected a new tuple ('N'), got {chr(marker)!r}")
        new, _ = _tuple(data, pos + 1)
        return Update(oid, old_kind, old, new, xid)

    def _delete(self, data: bytes, pos: int, xid: int | None) -> Delete:
        (oid,) = _U32.unpack_from(data, pos)
        marker = data[pos + 4]
        if marker not in (_KEY, _OLD):
            raise PgOutputError(f"delete from relation {oid}: expected an old tuple ('K' or 'O'), got {chr(marker)!r}")
        old, _ = _tuple(data, pos + 5)
        return Delete(oid, "K" if marker == _KEY else "O", old, xid)

    def _truncate(self, data: bytes, pos: int, xid: int | None) -> Truncate:
        nrels, options = _U32_B.unpack_from(data, pos)
        oids = struct.unpack_from(f"!{nrels}I", data, pos + 5)
        return Truncate(options & 1 == 1, options & 2 == 2, oids, xid)

    def _message(self, data: bytes, pos: int, xid: int | None) -> LogicalMessage:
        flags, lsn = _MESSAGE_HEAD.unpack_from(data, pos)
        prefix, pos = _string(data, pos + 9)
        (length,) = _U32.unpack_from(data, pos)
        content = data[pos + 4 : pos + 4 + length]
        if len(content) != length:
            raise PgOutputError(f"logical message {prefix!r}: content truncated ({len(content)} of {length} bytes)")
        return LogicalMessage(flags & 1 == 1, Lsn(lsn), prefix, content, xid)


def stream_xid(payload: bytes | memoryview) -> int:
    """The (sub)transaction xid of a ``STREAMABLE`` message received inside a stream, without decoding it."""
    if len(payload) < 5 or payload[0] not in _CARRIES_XID:
        first = bytes(payload[:1])
        raise PgOutputError(f"not a streamed change: a {len(payload)}-byte payload starting with {first!r}")
    return int(_U32.unpack_from(payload, 1)[0])


def _string(data: bytes, pos: int) -> tuple[str, int]:
    """A NUL-terminated string at ``pos`` and the position after it."""
    end = data.index(0, pos)
    return data[pos:end].decode(), end + 1


def _tuple(data: bytes, pos: int) -> tuple[TupleData, int]:
    """TupleData at ``pos`` and the position after it (the hot path: one iteration per column value)."""
    (ncols,) = _U16.unpack_from(data, pos)
    pos += 2
    values: list[Value] = []
    append = values.append
    length_at = _I32.unpack_from
    # An ASCII payload decodes once; its byte offsets are then character offsets (no decode per value).
    text = data.decode("latin-1") if data.isascii() else None
    for _ in range(ncols):
        kind = data[pos]
        if kind == 0x74:  # 't': text value
            (length,) = length_at(data, pos + 1)
            pos += 5 + length
            append(text[pos - length : pos] if text is not None else data[pos - length : pos].decode())
        elif kind == 0x6E:  # 'n': NULL
            append(None)
            pos += 1
        elif kind == 0x75:  # 'u': unchanged TOAST
            append(UNCHANGED_TOAST)
            pos += 1
        elif kind == _BINARY:
            raise PgOutputError(
                "pgoutput sent a value in binary format",
                hint="start replication without the 'binary' option; the engine decodes text values only",
            )
        else:
            raise PgOutputError(f"unknown tuple value kind {chr(kind)!r} (byte 0x{kind:02x})")
    if pos > len(data):
        raise PgOutputError(f"tuple data truncated: needs {pos} bytes, payload has {len(data)}")
    return tuple(values), pos


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
