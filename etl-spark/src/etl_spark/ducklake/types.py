"""Postgres -> DuckLake column types, and the Arrow form in which values travel to Spark and Parquet.

The map is keyed by the column's Postgres type OID (and typmod for ``numeric``). Where Spark cannot
write the Parquet type DuckDB would (``time``, ``interval``, ``uuid``, ``json``), the file holds the
value's text and the DuckLake column keeps the precise type: DuckDB casts the text when it reads.
Postgres arrays become ``json`` arrays, because Spark cannot give list elements the Parquet field ids
DuckLake needs. The table is documented in docs/destinations/ducklake.md; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc

from etl.schema import ColumnSchema


class Stats(StrEnum):
    """How min/max statistics of a column are encoded in the catalog (``None``: not kept)."""

    INT = "int"
    DECIMAL = "decimal"
    DATE = "date"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    STRING = "string"


@dataclass(frozen=True)
class LakeType:
    name: str
    """The DuckLake type as written to ``ducklake_column.column_type``."""
    arrow: pa.DataType
    """The Arrow type of the values handed to Spark (lists stay lists and become JSON text in Spark)."""
    stats: Stats | None


_STRING = pa.string()

# Postgres OIDs of the built-in types with a dedicated mapping.
_SCALARS: dict[int, LakeType] = {
    16: LakeType("boolean", pa.bool_(), None),
    21: LakeType("int16", pa.int16(), Stats.INT),
    23: LakeType("int32", pa.int32(), Stats.INT),
    20: LakeType("int64", pa.int64(), Stats.INT),
    26: LakeType("int64", pa.int64(), Stats.INT),  # oid
    700: LakeType("float32", pa.float32(), None),
    701: LakeType("float64", pa.float64(), None),
    1082: LakeType("date", pa.date32(), Stats.DATE),
    1083: LakeType("time", _STRING, Stats.STRING),
    1114: LakeType("timestamp", pa.timestamp("us"), Stats.TIMESTAMP),
    1184: LakeType("timestamptz", pa.timestamp("us", tz="UTC"), Stats.TIMESTAMPTZ),
    1186: LakeType("interval", _STRING, None),
    17: LakeType("blob", pa.binary(), None),
    114: LakeType("json", _STRING, Stats.STRING),
    3802: LakeType("json", _STRING, Stats.STRING),
    2950: LakeType("uuid", _STRING, Stats.STRING),
}
_NUMERIC_OID = 1700
_VARCHAR = LakeType("varchar", _STRING, Stats.STRING)
_JSON_ARRAY = LakeType("json", _STRING, None)
MAX_DECIMAL_PRECISION = 38


def lake_type(column: ColumnSchema) -> LakeType:
    """The DuckLake type of a source column (see the module docstring)."""
    if column.type_oid == _NUMERIC_OID:
        precision, scale = numeric_precision_scale(column.type_modifier)
        if precision is not None and 0 <= scale <= precision <= MAX_DECIMAL_PRECISION:
            return LakeType(f"decimal({precision},{scale})", pa.decimal128(precision, scale), Stats.DECIMAL)
        return _VARCHAR
    if column.type_oid in _SCALARS:
        return _SCALARS[column.type_oid]
    if column.type_name.endswith("[]"):
        return _JSON_ARRAY
    return _VARCHAR


def numeric_precision_scale(typmod: int) -> tuple[int | None, int]:
    """Precision and (signed, Postgres 15+) scale of ``numeric(p, s)``; ``(None, 0)`` when unconstrained."""
    if typmod < 4:
        return None, 0
    value = typmod - 4
    return (value >> 16) & 0xFFFF, ((value & 0x7FF) ^ 1024) - 1024


def to_lake_arrow(values: pa.Array | pa.ChunkedArray, target: LakeType) -> pa.Array | pa.ChunkedArray:
    """Values of one column, as decoded from Postgres, in the Arrow form of ``target``.

    Lists pass through unchanged (Spark turns them into JSON text). Text-held types are rendered in a
    form DuckDB casts back exactly: ``time`` as ``HH:MM:SS.ffffff``, ``interval`` as
    ``<m> months <d> days <us> microseconds``.
    """
    source = values.type
    if source == target.arrow or pa.types.is_list(source) or pa.types.is_large_list(source):
        return values
    if target.arrow == _STRING and source == pa.month_day_nano_interval():
        return _interval_text(values)
    return pc.cast(values, target.arrow)


def _interval_text(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, pa.ChunkedArray):
        return pa.chunked_array([_interval_text(chunk) for chunk in values.chunks], _STRING)
    # A month_day_nano value is 16 bytes: int32 months, int32 days, int64 nanoseconds.
    data, end = values.buffers()[1], values.offset + len(values)
    words = pa.FixedSizeListArray.from_arrays(pa.Array.from_buffers(pa.int32(), end * 4, [None, data]), 4)
    longs = pa.FixedSizeListArray.from_arrays(pa.Array.from_buffers(pa.int64(), end * 2, [None, data]), 2)
    words, longs = words.slice(values.offset), longs.slice(values.offset)
    micros = pc.divide(pc.list_element(longs, 1), 1000)
    text = pc.binary_join_element_wise(
        pc.cast(pc.list_element(words, 0), _STRING),
        " months ",
        pc.cast(pc.list_element(words, 1), _STRING),
        " days ",
        pc.cast(micros, _STRING),
        " microseconds",
        "",
    )
    return pc.if_else(values.is_valid(), text, pa.scalar(None, _STRING))
