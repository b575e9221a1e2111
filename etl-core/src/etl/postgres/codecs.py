"""Postgres text values -> Arrow (placeholder signatures; the full type matrix replaces this)."""

from __future__ import annotations

import pyarrow as pa

from etl.schema import ColumnSchema


def arrow_type(column: ColumnSchema) -> pa.DataType:
    """The Arrow type that holds the column's values."""
    return pa.string()


def decode_text_column(column: ColumnSchema, values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Convert a string array of Postgres text values (nulls are SQL NULL) to ``arrow_type(column)``."""
    return values
