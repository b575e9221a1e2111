"""Sans-IO decoder of the pgoutput logical replication protocol (versions 1 and 2).

Bytes in, message objects out: one call per XLogData payload, no sockets, no threads. The only
state is whether the decoder is between ``StreamStart`` and ``StreamStop``, because inside a
stream (protocol 2) data messages carry the xid of their (sub)transaction before their body.

Tuple values stay in Postgres text form; turning them into typed values is the job of
:mod:`etl.postgres.codecs`, column by column. A change message does not parse its tuples: it keeps
a ``TupleData`` that points into the payload. Reading its values parses that one tuple;
``tuple_columns`` parses the tuples of a whole batch at once, one array per column, which is what
the change builder does (the per-value loop in Python was the cost of streaming). Messages are
plain slotted records, not frozen dataclasses (frozen ones cost twice as much to create, once per
row); treat them as read-only.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from etl.errors import SourceError
from etl.lsn import Lsn
from etl.postgres.pgtime import PG_EPOCH, pg_timestamp
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
"""A column value: text, ``None`` for SQL NULL, or ``UNCHANGED_TOAST``."""


class TupleData(Sequence[Value]):
    """The column values of one row (pgoutput TupleData), in relation order, parsed when first read.

    ``data[start:]`` holds the tuple as sent: the column count, then each value. Equal to a plain
    tuple of the same values. A malformed tuple raises ``PgOutputError`` when its values are read.
    """

    __slots__ = ("_values", "data", "start")

    def __init__(self, data: bytes, start: int, values: tuple[Value, ...] | None = None) -> None:
        self.data = data
        self.start = start
        self._values = values

    @classmethod
    def of(cls, values: Iterable[Value]) -> TupleData:
        """A tuple of given values, encoded as pgoutput would send them."""
        items = tuple(values)
        parts = [_U16.pack(len(items))]
        for value in items:
            if value is None:
                parts.append(b"n")
            elif isinstance(value, _UnchangedToast):
                parts.append(b"u")
            else:
                encoded = value.encode()
                parts.append(b"t" + _U32.pack(len(encoded)) + encoded)
        return cls(b"".join(parts), 0, items)

    @property
    def values(self) -> tuple[Value, ...]:
        if self._values is None:
            try:
                self._values = _tuple(self.data, self.start)[0]
            except (struct.error, IndexError, UnicodeDecodeError) as exc:
                raise PgOutputError(f"malformed tuple data ({len(self.data)}-byte payload): {exc}") from None
        return self._values

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> Value: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Value, ...]: ...
    def __getitem__(self, index: int | slice) -> Value | tuple[Value, ...]:
        return self.values[index]

    def __iter__(self) -> Iterator[Value]:
        return iter(self.values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TupleData):
            return self.values == other.values
        if isinstance(other, tuple):
            return self.values == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.values)

    def __repr__(self) -> str:
        return f"TupleData{self.values!r}"


OldKind = Literal["K", "O"]
"""``K``: the old row holds the replica identity key columns only; ``O``: every column (REPLICA IDENTITY FULL)."""


@dataclass(slots=True)
class Begin:
    final_lsn: Lsn
    """LSN of the transaction's commit record; every change of the transaction is ordered under it."""
    commit_ts: datetime
    xid: int


@dataclass(slots=True)
class Commit:
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    """The LSN just past the commit record: what the client confirms once the transaction is durable."""
    commit_ts: datetime


@dataclass(slots=True)
class Origin:
    lsn: Lsn
    name: str


@dataclass(slots=True)
class RelationColumn:
    flags_key: bool
    """Part of the replica identity key."""
    name: str
    type_oid: int
    type_modifier: int


@dataclass(slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]
    xid: int | None = None


@dataclass(slots=True)
class Type:
    oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(slots=True)
class Insert:
    relation_oid: int
    new: TupleData
    xid: int | None = None


@dataclass(slots=True)
class Update:
    relation_oid: int
    old_kind: OldKind | None
    old: TupleData | None
    new: TupleData
    xid: int | None = None


@dataclass(slots=True)
class Delete:
    relation_oid: int
    old_kind: OldKind
    old: TupleData
    xid: int | None = None


