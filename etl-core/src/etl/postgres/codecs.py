"""Postgres text values -> Arrow: the one place that maps Postgres types to Arrow types.

Input is always a string array of values in Postgres text output form (SQL NULL is null), read
from COPY or from pgoutput; output is an Arrow array of ``arrow_type(column)``. Conversions are
vectorised with ``pyarrow.compute``; only rare shapes (infinite or BC dates, intervals, arrays)
are parsed value by value. The session settings every connection pins (``TimeZone=UTC``,
``DateStyle=ISO``, ``IntervalStyle=postgres``, ``extra_float_digits=3``, ``bytea_output=hex``)
fix the text forms parsed here. The mapping is documented for users in ``docs/types.md``.

Nothing becomes NULL that was not NULL, and nothing is silently changed: a value that cannot be
represented raises ``TableError``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import lru_cache
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from etl.errors import TableError
from etl.schema import ColumnSchema

# Built-in types of pg_catalog (base, range and multirange types; OIDs are stable across versions).
BUILTIN_TYPES: Final[dict[int, str]] = {
    16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 22: "int2vector", 23: "int4",
    24: "regproc", 25: "text", 26: "oid", 27: "tid", 28: "xid", 29: "cid", 30: "oidvector", 114: "json",
    142: "xml", 194: "pg_node_tree", 600: "point", 601: "lseg", 602: "path", 603: "box", 604: "polygon",
    628: "line", 650: "cidr", 700: "float4", 701: "float8", 718: "circle", 774: "macaddr8", 790: "money",
    829: "macaddr", 869: "inet", 1033: "aclitem", 1042: "bpchar", 1043: "varchar", 1082: "date", 1083: "time",
    1114: "timestamp", 1184: "timestamptz", 1186: "interval", 1266: "timetz", 1560: "bit", 1562: "varbit",
    1700: "numeric", 1790: "refcursor", 2202: "regprocedure", 2203: "regoper", 2204: "regoperator",
    2205: "regclass", 2206: "regtype", 2950: "uuid", 2970: "txid_snapshot", 3220: "pg_lsn", 3361: "pg_ndistinct",
    3402: "pg_dependencies", 3614: "tsvector", 3615: "tsquery", 3642: "gtsvector", 3734: "regconfig",
    3769: "regdictionary", 3802: "jsonb", 3904: "int4range", 3906: "numrange", 3908: "tsrange",
    3910: "tstzrange", 3912: "daterange", 3926: "int8range", 4072: "jsonpath", 4089: "regnamespace",
    4096: "regrole", 4191: "regcollation", 4451: "int4multirange", 4532: "nummultirange", 4533: "tsmultirange",
    4534: "tstzmultirange", 4535: "datemultirange", 4536: "int8multirange", 4600: "pg_brin_bloom_summary",
    4601: "pg_brin_minmax_multi_summary", 5017: "pg_mcv_list", 5038: "pg_snapshot", 5069: "xid8",
}  # fmt: skip

# Built-in array types: array type OID -> element type OID (the array's name is "_" + the element's).
BUILTIN_ARRAYS: Final[dict[int, int]] = {
    143: 142, 199: 114, 271: 5069, 629: 628, 651: 650, 719: 718, 775: 774, 791: 790, 1000: 16, 1001: 17,
    1002: 18, 1003: 19, 1005: 21, 1006: 22, 1007: 23, 1008: 24, 1009: 25, 1010: 27, 1011: 28, 1012: 29,
    1013: 30, 1014: 1042, 1015: 1043, 1016: 20, 1017: 600, 1018: 601, 1019: 602, 1020: 603, 1021: 700,
    1022: 701, 1027: 604, 1028: 26, 1034: 1033, 1040: 829, 1041: 869, 1115: 1114, 1182: 1082, 1183: 1083,
    1185: 1184, 1187: 1186, 1231: 1700, 1270: 1266, 1561: 1560, 1563: 1562, 2201: 1790, 2207: 2202,
    2208: 2203, 2209: 2204, 2210: 2205, 2211: 2206, 2949: 2970, 2951: 2950, 3221: 3220, 3643: 3614,
    3644: 3642, 3645: 3615, 3735: 3734, 3770: 3769, 3807: 3802, 3905: 3904, 3907: 3906, 3909: 3908,
    3911: 3910, 3913: 3912, 3927: 3926, 4073: 4072, 4090: 4089, 4097: 4096, 4192: 4191, 5039: 5038,
    6150: 4451, 6151: 4532, 6152: 4533, 6153: 4534, 6155: 4535, 6157: 4536,
}  # fmt: skip

_BOX_ARRAY: Final = 1020  # the only built-in array whose elements are separated by ';'

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
_US_PER_DAY: Final = 86_400_000_000
_UNIX_EPOCH_DAYS: Final = 719_468  # days from 0000-03-01 to 1970-01-01 (proleptic Gregorian)

NUMERIC_OID: Final = 1700

_SETTINGS_HINT: Final = (
    "values are parsed in the text forms of the session settings every source connection pins"
    " (TimeZone=UTC, DateStyle=ISO, IntervalStyle=postgres, extra_float_digits=3, bytea_output=hex)"
)


class _BadValue(ValueError):
    """A value the codec cannot convert; ``decode_text_column`` adds the column and a hint."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


