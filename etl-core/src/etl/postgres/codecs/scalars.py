"""The codec of each built-in scalar type this engine maps to an Arrow type of its own; others stay text."""

from __future__ import annotations

from functools import lru_cache
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from etl.postgres.codecs.base import TEXT, BadValue, Codec, cast_to, show, with_slow_path
from etl.postgres.codecs.calendar import (
    decode_interval,
    decode_time,
    irregular_date,
    irregular_timestamp,
    parse_date,
    parse_timestamp,
)
from etl.postgres.codecs.numeric import NUMERIC_OID, numeric_codec


@lru_cache(maxsize=512)
def scalar_codec(type_oid: int, typmod: int) -> Codec:
    if type_oid == NUMERIC_OID:
        return numeric_codec(typmod)
    found = _SCALARS.get(type_oid)
    return found if found is not None else TEXT


def _decode_bool(chunk: pa.Array) -> pa.Array:
    is_true = pc.equal(chunk, "t")
    bad = pc.invert(pc.fill_null(pc.or_(is_true, pc.equal(chunk, "f")), True))
    if pc.any(bad).as_py():
        raise BadValue(f"not a boolean in text form ('t' or 'f'): {show(pc.filter(chunk, bad)[0].as_py())}")
    return is_true


def _decode_bytea(chunk: pa.Array) -> pa.Array:
    """``\\x``-prefixed hex -> binary, decoding the whole chunk's hex digits in one call."""
    not_hex = pc.invert(pc.starts_with(chunk, "\\x"))
    if pc.any(not_hex).as_py():
        raise BadValue(
            f"bytea value not in hex form: {show(pc.filter(chunk, not_hex)[0].as_py())}",
            hint="set bytea_output = 'hex' on the source connection",
        )
    digits = pc.utf8_slice_codeunits(pc.fill_null(chunk, "\\x"), 2)
    if pc.any(pc.not_equal(pc.bit_wise_and(pc.binary_length(digits), 1), 0)).as_py():
        raise BadValue("bytea value with an odd number of hex digits")
    offsets_buffer, data_buffer = digits.buffers()[1:3]
    offsets = pa.Array.from_buffers(pa.int32(), len(digits) + 1, [None, offsets_buffer], offset=digits.offset)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    try:
        data = bytes.fromhex(data_buffer[start:end].to_pybytes().decode("ascii")) if end > start else b""
    except (ValueError, UnicodeDecodeError):
        data = b""
    if 2 * len(data) != end - start:  # (fromhex also skips whitespace, which would shift every value)
        raise BadValue("bytea value with a character that is not a hex digit")
    new_offsets = pc.cast(pc.divide(pc.subtract(offsets, start), 2), pa.int32())
    validity = pc.is_valid(chunk).buffers()[1] if chunk.null_count else None
    return pa.Array.from_buffers(
        pa.binary(), len(chunk), [validity, new_offsets.buffers()[1], pa.py_buffer(data)], chunk.null_count
    )


_DATE_DECODE: Final = with_slow_path(pa.date32(), irregular_date, parse_date)

_SCALARS: Final[dict[int, Codec]] = {
    16: Codec(pa.bool_(), _decode_bool),
    17: Codec(pa.binary(), _decode_bytea),
    20: Codec(pa.int64(), cast_to(pa.int64())),
    21: Codec(pa.int16(), cast_to(pa.int16())),
    23: Codec(pa.int32(), cast_to(pa.int32())),
    26: Codec(pa.int64(), cast_to(pa.int64())),  # oid: uint32 range
    700: Codec(pa.float32(), cast_to(pa.float32())),
    701: Codec(pa.float64(), cast_to(pa.float64())),
    1082: Codec(pa.date32(), _DATE_DECODE),
    1083: Codec(pa.time64("us"), decode_time),
    1114: Codec(pa.timestamp("us"), with_slow_path(pa.timestamp("us"), irregular_timestamp, parse_timestamp)),
    1184: Codec(
        pa.timestamp("us", tz="UTC"),
        with_slow_path(pa.timestamp("us", tz="UTC"), irregular_timestamp, parse_timestamp),
    ),
    1186: Codec(pa.month_day_nano_interval(), decode_interval),
}
