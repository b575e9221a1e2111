"""Lake files: Spark writes data files, the driver writes delete files, pyarrow reads footers.

Spark writes into a staging directory under the data path; each part file is then moved to the
table's directory as ``ducklake-<uuid>.parquet`` and its footer read for sizes and statistics. Only
then is it registered in the catalog, so a crash leaves at worst an unregistered file (an orphan
``ducklake_delete_orphaned_files`` removes). Parquet columns carry field ids equal to the DuckLake
column ids; positional delete files use the field ids DuckDB gives them.
"""

from __future__ import annotations

import functools
import struct
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from etl_spark.ducklake.catalog import LakeColumn, LakeTable, NewFile
from etl_spark.ducklake.metrics import DuckLakeMetrics
from etl_spark.ducklake.stats import file_stats, stats_kind
from etl_spark.ducklake.types import Stats

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

FIELD_ID_KEY: Final = "parquet.field.id"
NATIVE_TEXT_TYPES: Final = ("uuid", "time")
"""Lake types this writer stores as text, which DuckDB writes in Parquet's own UUID and TIME types (in every
file it writes: compaction, its own inserts). Scans read such files' columns in that form and turn them into
the text."""
DELETE_FIELD_IDS: Final = {"file_path": 2147483646, "pos": 2147483645, "_ducklake_internal_snapshot_id": 2147483539}
STAGING: Final = "_etl_staging/"


def spark_type(type_name: str) -> DataType:
    """The Spark type that holds a DuckLake column's values as this writer stores them."""
    from pyspark.sql import types as st

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
    if type_name in simple:
        return simple[type_name]
    if type_name.startswith("decimal("):
        precision, scale = type_name[len("decimal(") : -1].split(",")
        return st.DecimalType(int(precision), int(scale))
    return st.StringType()


def lake_schema(columns: Sequence[LakeColumn], native: frozenset[int] = frozenset()) -> StructType:
    """The Spark schema of a table's files: one field per column, with its field id.

    Columns in ``native`` (``NATIVE_TEXT_TYPES``) are typed as Spark reads Parquet UUID and TIME(us).
    """
    from pyspark.sql import types as st

    stored = {"uuid": st.BinaryType(), "time": st.LongType()}
    return st.StructType(
        [
            st.StructField(
                c.name,
                stored[c.type] if c.column_id in native else spark_type(c.type),
                True,
                {FIELD_ID_KEY: c.column_id},
            )
            for c in columns
        ]
    )