Decode = Callable[[pa.Array], pa.Array]
"""Converts one chunk (a ``pa.string()`` array) to the codec's type."""


@dataclass(frozen=True)
class _Codec:
    type: pa.DataType
    decode: Decode


# -- public API ----------------------------------------------------------------------------------------


def arrow_type(column: ColumnSchema) -> pa.DataType:
    """The Arrow type that holds the column's values."""
    return _codec_of(column).type


def arrow_field(column: ColumnSchema) -> pa.Field:
    """The column as a (nullable) Arrow field carrying its Postgres type in metadata.

    Metadata keys: ``pg.type_oid``, ``pg.type_name`` and ``pg.typmod``. Fields are always nullable:
    change tables hold deletes with key columns only and truncate rows; ``ColumnSchema.nullable``
    tells whether the source column is NOT NULL.
    """
    metadata = {
        b"pg.type_oid": str(column.type_oid).encode(),
        b"pg.type_name": type_name(column).encode(),
        b"pg.typmod": str(column.type_modifier).encode(),
    }
    return pa.field(column.name, arrow_type(column), nullable=True, metadata=metadata)


def type_name(column: ColumnSchema) -> str:
    """The column's type name: its ``type_name`` when known, else the built-in ``pg_type`` name, else ``""``."""
    if column.type_name:
        return column.type_name
    if column.type_oid in BUILTIN_ARRAYS:
        return "_" + BUILTIN_TYPES[BUILTIN_ARRAYS[column.type_oid]]
    return BUILTIN_TYPES.get(column.type_oid, "")


