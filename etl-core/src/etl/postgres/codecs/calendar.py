"""Dates, times, timestamps and intervals: Postgres's ISO text forms (infinities and BC years included) and
proleptic Gregorian day arithmetic."""

from __future__ import annotations

import re
import struct
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from etl.postgres.codecs.base import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, BadValue, show

US_PER_DAY: Final = 86_400_000_000
# Infinite dates and timestamps as DuckDB stores them (and reads them back as infinite): the type's maximum,
# and its negation, not the minimum (DuckDB reads INT32_MIN days and INT64_MIN µs as far-BC finite values).
DATE_INFINITY: Final = INT32_MAX
DATE_MINUS_INFINITY: Final = -INT32_MAX
TIMESTAMP_INFINITY: Final = INT64_MAX
TIMESTAMP_MINUS_INFINITY: Final = -INT64_MAX
_UNIX_EPOCH_DAYS: Final = 719_468  # days from 0000-03-01 to 1970-01-01 (proleptic Gregorian)


def pg_date_text(year: int, month: int, day: int) -> str:
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


def _char_at(chunk: pa.Array, index: int) -> pa.Array:
    return pc.utf8_slice_codeunits(chunk, index, index + 1)


def irregular_date(chunk: pa.Array) -> pa.Array:
    return pc.not_equal(pc.binary_length(chunk), 10)  # not YYYY-MM-DD: infinity, BC, years past 9999


def irregular_timestamp(chunk: pa.Array) -> pa.Array:
    return pc.or_(pc.not_equal(_char_at(chunk, 4), "-"), pc.ends_with(chunk, " BC"))


_DATE: Final = re.compile(r"(\d+)-(\d\d)-(\d\d)")
_TIMESTAMP: Final = re.compile(
    r"(\d+)-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::?(\d\d))?(?::(\d\d))?)?"
)


def parse_date(text: str) -> int:
    """Days since 1970-01-01; +-infinity map to ``DATE_INFINITY`` and ``DATE_MINUS_INFINITY``."""
    if text in ("infinity", "-infinity"):
        return DATE_INFINITY if text == "infinity" else DATE_MINUS_INFINITY
    body, bc = strip_bc(text)
    match = _DATE.fullmatch(body)
    if match is None:
        raise BadValue(f"not an ISO date: {show(text)}", hint="set DateStyle = 'ISO' on the source connection")
    year, month, day = (int(g) for g in match.groups())
    return days_from_civil(1 - year if bc else year, month, day)


def parse_timestamp(text: str) -> int:
    """Microseconds since 1970-01-01 00:00 UTC; +-infinity map to ``TIMESTAMP_INFINITY`` and
    ``TIMESTAMP_MINUS_INFINITY``."""
    if text in ("infinity", "-infinity"):
        return TIMESTAMP_INFINITY if text == "infinity" else TIMESTAMP_MINUS_INFINITY
    body, bc = strip_bc(text)
    match = _TIMESTAMP.fullmatch(body)
    if match is None:
        raise BadValue(f"not an ISO timestamp: {show(text)}", hint="set DateStyle = 'ISO' on the source connection")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, sign, offset_h, offset_m, offset_s = match.groups()[6:]
    days = days_from_civil(1 - year if bc else year, month, day)
    micros = days * US_PER_DAY + ((hour * 60 + minute) * 60 + second) * 1_000_000
    micros += int((fraction or "").ljust(6, "0") or 0)
    if sign is not None:
        offset = (int(offset_h) * 60 + int(offset_m or 0)) * 60 + int(offset_s or 0)
        micros -= (offset if sign == "+" else -offset) * 1_000_000
    if not TIMESTAMP_MINUS_INFINITY < micros < TIMESTAMP_INFINITY:  # those stand for -infinity and infinity
        raise BadValue(
            f"timestamp {text!r} is outside Arrow's range (microseconds since 1970 in 64 bits: up to 294247 AD)",
            hint="replace the value, or change the column's type to text",
        )
    return micros


def strip_bc(text: str) -> tuple[str, bool]:
    return (text[:-3], True) if text.endswith(" BC") else (text, False)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC is year 0)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - _UNIX_EPOCH_DAYS


def decode_time(chunk: pa.Array) -> pa.Array:
    """``HH:MM:SS[.ffffff]`` -> time64[us], by parsing it as a timestamp on 1970-01-01."""
    if pc.any(pc.starts_with(chunk, "24:")).as_py():
        raise BadValue(
            "24:00:00 cannot be stored as Arrow time64 (whose day ends before 24:00)",
            hint="store midnight as 00:00:00, or change the column's type to text or interval",
        )
    stamped = pc.binary_join_element_wise("1970-01-01 ", chunk, "")
    try:
        micros = pc.cast(pc.cast(stamped, pa.timestamp("us")), pa.int64())
    except pa.ArrowInvalid as exc:
        raise BadValue(str(exc).replace("1970-01-01 ", "")) from None
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
        raise BadValue(
            f"not an interval in postgres style: {show(text)}",
            hint="set IntervalStyle = 'postgres' on the source connection",
        ) from None
    nanos = micros * 1000
    if not INT64_MIN <= nanos <= INT64_MAX:
        raise BadValue(f"interval {text!r} does not fit Arrow month_day_nano (its time part exceeds 292 years)")
    return months, days, nanos


_MONTH_DAY_NANO: Final = struct.Struct("<iiq")


def decode_interval(chunk: pa.Array) -> pa.Array:
    """Parse each value; write Arrow's month_day_nano layout (int32, int32, int64) directly."""
    data = bytearray(_MONTH_DAY_NANO.size * len(chunk))
    for i, text in enumerate(chunk.to_pylist()):
        if text is not None:
            _MONTH_DAY_NANO.pack_into(data, i * _MONTH_DAY_NANO.size, *_parse_interval(text))
    validity = pc.is_valid(chunk).buffers()[1] if chunk.null_count else None
    return pa.Array.from_buffers(
        pa.month_day_nano_interval(), len(chunk), [validity, pa.py_buffer(data)], chunk.null_count
    )
