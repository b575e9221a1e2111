"""``numeric``: an Arrow decimal when the column's precision allows one, else its exact text."""

from __future__ import annotations

from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from etl.postgres.codecs.base import TEXT, BadValue, Codec, cast_to

NUMERIC_OID: Final = 1700

_NUMERIC_SPECIALS: Final = ("NaN", "Infinity", "-Infinity")


def numeric_codec(typmod: int) -> Codec:
    if typmod < 4:
        return TEXT  # unconstrained: the exact text, including NaN and +-Infinity
    precision = ((typmod - 4) >> 16) & 0xFFFF
    scale = (((typmod - 4) & 0x7FF) ^ 1024) - 1024  # an 11-bit signed scale (negative since Postgres 15)
    if precision <= 38:
        target: pa.DataType = pa.decimal128(precision, scale)
    elif precision <= 76:
        target = pa.decimal256(precision, scale)
    else:
        return TEXT
    cast = cast_to(target)

    def decode(chunk: pa.Array) -> pa.Array:
        try:
            return cast(chunk)
        except BadValue:  # say why when it is one of the special values Arrow's decimals cannot hold
            # Built here, not at import: pa.array of a list imports pandas (a third of a second) when installed.
            special = pc.is_in(chunk, value_set=pa.array(_NUMERIC_SPECIALS, pa.string()))
            if pc.any(special).as_py():
                value = pc.filter(chunk, special)[0].as_py()
                raise BadValue(
                    f"{value} in a numeric({precision},{scale}) column cannot be stored as {target}",
                    hint="change the column to unconstrained numeric (kept as exact text) or replace the value",
                ) from None
            raise

    return Codec(target, decode)