def decode_text_column(column: ColumnSchema, values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Convert a string array of Postgres text values (nulls are SQL NULL) to ``arrow_type(column)``.

    Raises ``TableError`` naming the column when a value cannot be represented.
    """
    codec = _codec_of(column)
    try:
        if isinstance(values, pa.ChunkedArray):
            return pa.chunked_array([codec.decode(_as_string(chunk)) for chunk in values.chunks], type=codec.type)
        return codec.decode(_as_string(values))
    except _BadValue as exc:
        raise TableError(
            f"column {column.name!r} ({type_name(column) or column.type_oid}): {exc}",
            hint=exc.hint or _SETTINGS_HINT,
        ) from None


def _as_string(chunk: pa.Array) -> pa.Array:
    return chunk if chunk.type == pa.string() else chunk.cast(pa.string())


def _codec_of(column: ColumnSchema) -> _Codec:
    return _codec_for(column.type_oid, column.type_modifier, column.type_name)


@lru_cache(maxsize=1024)
def _codec_for(type_oid: int, typmod: int, type_name: str) -> _Codec:
    depth = _array_depth(type_oid, type_name)
    if depth:
        delimiter = ";" if type_oid == _BOX_ARRAY else ","
        return _array_codec(_scalar_codec(BUILTIN_ARRAYS.get(type_oid, 0), typmod), depth, delimiter)
    return _scalar_codec(type_oid, typmod)


def _array_depth(type_oid: int, type_name: str) -> int:
    """Dimensions of an array column: the ``[]`` in its type name (one when absent), 0 for non-arrays."""
    brackets = type_name.count("[]")
    if type_oid in BUILTIN_ARRAYS:
        return max(brackets, 1)
    return brackets if type_name.endswith("[]") else 0


def python_values(values: pa.Array | pa.ChunkedArray) -> list[Any]:
    """Python values of an Arrow column made by this module (``to_pylist`` where Python can hold the values).

    Dates and timestamps that Python's ``date``/``datetime`` cannot hold (+-infinity, BC, years past
    9999) come back as their Postgres text form, e.g. ``'infinity'`` or ``'0044-03-15 BC'``.
    """
    try:
        return values.to_pylist()  # type: ignore[no-any-return]
    except OverflowError:
        if isinstance(values, pa.ChunkedArray):
            return [value for chunk in values.chunks for value in python_values(chunk)]
        kind = values.type
        if pa.types.is_date32(kind):
            return [_date_value(days) for days in values.cast(pa.int32()).to_pylist()]
        if pa.types.is_timestamp(kind):
            return [_timestamp_value(us, kind.tz is not None) for us in values.cast(pa.int64()).to_pylist()]
        valid = values.is_valid().to_pylist()
        if pa.types.is_list(kind):
            flat = python_values(values.values)
            offsets = values.offsets.to_pylist()
            return [flat[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(values))]
        if pa.types.is_struct(kind):
            names = [kind.field(i).name for i in range(kind.num_fields)]
            rows = zip(*(python_values(values.field(i)) for i in range(kind.num_fields)), strict=True)
            return [dict(zip(names, row, strict=True)) if ok else None for ok, row in zip(valid, rows, strict=True)]
        raise


def _date_value(days: int | None) -> date | str | None:
    if days is None:
        return None
    if days in (INT32_MAX, INT32_MIN):
        return "infinity" if days == INT32_MAX else "-infinity"
    year, month, day = civil_from_days(days)
    if 1 <= year <= 9999:
        return date(year, month, day)
    return _pg_date_text(year, month, day)


def _timestamp_value(micros: int | None, aware: bool) -> datetime | str | None:
    if micros is None:
        return None
    if micros in (INT64_MAX, INT64_MIN):
        return "infinity" if micros == INT64_MAX else "-infinity"
    days, rest = divmod(micros, _US_PER_DAY)
    year, month, day = civil_from_days(days)
    seconds, fraction = divmod(rest, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    if 1 <= year <= 9999:
        return datetime(year, month, day, hour, minute, second, fraction, UTC if aware else None)
    text = f"{hour:02d}:{minute:02d}:{second:02d}" + (f".{fraction:06d}".rstrip("0") if fraction else "")
    date_text = _pg_date_text(year, month, day)
    body, bc = _strip_bc(date_text)
    return f"{body} {text}{'+00' if aware else ''}{' BC' if bc else ''}"


def _pg_date_text(year: int, month: int, day: int) -> str:
    """Postgres's ISO text of a date given with an astronomical year (0 is 1 BC)."""
    return f"{year:04d}-{month:02d}-{day:02d}" if year >= 1 else f"{1 - year:04d}-{month:02d}-{day:02d} BC"


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(astronomical year, month, day) of the proleptic Gregorian date ``days`` after 1970-01-01."""
    z = days + _UNIX_EPOCH_DAYS
    era = z // 146_097
    day_of_era = z - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + 3 if shifted_month < 10 else shifted_month - 9
    return year_of_era + era * 400 + (month <= 2), month, day


# -- scalar codecs -------------------------------------------------------------------------------------


@lru_cache(maxsize=512)
def _scalar_codec(type_oid: int, typmod: int) -> _Codec:
    if type_oid == NUMERIC_OID:
        return _numeric_codec(typmod)
    found = _SCALARS.get(type_oid)
    return found if found is not None else _TEXT


def _cast(target: pa.DataType) -> Decode:
    def decode(chunk: pa.Array) -> pa.Array:
        try:
            return pc.cast(chunk, target)
        except pa.ArrowInvalid as exc:
            raise _BadValue(str(exc)) from None

    return decode


def _keep(chunk: pa.Array) -> pa.Array:
    return chunk


def _decode_bool(chunk: pa.Array) -> pa.Array:
    is_true = pc.equal(chunk, "t")
    bad = pc.invert(pc.fill_null(pc.or_(is_true, pc.equal(chunk, "f")), True))
    if pc.any(bad).as_py():
        raise _BadValue(f"not a boolean in text form ('t' or 'f'): {_show(pc.filter(chunk, bad)[0].as_py())}")
    return is_true


def _decode_bytea(chunk: pa.Array) -> pa.Array:
    """``\\x``-prefixed hex -> binary, decoding the whole chunk's hex digits in one call."""
    not_hex = pc.invert(pc.starts_with(chunk, "\\x"))
    if pc.any(not_hex).as_py():
        raise _BadValue(
            f"bytea value not in hex form: {_show(pc.filter(chunk, not_hex)[0].as_py())}",
            hint="set bytea_output = 'hex' on the source connection",
        )
    digits = pc.utf8_slice_codeunits(pc.fill_null(chunk, "\\x"), 2)
    if pc.any(pc.not_equal(pc.bit_wise_and(pc.binary_length(digits), 1), 0)).as_py():
        raise _BadValue("bytea value with an odd number of hex digits")
    offsets_buffer, data_buffer = digits.buffers()[1:3]
    offsets = pa.Array.from_buffers(pa.int32(), len(digits) + 1, [None, offsets_buffer], offset=digits.offset)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    try:
        data = bytes.fromhex(data_buffer[start:end].to_pybytes().decode("ascii")) if end > start else b""
    except (ValueError, UnicodeDecodeError):
        data = b""
    if 2 * len(data) != end - start:  # (fromhex also skips whitespace, which would shift every value)
        raise _BadValue("bytea value with a character that is not a hex digit")
    new_offsets = pc.cast(pc.divide(pc.subtract(offsets, start), 2), pa.int32())
    validity = pc.is_valid(chunk).buffers()[1] if chunk.null_count else None
    return pa.Array.from_buffers(
        pa.binary(), len(chunk), [validity, new_offsets.buffers()[1], pa.py_buffer(data)], chunk.null_count
    )


