"""Dates and timestamps as the text DuckDB keeps them in inlined data tables, and back.

DuckDB 1.5 stores them as its own cast to VARCHAR gives them: ``2024-05-06 07:08:09.5``, years after 9999 in
full (``294246-12-31 23:59:59.999999``), years before 1 as ``0044-03-15 (BC)``, timestamptz with its offset
(always ``+00``), and the infinities as ``infinity`` and ``-infinity``: what DuckDB reads from a data file holding
the storage values of docs/types.md (± the type's maximum). Arrow's casts know none of these forms, and
print the infinities as ``<value out of range: …>``, which DuckDB then fails to read.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_DAY_US: Final = 86_400_000_000
_STRING: Final = pa.string()
_PATTERN: Final = (
    r"^(?P<sign>-?)(?P<year>\d{4,})-(?P<month>\d\d)-(?P<day>\d\d)(?P<bc> \(BC\))?"
    r"(?:[ T](?P<hour>\d\d):(?P<minute>\d\d):(?P<second>\d\d)(?:\.(?P<fraction>\d{1,6}))?)?"
    r"(?:[+-]00(?::?00)?|Z)?$"
)


def infinity(kind: pa.DataType) -> int:
    """The storage value of ``infinity`` in a date or timestamp type (``-infinity`` is its negation)."""
    return 2**31 - 1 if pa.types.is_date32(kind) else 2**63 - 1


def to_text(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Dates or timestamps (``date32``, ``timestamp[us]`` with or without a time zone) as DuckDB's text."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    kind = values.type
    stamps = pa.types.is_timestamp(kind)
    storage = pa.int32() if pa.types.is_date32(kind) else pa.int64()
    raw = pc.fill_null(values.cast(storage), 0).to_numpy().astype(np.int64)
    days = np.floor_divide(raw, _DAY_US) if stamps else raw
    year, month, day = _civil(days)
    before_christ = year <= 0
    parts: list[pa.Array | str] = [
        _digits(np.where(before_christ, 1 - year, year), 4),
        "-",
        _digits(month, 2),
        "-",
        _digits(day, 2),
        pa.array(np.where(before_christ, " (BC)", "")),
    ]
    if stamps:
        micros = raw - days * _DAY_US
        seconds, fraction = np.divmod(micros, 1_000_000)
        digits = pc.utf8_rtrim(_digits(fraction, 6), characters="0")
        dotted = pc.if_else(pc.equal(fraction, 0), "", pc.binary_join_element_wise(".", digits, ""))
        parts += [" ", _digits(seconds // 3600, 2), ":", _digits(seconds // 60 % 60, 2), ":", _digits(seconds % 60, 2)]
        parts += [dotted, "+00" if kind.tz is not None else ""]
    text = pc.binary_join_element_wise(*parts, "")
    top = infinity(kind)
    text = pc.if_else(raw == top, "infinity", pc.if_else(raw == -top, "-infinity", text))
    return pc.if_else(values.is_valid(), text, pa.scalar(None, _STRING))


def from_text(values: pa.Array, kind: pa.DataType) -> pa.Array:
    """DuckDB's text of dates or timestamps (``to_text``; also Arrow's ``-0043`` years) as ``kind``. DuckDB
    writes timestamptz in UTC whatever its session's time zone; another offset is refused."""
    trimmed = pc.utf8_trim_whitespace(values)
    lowered = pc.utf8_lower(trimmed)
    top = infinity(kind)
    infinite = np.select(
        [pc.fill_null(pc.equal(lowered, "infinity"), False), pc.fill_null(pc.equal(lowered, "-infinity"), False)],
        [top, -top],
        0,
    )
    fields = pc.extract_regex(pc.if_else(pa.array(infinite != 0), "1970-01-01", trimmed), _PATTERN)
    unreadable = pc.and_(values.is_valid(), fields.is_null())
    if pc.any(unreadable).as_py():
        bad = pc.filter(values, unreadable)[0].as_py()
        raise ValueError(f"not a {kind} as DuckDB writes it: {bad!r}")

    def number(name: str) -> np.ndarray:
        field = pc.struct_field(fields, name)
        digits = pc.fill_null(pc.if_else(pc.equal(field, ""), "0", field), "0")
        return np.asarray(pc.cast(digits, pa.int64()).to_numpy(), np.int64)

    year = np.where(pc.fill_null(pc.equal(pc.struct_field(fields, "sign"), "-"), False), -1, 1) * number("year")
    year = np.where(pc.fill_null(pc.equal(pc.struct_field(fields, "bc"), ""), True), year, 1 - year)
    raw = _days(year, number("month"), number("day"))
    if pa.types.is_timestamp(kind):
        fraction = pc.utf8_rpad(pc.fill_null(pc.struct_field(fields, "fraction"), ""), 6, "0")
        hours, minutes = number("hour"), number("minute")
        seconds = raw * 86_400 + hours * 3600 + minutes * 60 + number("second")
        raw = seconds * 1_000_000 + pc.cast(fraction, pa.int64()).to_numpy()
    raw = np.where(infinite != 0, infinite, raw)
    storage = pa.array(raw, pa.int64(), mask=values.is_null().to_numpy(zero_copy_only=False))
    return pc.cast(storage, pa.int32()).cast(kind) if pa.types.is_date32(kind) else storage.cast(kind)


def _digits(numbers: np.ndarray, width: int) -> pa.Array:
    return pc.utf8_lpad(pc.cast(pa.array(numbers, pa.int64()), _STRING), width, "0")


def _civil(days: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Proleptic Gregorian year (astronomical: 0 is 1 BC), month and day of days since 1970-01-01
    (H. Hinnant's ``civil_from_days``)."""
    shifted = days + 719_468
    era = np.floor_divide(shifted, 146_097)
    day_of_era = shifted - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_from_march = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * month_from_march + 2) // 5 + 1
    month = np.where(month_from_march < 10, month_from_march + 3, month_from_march - 9)
    return year_of_era + era * 400 + (month <= 2), month, day


def _days(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of a proleptic Gregorian date (``days_from_civil``)."""
    year = year - (month <= 2)
    era = np.floor_divide(year, 400)
    year_of_era = year - era * 400
    day_of_year = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    days = era * 146_097 + year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year - 719_468
    return np.asarray(days, np.int64)
