"""Arrow columns made by the codecs back to Python values, as psycopg would return them."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa

from etl.postgres.codecs.calendar import (
    DATE_INFINITY,
    DATE_MINUS_INFINITY,
    TIMESTAMP_INFINITY,
    TIMESTAMP_MINUS_INFINITY,
    US_PER_DAY,
    civil_from_days,
    pg_date_text,
    strip_bc,
)


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
    if days in (DATE_INFINITY, DATE_MINUS_INFINITY):
        return "infinity" if days == DATE_INFINITY else "-infinity"
    year, month, day = civil_from_days(days)
    if 1 <= year <= 9999:
        return date(year, month, day)
    return pg_date_text(year, month, day)


def _timestamp_value(micros: int | None, aware: bool) -> datetime | str | None:
    if micros is None:
        return None
    if micros in (TIMESTAMP_INFINITY, TIMESTAMP_MINUS_INFINITY):
        return "infinity" if micros == TIMESTAMP_INFINITY else "-infinity"
    days, rest = divmod(micros, US_PER_DAY)
    year, month, day = civil_from_days(days)
    seconds, fraction = divmod(rest, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    if 1 <= year <= 9999:
        return datetime(year, month, day, hour, minute, second, fraction, UTC if aware else None)
    text = f"{hour:02d}:{minute:02d}:{second:02d}" + (f".{fraction:06d}".rstrip("0") if fraction else "")
    date_text = pg_date_text(year, month, day)
    body, bc = strip_bc(date_text)
    return f"{body} {text}{'+00' if aware else ''}{' BC' if bc else ''}"