_NUMERIC_SPECIALS: Final = pa.array(["NaN", "Infinity", "-Infinity"])


def _numeric_codec(typmod: int) -> _Codec:
    if typmod < 4:
        return _TEXT  # unconstrained: the exact text, including NaN and +-Infinity
    precision = ((typmod - 4) >> 16) & 0xFFFF
    scale = (((typmod - 4) & 0x7FF) ^ 1024) - 1024  # an 11-bit signed scale (negative since Postgres 15)
    if precision <= 38:
        target: pa.DataType = pa.decimal128(precision, scale)
    elif precision <= 76:
        target = pa.decimal256(precision, scale)
    else:
        return _TEXT
    cast = _cast(target)

    def decode(chunk: pa.Array) -> pa.Array:
        try:
            return cast(chunk)
        except _BadValue:  # say why when it is one of the special values Arrow's decimals cannot hold
            special = pc.is_in(chunk, value_set=_NUMERIC_SPECIALS)
            if pc.any(special).as_py():
                value = pc.filter(chunk, special)[0].as_py()
                raise _BadValue(
                    f"{value} in a numeric({precision},{scale}) column cannot be stored as {target}",
                    hint="change the column to unconstrained numeric (kept as exact text) or replace the value",
                ) from None
            raise

    return _Codec(target, decode)


