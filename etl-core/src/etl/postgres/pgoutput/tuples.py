"""Tuple data: a row's column values as pgoutput sends them, in Postgres text form, parsed when read."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Final, overload

from etl.errors import SourceError

_U16: Final = struct.Struct("!H")
_U32: Final = struct.Struct("!I")
_I32: Final = struct.Struct("!i")
_BINARY: Final = ord("b")


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
                self._values = read_tuple(self.data, self.start)[0]
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


def read_string(data: bytes, pos: int) -> tuple[str, int]:
    """A NUL-terminated string at ``pos`` and the position after it."""
    end = data.index(0, pos)
    return data[pos:end].decode(), end + 1


def read_tuple(data: bytes, pos: int) -> tuple[tuple[Value, ...], int]:
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
            raise bad_kind(kind)
    if pos > len(data):
        raise truncated(pos, len(data))
    return tuple(values), pos


def bad_kind(kind: int) -> PgOutputError:
    if kind == _BINARY:
        return PgOutputError(
            "pgoutput sent a value in binary format",
            hint="start replication without the 'binary' option; the engine decodes text values only",
        )
    return PgOutputError(f"unknown tuple value kind {chr(kind)!r} (byte 0x{kind:02x})")


def truncated(needed: int, size: int) -> PgOutputError:
    return PgOutputError(f"tuple data truncated: needs {needed} bytes, payload has {size}")
