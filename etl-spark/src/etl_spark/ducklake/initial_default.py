"""A column's ``initial_default`` (``ducklake_column``): the value DuckDB reads for it from data files written
before the column existed, as DuckDB keeps it (its cast of the value to VARCHAR).

A source column added with a non-volatile default holds that value in the rows older than it, which Postgres
keeps once (``ColumnSchema.missing_value``) and logical decoding never sends. The lake column gets it as its
initial default, and this writer's own reads of older files (``scan``, ``compaction``) fill it in as DuckDB does.
Lists and blobs get none (their older rows read NULL): DuckDB's text of them is not kept here.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from etl.api import ColumnSchema, decode_text_column
from etl_spark.ducklake.catalog import LakeColumn, inlined_text
from etl_spark.ducklake.types import LIST, Form, LakeType, TypedColumn, arrow_of, convert

_WITHOUT: Final = (LIST, "blob")
_TEMPORAL: Final = ("date", "timestamp", "timestamptz")


def initial_default(column: ColumnSchema, lake: LakeType) -> str | None:
    """DuckDB's text of the value the rows older than ``column`` hold; ``None`` when they hold NULL (or it is
    a list or blob)."""
    if column.missing_value is None or lake.name in _WITHOUT:
        return None
    typed = LakeColumn(0, column.name, lake.name, True)
    values = convert(decode_text_column(column, pa.array([column.missing_value], pa.string())), typed, Form.SPARK)
    text = inlined_text.to_text(values) if lake.name in _TEMPORAL else pc.cast(values, pa.string())
    value = text[0].as_py()
    assert isinstance(value, str)
    return value


def default_values(column: TypedColumn, text: str, rows: int, form: Form) -> pa.Array:
    """``rows`` times the value of an initial default (DuckDB's text of it), in ``form``."""
    values = pa.array([text] * rows, pa.string())
    if column.type in _TEMPORAL:
        return inlined_text.from_text(values, arrow_of(column, form))
    converted = convert(values, column, form)
    assert isinstance(converted, pa.Array)
    return converted