def _with_slow_path(
    target: pa.DataType, irregular: Callable[[pa.Array], pa.Array], parse: Callable[[str], Any]
) -> Decode:
    """Cast the regular values vectorised; parse the rest (``irregular`` marks them) one by one.

    The whole chunk is cast first: Arrow rejects every irregular form (infinities, BC, years past
    9999), so a chunk without one needs no mask. When the vectorised cast rejects a value that
    looked regular, every value takes the slow path, which either understands it or names it.
    """
    fast = _cast(target)

    def slow(values: Sequence[str | None]) -> pa.Array:
        return pa.array([None if v is None else parse(v) for v in values], type=target)

    def decode(chunk: pa.Array) -> pa.Array:
        try:
            return fast(chunk)
        except _BadValue:
            pass
        mask = pc.fill_null(irregular(chunk), False)
        try:
            regular = fast(pc.if_else(mask, pa.scalar(None, pa.string()), chunk))
        except _BadValue:
            return slow(chunk.to_pylist())
        return pc.replace_with_mask(regular, mask, slow(pc.filter(chunk, mask).to_pylist()))

    return decode


def _char_at(chunk: pa.Array, index: int) -> pa.Array:
    return pc.utf8_slice_codeunits(chunk, index, index + 1)


def _irregular_date(chunk: pa.Array) -> pa.Array:
    return pc.not_equal(pc.binary_length(chunk), 10)  # not YYYY-MM-DD: infinity, BC, years past 9999


def _irregular_timestamp(chunk: pa.Array) -> pa.Array:
    return pc.or_(pc.not_equal(_char_at(chunk, 4), "-"), pc.ends_with(chunk, " BC"))


_DATE: Final = re.compile(r"(\d+)-(\d\d)-(\d\d)")
_TIMESTAMP: Final = re.compile(
    r"(\d+)-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::?(\d\d))?(?::(\d\d))?)?"
)


def _parse_date(text: str) -> int:
    """Days since 1970-01-01; +-infinity map to the int32 extremes."""
    if text in ("infinity", "-infinity"):
        return INT32_MAX if text == "infinity" else INT32_MIN
    body, bc = _strip_bc(text)
    match = _DATE.fullmatch(body)
    if match is None:
        raise _BadValue(f"not an ISO date: {_show(text)}", hint="set DateStyle = 'ISO' on the source connection")
    year, month, day = (int(g) for g in match.groups())
    return days_from_civil(1 - year if bc else year, month, day)


def _parse_timestamp(text: str) -> int:
    """Microseconds since 1970-01-01 00:00 UTC; +-infinity map to the int64 extremes."""
    if text in ("infinity", "-infinity"):
        return INT64_MAX if text == "infinity" else INT64_MIN
    body, bc = _strip_bc(text)
    match = _TIMESTAMP.fullmatch(body)
    if match is None:
        raise _BadValue(f"not an ISO timestamp: {_show(text)}", hint="set DateStyle = 'ISO' on the source connection")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, sign, offset_h, offset_m, offset_s = match.groups()[6:]
    days = days_from_civil(1 - year if bc else year, month, day)
    micros = days * _US_PER_DAY + ((hour * 60 + minute) * 60 + second) * 1_000_000
    micros += int((fraction or "").ljust(6, "0") or 0)
    if sign is not None:
        offset = (int(offset_h) * 60 + int(offset_m or 0)) * 60 + int(offset_s or 0)
        micros -= (offset if sign == "+" else -offset) * 1_000_000
    if not INT64_MIN < micros < INT64_MAX:  # the extremes stand for -infinity and infinity
        raise _BadValue(
            f"timestamp {text!r} is outside Arrow's range (microseconds since 1970 in 64 bits: up to 294247 AD)",
            hint="replace the value, or change the column's type to text",
        )
    return micros


def _strip_bc(text: str) -> tuple[str, bool]:
    return (text[:-3], True) if text.endswith(" BC") else (text, False)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC is year 0)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - _UNIX_EPOCH_DAYS


