"""Postgres -> DuckLake column types, and the two Arrow forms values take on their way into lake files.

The type map is keyed by the column's Postgres type OID (and typmod for ``numeric``); arrays become
DuckLake lists, nested once per dimension. Values then take one of two forms (``Form``):

- ``FILE``: what data files hold, as DuckDB itself writes them: Parquet ``UUID``, ``TIME(MICROS)``,
  lists with a field id on every element. ``interval`` is text ``<m> months <d> days <us> microseconds``:
  Parquet's ``INTERVAL`` holds milliseconds, so it would lose the microseconds DuckDB keeps.
- ``SPARK``: what Spark plans with (Spark 4.0 has no time or uuid type, and 4.1's ``TIME`` is not on 4.0):
  ``uuid`` and ``time`` as their canonical text, on every Spark version. Files that hold them natively are
  read back into this form (``files.read_rows``).

A lake column written by an earlier version of this writer as ``json`` (arrays) keeps that type: its
values are written as JSON text. The table is documented in docs/destinations/ducklake.md; keep the
two in step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Final, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.api import BUILTIN_ARRAYS, ColumnSchema, arrow_type


class Stats(StrEnum):
    """How min/max statistics of a column are encoded in the catalog (``None``: not kept)."""

    INT = "int"
    DECIMAL = "decimal"
    DATE = "date"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    STRING = "string"
    UUID = "uuid"
    TIME = "time"


@dataclass(frozen=True)
class LakeType:
    name: str
    """The DuckLake type as written to ``ducklake_column.column_type`` (``list`` for lists)."""
    element: LakeType | None = None
    """The element type of a list."""

    def signature(self) -> str:
        """The type with its list elements': ``list<int32>``."""
        return f"{LIST}<{self.element.signature()}>" if self.element is not None else self.name


class TypedColumn(Protocol):
    """A lake column as the converters need it (``catalog.LakeColumn``): its type, and its element's."""

    @property
    def type(self) -> str: ...

    @property
    def element(self) -> TypedColumn | None: ...


class Form(Enum):
    FILE = "file"
    SPARK = "spark"


FIELD_ID: Final = b"PARQUET:field_id"
LIST: Final = "list"
UUID_TYPE: Final = pa.uuid()
TIME_TYPE: Final = pa.time64("us")
_STRING: Final = pa.string()

# Postgres OIDs of the built-in types with a dedicated mapping.
_SCALARS: Final[dict[int, LakeType]] = {
    16: LakeType("boolean"),
    21: LakeType("int16"),
    23: LakeType("int32"),
    20: LakeType("int64"),
    26: LakeType("int64"),  # oid
    700: LakeType("float32"),
    701: LakeType("float64"),
    1082: LakeType("date"),
    1083: LakeType("time"),
    1114: LakeType("timestamp"),
    1184: LakeType("timestamptz"),
    1186: LakeType("interval"),
    17: LakeType("blob"),
    114: LakeType("json"),
    3802: LakeType("json"),
    2950: LakeType("uuid"),
}
_NUMERIC_OID: Final = 1700
_VARCHAR: Final = LakeType("varchar")
MAX_DECIMAL_PRECISION: Final = 38

# DuckLake type -> Arrow type of its values in files; decimals and lists are built.
_FILE_TYPES: Final[dict[str, pa.DataType]] = {
    "boolean": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "date": pa.date32(),
    "time": TIME_TYPE,
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "blob": pa.binary(),
    "uuid": UUID_TYPE,
}
_TEXT_IN_SPARK: Final = ("uuid", "time")


def lake_type(column: ColumnSchema) -> LakeType:
    """The DuckLake type of a source column (see the module docstring)."""
    depth = 0
    kind = arrow_type(column)
    while pa.types.is_list(kind):
        depth, kind = depth + 1, kind.value_type
    if not depth:
        return _scalar(column.type_oid, column.type_modifier)
    result = _scalar(BUILTIN_ARRAYS.get(column.type_oid, 0), column.type_modifier)
    for _ in range(depth):
        result = LakeType(LIST, result)
    return result


def _scalar(type_oid: int, typmod: int) -> LakeType:
    if type_oid == _NUMERIC_OID:
        precision, scale = numeric_precision_scale(typmod)
        if precision is not None and 0 <= scale <= precision <= MAX_DECIMAL_PRECISION:
            return LakeType(f"decimal({precision},{scale})")
        return _VARCHAR
    return _SCALARS.get(type_oid, _VARCHAR)


def numeric_precision_scale(typmod: int) -> tuple[int | None, int]:
    """Precision and (signed, Postgres 15+) scale of ``numeric(p, s)``; ``(None, 0)`` when unconstrained."""
    if typmod < 4:
        return None, 0
    value = typmod - 4
    return (value >> 16) & 0xFFFF, ((value & 0x7FF) ^ 1024) - 1024


