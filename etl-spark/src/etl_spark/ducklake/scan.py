"""Spark reads of a table's data files: every stored row with its file and position, for finding what
a batch deletes and for filling unchanged TOAST values.

Columns are matched by field id, so files written before a rename read correctly. ``uuid`` and
``time`` values are read into their Spark form (text, ``types.Form.SPARK``) whether a file holds them
as text (earlier versions of this writer) or natively (this writer now, and DuckDB), so the rows of
every file compare alike.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from etl_spark.ducklake.catalog import LakeColumn
from etl_spark.ducklake.initial_default import default_values
from etl_spark.ducklake.storage import LakeStorage
from etl_spark.ducklake.types import LIST, Form

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

FIELD_ID_KEY = "parquet.field.id"
"""Where Spark takes a column's Parquet field id from (``StructField.metadata``)."""


def spark_type(column: LakeColumn, native: frozenset[int] = frozenset()) -> DataType:
    """The Spark type a file's column is read as: its Spark form, or as Spark reads Parquet UUID (binary) and
    TIME(MICROS) (long) when the file holds it natively (ids in ``native``)."""
    from pyspark.sql import types as st

    if column.type == LIST and column.element is not None:
        return st.ArrayType(spark_type(column.element, native))
    if column.column_id in native:
        return st.BinaryType() if column.type == "uuid" else st.LongType()
    simple: dict[str, DataType] = {
        "boolean": st.BooleanType(),
        "int8": st.ByteType(),
        "int16": st.ShortType(),
        "int32": st.IntegerType(),
        "int64": st.LongType(),
        "float32": st.FloatType(),
        "float64": st.DoubleType(),
        "date": st.DateType(),
        "timestamp": st.TimestampNTZType(),
        "timestamptz": st.TimestampType(),
        "blob": st.BinaryType(),
    }
    if column.type in simple:
        return simple[column.type]
    if column.type.startswith("decimal("):
        precision, scale = column.type[len("decimal(") : -1].split(",")
        return st.DecimalType(int(precision), int(scale))
    return st.StringType()


def spark_schema(columns: Sequence[LakeColumn], native: frozenset[int] = frozenset()) -> StructType:
    """The Spark schema of a table's files: one field per column, with its field id."""
    from pyspark.sql import types as st

    return st.StructType(
        [st.StructField(c.name, spark_type(c, native), True, {FIELD_ID_KEY: c.column_id}) for c in columns]
    )


def read_rows(
    spark: SparkSession, storage: LakeStorage, columns: Sequence[LakeColumn], data_paths: Sequence[str]
) -> DataFrame:
    """Every row of data files (deleted ones too), with ``_etl_file`` (file name) and ``_etl_pos`` (row position).

    Files are read in groups that hold the same columns natively (see the module docstring) and lack the same
    columns that have an initial default, which their rows read as that value (as DuckDB reads them).
    """
    groups: dict[tuple[frozenset[int], frozenset[int]], list[str]] = {}
    for path in data_paths:
        key = storage.native_columns(path, columns), storage.defaulted_columns(path, columns)
        groups.setdefault(key, []).append(path)
    frames = [_read_files(spark, columns, paths, *key) for key, paths in groups.items()]
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def _read_files(
    spark: SparkSession,
    columns: Sequence[LakeColumn],
    data_paths: Sequence[str],
    native: frozenset[int],
    defaulted: frozenset[int],
) -> DataFrame:
    from pyspark.sql import functions as sf

    return (
        spark.read.schema(spark_schema(columns, native))
        .parquet(*data_paths)
        .select(
            *[
                (_default(c) if c.column_id in defaulted else _spark_form(sf.col(c.name), c, native)).alias(c.name)
                for c in columns
            ],
            _file_name(sf.col("_metadata.file_path")).alias("_etl_file"),
            sf.col("_metadata.row_index").alias("_etl_pos"),
        )
    )


def _default(column: LakeColumn) -> Column:
    """The column's initial default as a Spark value of its Spark form."""
    from pyspark.sql import functions as sf

    assert column.initial_default is not None
    value = default_values(column, column.initial_default, 1, Form.SPARK)
    # Dates and timestamps as days and microseconds: Python's stop at years 1 and 9999, DuckDB's do not.
    if column.type == "date":
        return sf.date_from_unix_date(sf.lit(value.view(pa.int32())[0].as_py()))
    if column.type in ("timestamp", "timestamptz"):
        instant = sf.timestamp_micros(sf.lit(value.view(pa.int64())[0].as_py()))
        return instant.cast(spark_type(column))  # to timestamp_ntz in the session's time zone, UTC
    return sf.lit(value[0].as_py()).cast(spark_type(column))


def _spark_form(value: Column, column: LakeColumn, native: frozenset[int]) -> Column:
    """A column as read from a file, in its Spark form: native UUID (16 bytes) and TIME (microseconds) as text."""
    from pyspark.sql import functions as sf

    if column.type == LIST and column.element is not None:
        element = column.element
        if not any(c.column_id in native for c in element.with_elements()):
            return value
        return sf.transform(value, lambda item: _spark_form(item, element, native))
    if column.column_id not in native:
        return value
    if column.type == "uuid":
        hexed = sf.lower(sf.hex(value))
        parts = [sf.substring(hexed, start, length) for start, length in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))]
        text = sf.concat_ws("-", *parts)
    else:
        hours, minutes = sf.floor(value / 3_600_000_000), sf.floor(value / 60_000_000) % 60
        seconds, micros = sf.floor(value / 1_000_000) % 60, value % 1_000_000
        text = sf.format_string("%02d:%02d:%02d.%06d", hours, minutes, seconds, micros)
    return sf.when(value.isNotNull(), text)


def read_live(
    spark: SparkSession,
    storage: LakeStorage,
    columns: Sequence[LakeColumn],
    data_paths: Sequence[str],
    delete_paths: Sequence[str],
) -> DataFrame:
    """``read_rows`` without the positions in the active delete files."""
    from pyspark.sql import functions as sf
    from pyspark.sql import types as st

    rows = read_rows(spark, storage, columns, data_paths)
    if not delete_paths:
        return rows
    schema = st.StructType([st.StructField("file_path", st.StringType()), st.StructField("pos", st.LongType())])
    deleted = (
        spark.read.schema(schema)
        .parquet(*delete_paths)
        .select(_file_name(sf.col("file_path")).alias("_etl_file"), sf.col("pos").alias("_etl_pos"))
    )
    return rows.join(deleted, ["_etl_file", "_etl_pos"], "left_anti")


def _file_name(path: Column) -> Column:
    from pyspark.sql import functions as sf

    return sf.element_at(sf.split(path, "/"), -1)


def file_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]