def _decode_time(chunk: pa.Array) -> pa.Array:
    """``HH:MM:SS[.ffffff]`` -> time64[us], by parsing it as a timestamp on 1970-01-01."""
    if pc.any(pc.starts_with(chunk, "24:")).as_py():
        raise _BadValue(
            "24:00:00 cannot be stored as Arrow time64 (whose day ends before 24:00)",
            hint="store midnight as 00:00:00, or change the column's type to text or interval",
        )
    stamped = pc.binary_join_element_wise("1970-01-01 ", chunk, "")
    try:
        micros = pc.cast(pc.cast(stamped, pa.timestamp("us")), pa.int64())
    except pa.ArrowInvalid as exc:
        raise _BadValue(str(exc).replace("1970-01-01 ", "")) from None
    return micros.view(pa.time64("us"))


_INTERVAL_UNITS: Final = {
    "year": 12, "years": 12, "mon": 1, "mons": 1, "day": 0, "days": 0,
}  # fmt: skip


def _parse_interval(text: str) -> tuple[int, int, int]:
    """IntervalStyle postgres (``1 year 2 mons -3 days 04:05:06.7``) -> (months, days, nanoseconds)."""
    if text in ("infinity", "-infinity"):  # Postgres 17+: every field at its extreme, as Postgres stores it
        return (INT32_MAX, INT32_MAX, INT64_MAX) if text == "infinity" else (INT32_MIN, INT32_MIN, INT64_MIN)
    months = days = micros = 0
    parts = text.split()
    i = 0
    try:
        while i < len(parts):
            part = parts[i]
            if ":" in part:
                negative = part.startswith("-")
                hours, minutes, seconds = part.lstrip("+-").split(":")
                whole, _, fraction = seconds.partition(".")
                time = ((int(hours) * 60 + int(minutes)) * 60 + int(whole)) * 1_000_000 + int(fraction.ljust(6, "0"))
                micros += -time if negative else time
                i += 1
                continue
            amount, unit = int(part), parts[i + 1]
            if unit not in _INTERVAL_UNITS:
                raise ValueError(unit)
            if _INTERVAL_UNITS[unit]:
                months += amount * _INTERVAL_UNITS[unit]
            else:
                days += amount
            i += 2
    except (ValueError, IndexError):
        raise _BadValue(
            f"not an interval in postgres style: {_show(text)}",
            hint="set IntervalStyle = 'postgres' on the source connection",
        ) from None
    nanos = micros * 1000
    if not INT64_MIN <= nanos <= INT64_MAX:
        raise _BadValue(f"interval {text!r} does not fit Arrow month_day_nano (its time part exceeds 292 years)")
    return months, days, nanos


_MONTH_DAY_NANO: Final = struct.Struct("<iiq")


def _decode_interval(chunk: pa.Array) -> pa.Array:
    """Parse each value; write Arrow's month_day_nano layout (int32, int32, int64) directly."""
    data = bytearray(_MONTH_DAY_NANO.size * len(chunk))
    for i, text in enumerate(chunk.to_pylist()):
        if text is not None:
            _MONTH_DAY_NANO.pack_into(data, i * _MONTH_DAY_NANO.size, *_parse_interval(text))
    validity = pc.is_valid(chunk).buffers()[1] if chunk.null_count else None
    return pa.Array.from_buffers(
        pa.month_day_nano_interval(), len(chunk), [validity, pa.py_buffer(data)], chunk.null_count
    )


_TEXT: Final = _Codec(pa.string(), _keep)
_DATE_DECODE: Final = _with_slow_path(pa.date32(), _irregular_date, _parse_date)

_SCALARS: Final[dict[int, _Codec]] = {
    16: _Codec(pa.bool_(), _decode_bool),
    17: _Codec(pa.binary(), _decode_bytea),
    20: _Codec(pa.int64(), _cast(pa.int64())),
    21: _Codec(pa.int16(), _cast(pa.int16())),
    23: _Codec(pa.int32(), _cast(pa.int32())),
    26: _Codec(pa.int64(), _cast(pa.int64())),  # oid: uint32 range
    700: _Codec(pa.float32(), _cast(pa.float32())),
    701: _Codec(pa.float64(), _cast(pa.float64())),
    1082: _Codec(pa.date32(), _DATE_DECODE),
    1083: _Codec(pa.time64("us"), _decode_time),
    1114: _Codec(pa.timestamp("us"), _with_slow_path(pa.timestamp("us"), _irregular_timestamp, _parse_timestamp)),
    1184: _Codec(
        pa.timestamp("us", tz="UTC"),
        _with_slow_path(pa.timestamp("us", tz="UTC"), _irregular_timestamp, _parse_timestamp),
    ),
    1186: _Codec(pa.month_day_nano_interval(), _decode_interval),
}