@dataclass(slots=True)
class Truncate:
    cascade: bool
    restart_identity: bool
    relation_oids: tuple[int, ...]
    xid: int | None = None


@dataclass(slots=True)
class LogicalMessage:
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(slots=True)
class StreamStop:
    pass


@dataclass(slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: datetime


@dataclass(slots=True)
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
_INSERT: Final = ord("I")
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
        return Insert(oid, TupleData(data, pos + 5), xid)

    def _update(self, data: bytes, pos: int, xid: int | None) -> Update:
        (oid,) = _U32.unpack_from(data, pos)
        pos += 4
        marker = data[pos]
        old: TupleData | None = None
        old_kind: OldKind | None = None
        if marker in (_KEY, _OLD):
            old_kind = "K" if marker == _KEY else "O"
            values, end = _tuple(data, pos + 1)  # parsed now: the new tuple starts where it ends
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
        prefix, pos = _string(data, pos + 9)
        (length,) = _U32.unpack_from(data, pos)
        content = data[pos + 4 : pos + 4 + length]
        if len(content) != length:
            raise PgOutputError(f"logical message {prefix!r}: content truncated ({len(content)} of {length} bytes)")
        return LogicalMessage(flags & 1 == 1, Lsn(lsn), prefix, content, xid)


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


def stream_xid(payload: bytes | memoryview) -> int:
    """The (sub)transaction xid of a ``STREAMABLE`` message received inside a stream, without decoding it."""
    if len(payload) < 5 or payload[0] not in _CARRIES_XID:
        first = bytes(payload[:1])
        raise PgOutputError(f"not a streamed change: a {len(payload)}-byte payload starting with {first!r}")
    xid: int = _U32.unpack_from(payload, 1)[0]
    return xid


def _string(data: bytes, pos: int) -> tuple[str, int]:
    """A NUL-terminated string at ``pos`` and the position after it."""
    end = data.index(0, pos)
    return data[pos:end].decode(), end + 1


def _tuple(data: bytes, pos: int) -> tuple[tuple[Value, ...], int]:
    """The values of the TupleData at ``pos`` and the position after it."""
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
        else:
            raise _bad_kind(kind)
    if pos > len(data):
        raise _truncated(pos, len(data))
    return tuple(values), pos


def _bad_kind(kind: int) -> PgOutputError:
    if kind == _BINARY:
        return PgOutputError(
            "pgoutput sent a value in binary format",
            hint="start replication without the 'binary' option; the engine decodes text values only",
        )
    return PgOutputError(f"unknown tuple value kind {chr(kind)!r} (byte 0x{kind:02x})")


def _truncated(needed: int, size: int) -> PgOutputError:
    return PgOutputError(f"tuple data truncated: needs {needed} bytes, payload has {size}")


# -- many tuples at once --------------------------------------------------------------------------


class TupleWidthError(ValueError):
    """Tuples whose column count differs from the expected width."""

    def __init__(self, widths: list[int]) -> None:
        super().__init__(f"tuples with {widths} columns")
        self.widths = widths


@dataclass(frozen=True)
class TupleColumns:
    """The values of many tuples, column by column."""

    text: list[pa.Array]
    """Per column, a ``pa.string()`` array of the text values; null for NULL, unchanged TOAST and absent rows."""
    unchanged: list[npt.NDArray[np.bool_] | None]
    """Per column, a mask of the rows whose value is unchanged TOAST; ``None`` when there is none."""


_Scalar = TypeVar("_Scalar", bound=np.generic)
_TEXT_KIND: Final = ord("t")
_NULL_KIND: Final = ord("n")
_TOAST_KIND: Final = ord("u")
_KNOWN_KIND: Final = np.isin(np.arange(256), [_TEXT_KIND, _NULL_KIND, _TOAST_KIND])
_PADDING: Final = bytes(8)


def tuple_columns(payloads: Sequence[bytes | None], starts: Sequence[int], width: int) -> TupleColumns:
    """Parse the tuples of ``width`` columns at ``payloads[i][starts[i]:]`` into one array per column.

    A ``None`` payload is an absent row: null in every column. (A ``TupleData`` is ``data`` and ``start``.)

    The tuples' payloads are joined into one buffer and parsed column by column, each step over every
    row at once: the position of column ``c`` in every row gives the kinds and lengths of all values of
    ``c``, and so the position of column ``c + 1``. Each column's text is then gathered by Arrow from
    the buffer. Raises ``TupleWidthError`` for tuples of another width and ``PgOutputError`` for
    malformed ones (checked as strictly as ``TupleData`` reading them one by one).
    """
    n = len(payloads)
    present = None
    found = cast(Sequence[bytes], payloads)
    if None in payloads:  # absent rows: parse the others, spread the result at the end
        present = np.flatnonzero([p is not None for p in payloads])
        found = [p for p in payloads if p is not None]
        starts = [starts[i] for i in present.tolist()]
    if not found:
        return TupleColumns([pa.nulls(n, pa.string()) for _ in range(width)], [None] * width)
    rows = len(found)
    sizes = np.fromiter(map(len, found), np.int64, rows)
    ends = np.cumsum(sizes)
    buffer = b"".join([*found, _PADDING])  # reads of a length just past a payload stay inside the buffer
    data = np.frombuffer(buffer, np.uint8)
    u16, u32 = _big_endian(buffer, ">u2"), _big_endian(buffer, ">u4")
    pos = ends - sizes + np.fromiter(starts, np.int64, rows)

    broken = pos + 2 > ends
    counts = np.where(broken, width, u16[np.minimum(pos, ends)])
    if (counts != width).any():
        raise TupleWidthError(sorted(set(counts.tolist())))
    pos += 2
    stride = 2 * width + 1
    bounds = np.empty((rows, stride), np.int64)
    """Per row: where each value's header and text start, then where the tuple ends (Arrow binary offsets)."""
    kinds = np.empty((width, rows), np.uint8)
    for c in range(width):
        broken |= pos >= ends
        pos = np.minimum(pos, ends)
        kind = kinds[c] = data[pos]
        text = kind == _TEXT_KIND
        bad = ~_KNOWN_KIND[kind] & ~broken
        if bad.any():
            raise _bad_kind(int(kind[bad][0]))
        value = pos + 1 + 4 * text
        bounds[:, 2 * c] = pos
        bounds[:, 2 * c + 1] = value
        pos = value + np.where(text, u32[pos + 1], 0)
    broken |= pos > ends
    if broken.any():
        row = int(np.argmax(broken))
        raise _truncated(int(pos[row] - ends[row] + sizes[row]), int(sizes[row]))
    bounds[:, 2 * width] = pos

    segments = pa.Array.from_buffers(
        pa.large_binary(), bounds.size - 1, [None, pa.py_buffer(bounds), pa.py_buffer(buffer)]
    )
    first = np.arange(rows, dtype=np.int64) * stride
    text_columns: list[pa.Array] = []
    unchanged: list[npt.NDArray[np.bool_] | None] = []
    for c in range(width):
        valid = kinds[c] == _TEXT_KIND
        indices = first + (2 * c + 1)
        toast = kinds[c] == _TOAST_KIND
        if present is not None:
            valid, indices, toast = _spread(valid, present, n), _spread(indices, present, n), _spread(toast, present, n)
        try:
            column = segments.take(pa.array(indices, mask=~valid)).cast(pa.string())
        except pa.ArrowInvalid as exc:
            raise PgOutputError(
                f"a text value is not valid UTF-8: {exc}",
                hint="the source database must use the UTF8 encoding",
            ) from None
        text_columns.append(column)
        unchanged.append(toast if toast.any() else None)
    return TupleColumns(text_columns, unchanged)


def _big_endian(buffer: bytes, dtype: str) -> npt.NDArray[np.unsignedinteger[Any]]:
    """``buffer`` as big-endian integers starting at every byte: element ``i`` is the one at offset ``i``."""
    size = np.dtype(dtype).itemsize
    return np.ndarray((len(buffer) - size + 1,), dtype, buffer, strides=(1,))


def _spread(values: npt.NDArray[_Scalar], present: npt.NDArray[np.intp], n: int) -> npt.NDArray[_Scalar]:
    """``values`` of the present rows placed at their positions among ``n`` rows (zero elsewhere)."""
    spread = np.zeros(n, values.dtype)
    spread[present] = values
    return spread


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