class LakeStorage:
    """File operations under a lake's data path (any filesystem pyarrow and Spark both reach)."""

    def __init__(self, data_path: str, metrics: DuckLakeMetrics | None = None) -> None:
        self.data_path = data_path
        self.metrics = metrics if metrics is not None else DuckLakeMetrics()
        """Counts the files written (``etl_ducklake_files_written_total``, ``..._bytes_written_total``)."""
        self.fs, root = pafs.FileSystem.from_uri(data_path)
        self._root = root.rstrip("/") + "/"
        self._prefix = data_path
        self._field_types = functools.lru_cache(maxsize=4096)(self._read_field_types)

    def _local(self, path: str) -> str:
        """A lake path (under data_path) as a path of ``self.fs``."""
        if path.startswith(self._prefix):
            return str(self._root + path[len(self._prefix) :])
        return str(pafs.FileSystem.from_uri(path)[1])

    def write_data(self, frame: DataFrame, directory: str, columns: Sequence[LakeColumn], files: int) -> list[NewFile]:
        """Write ``frame`` (already in the columns' Spark types) as at most ``files`` data files."""
        from pyspark.sql import functions as sf

        staging = f"{self.data_path}{STAGING}{uuid.uuid4()}"
        schema = lake_schema(columns)
        ordered = frame.select(
            *[sf.col(f.name).cast(f.dataType).alias(f.name, metadata=f.metadata) for f in schema.fields]
        )
        ordered.coalesce(max(1, files)).write.parquet(staging)
        kinds = {c.name: (c.column_id, stats_kind(c.type)) for c in columns}
        written = []
        try:
            staged = self.fs.get_file_info(pafs.FileSelector(self._local(staging)))
            self.fs.create_dir(self._local(directory))
            for info in sorted(staged, key=lambda i: i.path):
                if not info.path.endswith(".parquet"):
                    continue
                name = f"ducklake-{uuid.uuid4()}.parquet"
                self.fs.move(info.path, self._local(directory + name))
                written.append(self._describe(directory + name, name, kinds))
        finally:
            self.fs.delete_dir(self._local(staging))
        written = [f for f in written if f.record_count > 0]
        for file in written:
            self.metrics.file_written("data", file.size_bytes)
        return written

    def write_delete(self, table: LakeTable, data_file_path: str, positions: pa.Table) -> NewFile:
        """A positional delete file for one data file: ``pos`` and, when present, ``_ducklake_internal_snapshot_id``."""
        name = f"ducklake-{uuid.uuid4()}-delete.parquet"
        fields = [pa.field("file_path", pa.string()), pa.field("pos", pa.int64())]
        arrays: list[pa.Array] = [pa.array([data_file_path] * positions.num_rows, pa.string()), positions["pos"]]
        if "_ducklake_internal_snapshot_id" in positions.column_names:
            fields.append(pa.field("_ducklake_internal_snapshot_id", pa.int64()))
            arrays.append(positions["_ducklake_internal_snapshot_id"])
        schema = pa.schema(
            [f.with_metadata({b"PARQUET:field_id": str(DELETE_FIELD_IDS[f.name]).encode()}) for f in fields]
        )
        path = table.directory + name
        self.fs.create_dir(self._local(table.directory))
        pq.write_table(pa.table(arrays, schema=schema), self._local(path), filesystem=self.fs)
        file = self._describe(path, name, {})
        self.metrics.file_written("delete", file.size_bytes)
        return file

    def read_delete(self, path: str, begin_snapshot: int) -> pa.Table:
        """A delete file's positions with the snapshot that deleted each (``begin_snapshot`` when not recorded)."""
        table = pq.read_table(self._local(path), filesystem=self.fs)
        if "_ducklake_internal_snapshot_id" not in table.column_names:
            table = table.append_column(
                "_ducklake_internal_snapshot_id", pa.array([begin_snapshot] * table.num_rows, pa.int64())
            )
        return table.select(["pos", "_ducklake_internal_snapshot_id"])

    def native_columns(self, path: str, columns: Sequence[LakeColumn]) -> frozenset[int]:
        """Ids of the ``NATIVE_TEXT_TYPES`` columns that a data file stores in their own Parquet type, not as text."""
        ids = {c.column_id for c in columns if c.type in NATIVE_TEXT_TYPES}
        if not ids:
            return frozenset()
        types = self._field_types(path)
        return frozenset(i for i in ids if i in types and not pa.types.is_string(types[i]))

    def _read_field_types(self, path: str) -> dict[int, pa.DataType]:
        """A data file's top-level column types by field id, from its footer (data files never change: cached)."""
        schema = pq.read_schema(self._local(path), filesystem=self.fs)
        return {
            int(f.metadata[b"PARQUET:field_id"]): f.type
            for f in schema
            if f.metadata and b"PARQUET:field_id" in f.metadata
        }

    def remove(self, directory: str, files: Sequence[NewFile]) -> None:
        """Delete files that never got registered (a commit that lost a conflict)."""
        for file in files:
            self.fs.delete_file(self._local(directory + file.name))

    def _describe(self, path: str, name: str, kinds: dict[str, tuple[int, Stats | None]]) -> NewFile:
        local = self._local(path)
        size = self.fs.get_file_info(local).size
        with self.fs.open_input_file(local) as handle:
            handle.seek(size - 8)
            footer_size = struct.unpack("<I", handle.read(4))[0]
            handle.seek(0)
            metadata = pq.ParquetFile(handle).metadata
        return NewFile(name, metadata.num_rows, size, footer_size, file_stats(metadata, kinds))


def read_rows(
    spark: SparkSession, storage: LakeStorage, columns: Sequence[LakeColumn], data_paths: Sequence[str]
) -> DataFrame:
    """Every row of data files (deleted ones too), with ``_etl_file`` (file name) and ``_etl_pos`` (row position).

    Columns are matched by field id, so files written before a rename read correctly. Files that store a
    text-held column in its own Parquet type (``NATIVE_TEXT_TYPES``) are read apart and their values
    turned into this writer's text, so every file's rows compare alike.
    """
    groups: dict[frozenset[int], list[str]] = {}
    for path in data_paths:
        groups.setdefault(storage.native_columns(path, columns), []).append(path)
    frames = [_read_files(spark, columns, paths, native) for native, paths in groups.items()]
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def _read_files(
    spark: SparkSession, columns: Sequence[LakeColumn], data_paths: Sequence[str], native: frozenset[int]
) -> DataFrame:
    from pyspark.sql import functions as sf

    return (
        spark.read.schema(lake_schema(columns, native))
        .parquet(*data_paths)
        .select(
            *[_as_text(c) if c.column_id in native else sf.col(c.name) for c in columns],
            _file_name(sf.col("_metadata.file_path")).alias("_etl_file"),
            sf.col("_metadata.row_index").alias("_etl_pos"),
        )
    )


def _as_text(column: LakeColumn) -> Column:
    """A native UUID (16 bytes) or TIME (microseconds) as the text this writer stores for it."""
    from pyspark.sql import functions as sf

    value = sf.col(column.name)
    if column.type == "uuid":
        hexed = sf.lower(sf.hex(value))
        parts = [sf.substring(hexed, start, length) for start, length in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))]
        text = sf.concat_ws("-", *parts)
    else:
        hours, minutes = sf.floor(value / 3_600_000_000), sf.floor(value / 60_000_000) % 60
        seconds, micros = sf.floor(value / 1_000_000) % 60, value % 1_000_000
        text = sf.format_string("%02d:%02d:%02d.%06d", hours, minutes, seconds, micros)
    return sf.when(value.isNotNull(), text).alias(column.name)


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
