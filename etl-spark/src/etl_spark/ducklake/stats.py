"""Column statistics of a DuckLake file, read from its Parquet footer and encoded as the spec's strings.

A bound that cannot be encoded exactly (a string over 256 bytes, a date Python cannot hold) is left
out: DuckLake requires true bounds or none, because DuckDB prunes files and rows with them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from etl_spark.ducklake.types import Stats

_EPOCH_DATE = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1)
_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
_MAX_STRING_BOUND = 256

# DuckLake type -> stats kind, for columns as the catalog lists them (also columns DuckDB created).
_STATS_BY_NAME: Final = {
    "int8": Stats.INT,
    "int16": Stats.INT,
    "int32": Stats.INT,
    "int64": Stats.INT,
    "date": Stats.DATE,
    "timestamp": Stats.TIMESTAMP,
    "timestamptz": Stats.TIMESTAMPTZ,
    "varchar": Stats.STRING,
    "json": Stats.STRING,
    "uuid": Stats.UUID,
    "time": Stats.TIME,
}


def stats_kind(type_name: str) -> Stats | None:
    if type_name.startswith("decimal("):
        return Stats.DECIMAL
    return _STATS_BY_NAME.get(type_name)


Bound = tuple[int, Any]
"""A typed, comparable bound: ``(-1, None)`` is -infinity, ``(1, None)`` +infinity, ``(0, value)`` a value."""


@dataclass(frozen=True)
class ColumnStats:
    column_id: int
    value_count: int
    """Non-null values."""
    null_count: int
    size_bytes: int
    min_value: str | None
    max_value: str | None


def file_stats(metadata: pq.FileMetaData, columns: dict[str, tuple[int, Stats | None]]) -> list[ColumnStats]:
    """Per-column statistics of a file; ``columns`` maps top-level column name -> (column id, stats kind)."""
    found: dict[str, ColumnStats] = {}
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            name = chunk.path_in_schema
            if name not in columns:
                continue
            column_id, kind = columns[name]
            stats = chunk.statistics
            nulls = stats.null_count if stats is not None and stats.has_null_count else 0
            values = chunk.num_values - nulls
            low = high = None
            if kind is not None and stats is not None and stats.has_min_max:
                low = encode(kind, stats.min_raw, partial(getattr, stats, "min"))
                high = encode(kind, stats.max_raw, partial(getattr, stats, "max"))
                if low is None or high is None:
                    low = high = None
            current = found.get(name)
            if current is not None:
                low, high = _merge(kind, current, low, high, values)
                values, nulls = values + current.value_count, nulls + current.null_count
            size = chunk.total_compressed_size + (current.size_bytes if current else 0)
            found[name] = ColumnStats(column_id, values, nulls, size, low, high)
    return list(found.values())


def arrow_stats(rows: pa.Table, columns: dict[str, tuple[int, Stats | None]]) -> list[ColumnStats]:
    """Per-column statistics of rows held in Arrow (values in ``Form.FILE``), as ``file_stats`` gives a file's;
    ``columns`` maps column name -> (column id, stats kind). Sizes are 0: the rows are in no file."""
    found = []
    for name, (column_id, kind) in columns.items():
        values = rows[name]
        count = len(values) - values.null_count
        low = high = None
        if kind is not None and count:
            bounds = pc.min_max(_physical(values))
            low, high = _bound(kind, bounds["min"].as_py()), _bound(kind, bounds["max"].as_py())
            if low is None or high is None:
                low = high = None
        found.append(ColumnStats(column_id, count, values.null_count, 0, low, high))
    return found


def _bound(kind: Stats, value: Any) -> str | None:
    return encode(kind, value, lambda: value)


def _physical(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """Values as Parquet stores them, where ``encode`` takes them so: dates, times and timestamps as integers,
    uuids as their 16 bytes."""
    kind = values.type
    if isinstance(kind, pa.BaseExtensionType):
        return pa.chunked_array([chunk.storage for chunk in values.chunks], kind.storage_type)
    if pa.types.is_date32(kind):
        return pc.cast(values, pa.int32())
    if pa.types.is_timestamp(kind) or pa.types.is_time64(kind):
        return pc.cast(values, pa.int64())
    return values


def _merge(
    kind: Stats | None, current: ColumnStats, low: str | None, high: str | None, values: int
) -> tuple[str | None, str | None]:
    if kind is None:
        return None, None
    if current.value_count == 0:
        return low, high
    if values == 0:
        return current.min_value, current.max_value
    if low is None or high is None or current.min_value is None or current.max_value is None:
        return None, None
    return widen(kind, current.min_value, current.max_value, low, high)


def widen(kind: Stats, min_a: str, max_a: str, min_b: str, max_b: str) -> tuple[str, str]:
    """The union of two ranges, compared as typed values (never as strings)."""
    low = min_a if bound_key(kind, min_a) <= bound_key(kind, min_b) else min_b
    high = max_a if bound_key(kind, max_a) >= bound_key(kind, max_b) else max_b
    return low, high


def encode(kind: Stats, raw: Any, logical: Callable[[], Any]) -> str | None:
    """A Parquet statistic (physical value, and its logical value on demand) as the catalog's string.

    ``None`` when it cannot be encoded exactly.
    """
    if kind is Stats.INT:
        return str(int(raw))
    if kind is Stats.DECIMAL:
        value = logical()
        return format(value, "f") if isinstance(value, Decimal) else None
    if kind is Stats.DATE:
        if abs(raw) >= _INT32_MAX:
            return "infinity" if raw > 0 else "-infinity"
        try:
            return (_EPOCH_DATE + timedelta(days=raw)).isoformat()
        except OverflowError:
            return None
    if kind in (Stats.TIMESTAMP, Stats.TIMESTAMPTZ):
        if abs(raw) >= _INT64_MAX:
            return "infinity" if raw > 0 else "-infinity"
        try:
            text = (_EPOCH + timedelta(microseconds=raw)).isoformat(sep=" ", timespec="microseconds")
        except OverflowError:
            return None
        return text + "+00" if kind is Stats.TIMESTAMPTZ else text
    if kind is Stats.UUID and isinstance(raw, bytes) and len(raw) == 16:
        return str(uuid.UUID(bytes=raw))
    if kind is Stats.TIME and isinstance(raw, int):
        seconds, micros = divmod(raw, 1_000_000)
        return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{micros:06d}"
    value = logical()
    string = value if isinstance(value, str) else _utf8(raw)
    return string if string is not None and len(string.encode()) <= _MAX_STRING_BOUND else None


def _utf8(raw: Any) -> str | None:
    try:
        return bytes(raw).decode() if isinstance(raw, bytes | bytearray | memoryview) else None
    except UnicodeDecodeError:
        return None


def bound_key(kind: Stats, text: str) -> Bound:
    """A catalog bound string as a comparable typed value (also for bounds DuckDB wrote)."""
    lowered = text.strip().lower()
    if kind in (Stats.DATE, Stats.TIMESTAMP, Stats.TIMESTAMPTZ) and lowered in ("infinity", "-infinity"):
        return (1 if lowered == "infinity" else -1, None)
    if kind is Stats.INT:
        return (0, int(text))
    if kind is Stats.DECIMAL:
        return (0, Decimal(text))
    if kind is Stats.DATE:
        return (0, date.fromisoformat(text))
    if kind in (Stats.TIMESTAMP, Stats.TIMESTAMPTZ):
        parsed = datetime.fromisoformat(text)
        return (0, parsed.replace(tzinfo=None) - (parsed.utcoffset() or timedelta()))
    return (0, text.encode())
