"""What every codec is made of: a target Arrow type and a decode function, the error for a value that cannot be
converted, and the vectorised cast with a value-by-value fallback for rare shapes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


class BadValue(ValueError):
    """A value the codec cannot convert; ``decode_text_column`` adds the column and a hint."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


Decode = Callable[[pa.Array], pa.Array]
"""Converts one chunk (a ``pa.string()`` array) to the codec's type."""


@dataclass(frozen=True)
class Codec:
    type: pa.DataType
    decode: Decode


def cast_to(target: pa.DataType) -> Decode:
    def decode(chunk: pa.Array) -> pa.Array:
        try:
            return pc.cast(chunk, target)
        except pa.ArrowInvalid as exc:
            raise BadValue(str(exc)) from None

    return decode


def keep(chunk: pa.Array) -> pa.Array:
    return chunk


TEXT: Final = Codec(pa.string(), keep)
"""Values kept as their text: types without a mapping of their own."""


def with_slow_path(
    target: pa.DataType, irregular: Callable[[pa.Array], pa.Array], parse: Callable[[str], Any]
) -> Decode:
    """Cast the regular values vectorised; parse the rest (``irregular`` marks them) one by one.

    The whole chunk is cast first: Arrow rejects every irregular form (infinities, BC, years past
    9999), so a chunk without one needs no mask. When the vectorised cast rejects a value that
    looked regular, every value takes the slow path, which either understands it or names it.
    """
    fast = cast_to(target)

    def slow(values: Sequence[str | None]) -> pa.Array:
        return pa.array([None if v is None else parse(v) for v in values], type=target)

    def decode(chunk: pa.Array) -> pa.Array:
        try:
            return fast(chunk)
        except BadValue:
            pass
        mask = pc.fill_null(irregular(chunk), False)
        try:
            regular = fast(pc.if_else(mask, pa.scalar(None, pa.string()), chunk))
        except BadValue:
            return slow(chunk.to_pylist())
        return pc.replace_with_mask(regular, mask, slow(pc.filter(chunk, mask).to_pylist()))

    return decode


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