def arrow_of(column: TypedColumn, form: Form) -> pa.DataType:
    """The Arrow type of a lake column's values in ``form`` (list elements carry no field ids here)."""
    name = column.type
    if name == LIST and column.element is not None:
        return pa.list_(arrow_of(column.element, form))
    if form is Form.SPARK and name in _TEXT_IN_SPARK:
        return _STRING
    if name.startswith("decimal("):
        precision, scale = name[len("decimal(") : -1].split(",")
        return pa.decimal128(int(precision), int(scale))
    return _FILE_TYPES.get(name, _STRING)


def convert(values: pa.Array | pa.ChunkedArray, column: TypedColumn, form: Form) -> pa.Array | pa.ChunkedArray:
    """Values of one column, as decoded from Postgres or in the other form, in ``form`` for ``column``."""
    if isinstance(values, pa.ChunkedArray):
        chunks = [convert(chunk, column, form) for chunk in values.chunks]
        return pa.chunked_array(chunks, arrow_of(column, form))
    source, name = values.type, column.type
    if pa.types.is_list(source) or pa.types.is_large_list(source):
        if name == LIST and column.element is not None:
            elements = convert(values.flatten(), column.element, form)
            offsets = pc.subtract(values.offsets, values.offsets[0])  # relative to the flattened elements
            mask = values.is_null() if values.null_count else None
            return pa.ListArray.from_arrays(offsets, elements, mask=mask)
        return _json_text(values)  # a json column kept from an earlier version of this writer
    target = arrow_of(column, form)
    if source == target:
        return values
    if source == pa.month_day_nano_interval():
        return interval_text(values)
    if target == UUID_TYPE:
        return _uuid_from_text(values)
    if target == TIME_TYPE and pa.types.is_string(source):
        return _time_from_text(values)
    return pc.cast(values, target)


def interval_text(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Intervals as ``<m> months <d> days <us> microseconds``, a text DuckDB casts back exactly."""
    if isinstance(values, pa.ChunkedArray):
        return pa.chunked_array([interval_text(chunk) for chunk in values.chunks], _STRING)
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


_HEX: Final = np.full(256, 255, np.uint8)
_HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)
_NIL_UUID: Final = "00000000000000000000000000000000"


def _uuid_from_text(values: pa.Array) -> pa.Array:
    """Canonical uuid text (as Postgres prints it) -> Arrow's uuid type, without a Python object per value."""
    digits = pc.fill_null(pc.replace_substring(pc.cast(values, _STRING), "-", ""), _NIL_UUID)
    lengths = pc.binary_length(digits).to_numpy(zero_copy_only=False)
    if len(digits) and not (lengths == 32).all():
        bad = digits[int(np.argmax(lengths != 32))].as_py()
        raise ValueError(f"not a uuid: {bad!r}")
    start = int(np.frombuffer(digits.buffers()[1], np.int32)[digits.offset])
    raw = np.frombuffer(digits.buffers()[2], np.uint8)[start : start + 32 * len(digits)]
    nibbles = _HEX[raw].reshape(-1, 2)
    if (nibbles == 255).any():
        raise ValueError("not a uuid: a value holds a character that is not a hex digit")
    packed = (nibbles[:, 0] << 4) | nibbles[:, 1]
    storage = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16),
        len(digits),
        [values.is_valid().buffers()[1] if values.null_count else None, pa.py_buffer(packed)],
    )
    return pa.ExtensionArray.from_storage(UUID_TYPE, storage)


def _time_from_text(values: pa.Array) -> pa.Array:
    """``HH:MM:SS[.ffffff]`` text -> microseconds of the day."""
    hours = pc.cast(pc.utf8_slice_codeunits(values, 0, 2), pa.int64())
    minutes = pc.cast(pc.utf8_slice_codeunits(values, 3, 5), pa.int64())
    seconds = pc.cast(pc.utf8_slice_codeunits(values, 6, 8), pa.int64())
    fraction = pc.utf8_rpad(pc.utf8_slice_codeunits(values, 9, 15), 6, "0")
    micros = pc.cast(fraction, pa.int64())
    total = pc.add(
        pc.multiply(pc.add(pc.multiply(pc.add(pc.multiply(hours, 60), minutes), 60), seconds), 10**6), micros
    )
    return pc.cast(total, TIME_TYPE)


def _json_text(values: pa.Array) -> pa.Array:
    """Arrays as JSON text, for a lake column an earlier version of this writer made ``json``."""
    return pa.array(
        [None if v is None else json.dumps(v, separators=(",", ":"), default=str) for v in values.to_pylist()],
        _STRING,
    )