# -- arrays --------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _array_token(delimiter: str) -> re.Pattern[str]:
    d = re.escape(delimiter)
    return re.compile(rf'"((?:[^"\\]|\\.)*)"|([{{}}])|({d})|([^"{{}}{d}]+)', re.DOTALL)


_ESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)

Nested = list["Nested | str | None"]


def parse_array(text: str, delimiter: str = ",") -> Nested:
    """A Postgres array literal (``{1,NULL,"a \\"b\\""}``, nested for more dimensions) -> nested lists of text.

    Custom lower bounds (``[0:1]={...}``) are dropped: Arrow lists always start at 0.
    """
    if text.startswith("{") and text.endswith("}") and '"' not in text and text.count("{") == 1 == text.count("}"):
        body = text[1:-1]  # the common case: one dimension, nothing quoted
        return [None if item == "NULL" else item for item in body.split(delimiter)] if body else []
    start = text.index("=") + 1 if text.startswith("[") else 0
    root: Nested | None = None
    stack: list[Nested] = []
    position = start
    for match in _array_token(delimiter).finditer(text, start):
        quoted, brace, _, bare = match.groups()
        if match.start() != position or (not stack and (brace != "{" or root is not None)):
            break  # a gap, a value outside the braces, or text after the closing brace
        position = match.end()
        if quoted is not None:
            stack[-1].append(_ESCAPE.sub(r"\1", quoted))
        elif brace == "{":
            node: Nested = []
            if stack:
                stack[-1].append(node)
            else:
                root = node
            stack.append(node)
        elif brace == "}":
            stack.pop()
        elif bare is not None:
            stack[-1].append(None if bare == "NULL" else bare)
    if root is None or stack or position != len(text):
        raise _BadValue(f"not an array literal: {_show(text)}")
    return root


def _array_codec(element: _Codec, depth: int, delimiter: str) -> _Codec:
    target = element.type
    for _ in range(depth):
        target = pa.list_(target)

    def decode(chunk: pa.Array) -> pa.Array:
        elements: list[str | None] = []
        offsets: list[list[int]] = [[0] for _ in range(depth)]
        for text in chunk.to_pylist():
            if text is None:
                offsets[0].append(offsets[0][-1])
                continue
            try:
                _flatten(parse_array(text, delimiter), 0, depth, offsets, elements)
            except _Dimensions as exc:
                raise _BadValue(
                    f"a {exc.found}-dimensional array in a column of {depth}-dimensional arrays: {_show(text)}",
                    hint="declare the column with as many [] as its arrays have dimensions",
                ) from None
        values = element.decode(pa.array(elements, pa.string()))
        for level in range(depth - 1, -1, -1):
            mask = pc.is_null(chunk) if level == 0 and chunk.null_count else None
            values = pa.ListArray.from_arrays(pa.array(offsets[level], pa.int32()), values, mask=mask)
        return values

    return _Codec(target, decode)


class _Dimensions(Exception):
    def __init__(self, found: int) -> None:
        self.found = found


def _flatten(node: Nested, level: int, depth: int, offsets: list[list[int]], elements: list[str | None]) -> None:
    offsets[level].append(offsets[level][-1] + len(node))
    if level == depth - 1:
        for item in node:
            if isinstance(item, list):
                raise _Dimensions(_dimensions(node) + level)
            elements.append(item)
        return
    for item in node:
        if not isinstance(item, list):
            raise _Dimensions(level + 1)
        _flatten(item, level + 1, depth, offsets, elements)


def _dimensions(node: Nested | str | None) -> int:
    return 1 + _dimensions(node[0]) if isinstance(node, list) and node else int(isinstance(node, list))


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
