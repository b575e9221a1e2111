"""Many tuples at once: the rows of a batch parsed column by column, into Arrow arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from etl.postgres.pgoutput.tuples import PgOutputError, bad_kind, truncated


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
            raise bad_kind(int(kind[bad][0]))
        value = pos + 1 + 4 * text
        bounds[:, 2 * c] = pos
        bounds[:, 2 * c + 1] = value
        pos = value + np.where(text, u32[pos + 1], 0)
    broken |= pos > ends
    if broken.any():
        row = int(np.argmax(broken))
        raise truncated(int(pos[row] - ends[row] + sizes[row]), int(sizes[row]))
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
