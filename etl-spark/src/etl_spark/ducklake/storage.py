"""Lake files seen from the driver: data files written here or by Spark tasks, delete files, footers.

Data files are written by pyarrow (``parquet_files``): rows already on the driver are written here, rows
in a Spark frame by the tasks that hold them (``write_frame``), which return only each file's
metadata. Either way a file is registered in the catalog only after it is complete, so a crash leaves
at worst an unregistered file; the files of a failed job are removed here (``remove_job``). Positional
delete files use the field ids DuckDB gives them.
"""

from __future__ import annotations

import functools
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import structlog

from etl.api import TableError
from etl_spark.ducklake.catalog import Composed, DataFile, DeleteFile, LakeColumn, LakeTable, NewFile, inside
from etl_spark.ducklake.initial_default import default_values
from etl_spark.ducklake.key_cache import LookupCache
from etl_spark.ducklake.metrics import DuckLakeMetrics
from etl_spark.ducklake.parquet_files import (
    METADATA_SCHEMA,
    SNAPSHOT,
    DataFileSpec,
    ParquetOptions,
    describe,
    from_metadata,
    job_prefix,
    local_path,
    metadata_batch,
    write_data_files,
)
from etl_spark.ducklake.types import FIELD_ID, Form, arrow_of, convert
from etl_spark.task_setup import prepare_task

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NATIVE_TYPES: Final = ("uuid", "time")
"""Lake types that files of earlier versions of this writer hold as text, and newer files (and DuckDB's) in
Parquet's own UUID and TIME types."""
DELETE_FIELD_IDS: Final = {"file_path": 2147483646, "pos": 2147483645, SNAPSHOT.name: SNAPSHOT.column_id}
LAKE_FILE: Final = re.compile(
    r"ducklake-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(-delete)?\.parquet"
)
"""The names of the files this writer and DuckDB write into a lake: the only files ``delete`` removes."""

log = structlog.get_logger(__name__)


class LakeStorage:
    """File operations under a lake's data path (any file system pyarrow reaches: local, s3, gcs, ...)."""

    def __init__(self, data_path: str, metrics: DuckLakeMetrics | None = None, key_cache_bytes: int = 0) -> None:
        self.data_path = data_path
        self.metrics = metrics if metrics is not None else DuckLakeMetrics()
        """Counts the files written (``etl_ducklake_files_written_total``, ``..._bytes_written_total``)."""
        self.fs, root = pafs.FileSystem.from_uri(data_path)
        self._root = root.rstrip("/") + "/"
        self._field_types = functools.lru_cache(maxsize=4096)(self._read_field_types)
        self.lookups = LookupCache(key_cache_bytes)
        """Key columns of data files and positions of delete files, kept for the key lookup."""

    def _local(self, path: str) -> str:
        return local_path(self._root, self.data_path, path)

    def spec(
        self, directory: str, columns: Sequence[LakeColumn], target_size_bytes: int, parquet: ParquetOptions
    ) -> DataFileSpec:
        """How to write one job's data files into ``directory`` (a fresh name prefix each time).

        A directory outside the data path (a table a hostile name placed there before this writer made names
        safe) is refused: nothing is written outside the lake."""
        if not inside(self.data_path, directory):
            raise TableError(
                f"the lake table's directory {directory} lies outside the lake's data path {self.data_path}",
                hint="resync the table (etl resync --table ...): its new lake table gets a directory inside the lake",
            )
        return DataFileSpec(self.data_path, directory, tuple(columns), target_size_bytes, job_prefix(), parquet)

    # -- data files ------------------------------------------------------------------------------
    def write_rows(self, spec: DataFileSpec, rows: pa.Table) -> list[NewFile]:
        """Write rows held on the driver (a streamed batch's upserts)."""
        return self.written(spec, lambda: write_data_files(spec, [rows]))

    def write_frame(self, frame: DataFrame, spec: DataFileSpec) -> list[NewFile]:
        """Write a Spark frame's rows (columns named as ``spec.columns``, few: a streamed batch's) in one task,
        which writes the files and returns their metadata."""
        return self.written(spec, lambda: run_file_tasks(frame.coalesce(1), spec, write_partition(spec)))

    def write_job(
        self,
        spark: SparkSession,
        spec: DataFileSpec,
        count: int,
        rows_of: Callable[[int], Iterable[pa.RecordBatch | pa.Table]],
        description: str,
    ) -> list[NewFile]:
        """One Spark job named ``description``, of ``count`` tasks, task ``i`` writing the rows of ``rows_of(i)``
        (``write_indexed``); the files, in task order (``written``)."""
        spark.sparkContext.setJobDescription(description)
        try:
            return self.written(spec, lambda: write_indexed(spark, count, spec, rows_of))
        finally:
            spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]

    def written(self, spec: DataFileSpec, write: Callable[[], list[NewFile]]) -> list[NewFile]:
        """Run a write job: on success keep the files it reports (and count them), on failure remove them all."""
        try:
            files = write()
        except BaseException:
            self.remove_job(spec, keep=())
            raise
        self.remove_job(spec, keep=[f.name for f in files])  # a failed task attempt's files
        for file in files:
            self.metrics.file_written("data", file.size_bytes)
        return files

    def remove_job(self, spec: DataFileSpec, keep: Iterable[str]) -> None:
        """Delete the files of a write job (``spec.prefix``) that are not in ``keep``."""
        kept = set(keep)
        try:
            listed = self.fs.get_file_info(pafs.FileSelector(self._local(spec.directory), allow_not_found=True))
        except FileNotFoundError:
            return
        for info in listed:
            name = info.base_name
            if name.startswith(spec.prefix) and name not in kept:
                self.fs.delete_file(info.path)

    def remove(self, directory: str, files: Sequence[NewFile]) -> None:
        """Delete files that never got registered (a commit that lost a conflict)."""
        for file in files:
            self.fs.delete_file(self._local(directory + file.name))

    def delete(self, paths: Iterable[str]) -> int:
        """Delete files of the lake (absolute paths) that the catalog no longer knows; those already gone are
        skipped. How many were deleted.

        Only files this lake's writers name (``LAKE_FILE``) inside the data path are deleted; any other path
        is left alone with a warning, whatever a catalog or a directory listing says."""
        deleted = 0
        for path in paths:
            if not (inside(self.data_path, path) and LAKE_FILE.fullmatch(path.rsplit("/", 1)[-1])):
                log.warning("left a file that is not the lake's in place", path=path)
                continue
            try:
                self.fs.delete_file(self._local(path))
            except FileNotFoundError:
                continue
            deleted += 1
        return deleted

    def files_in(self, directory: str) -> dict[str, float]:
        """The files directly under a lake directory (absolute paths) with their modification times (epoch
        seconds)."""
        selector = pafs.FileSelector(self._local(directory), allow_not_found=True)
        return {
            directory + info.base_name: info.mtime.timestamp()
            for info in self.fs.get_file_info(selector)
            if info.type == pafs.FileType.File and info.mtime is not None
        }

    def discard(self, directory: str, composed: Composed) -> None:
        """Delete a composed file, and its delete file, that never got registered."""
        self.remove(directory, [composed.file, *([composed.deletes] if composed.deletes else [])])

    # -- delete files ----------------------------------------------------------------------------
    def write_delete(
        self, table: LakeTable, data_file_path: str, positions: pa.Table, prefix: str | None = None
    ) -> NewFile:
        """A positional delete file for one data file: ``pos`` and, when present, ``_ducklake_internal_snapshot_id``;
        its name starts with ``prefix`` (a ``job_prefix``) when given."""
        name = f"{prefix or job_prefix()}{str(uuid.uuid4())[13:]}-delete.parquet"
        fields = [pa.field("file_path", pa.string()), pa.field("pos", pa.int64())]
        arrays: list[pa.Array] = [pa.array([data_file_path] * positions.num_rows, pa.string()), positions["pos"]]
        if SNAPSHOT.name in positions.column_names:
            fields.append(pa.field(SNAPSHOT.name, pa.int64()))
            arrays.append(positions[SNAPSHOT.name])
        schema = pa.schema([f.with_metadata({FIELD_ID: str(DELETE_FIELD_IDS[f.name]).encode()}) for f in fields])
        path = table.directory + name
        self.fs.create_dir(self._local(table.directory))
        pq.write_table(pa.table(arrays, schema=schema), self._local(path), filesystem=self.fs)
        file = describe(self.fs, self._local(path), name, ())
        self.metrics.file_written("delete", file.size_bytes)
        return file

    def read_delete(self, path: str, begin_snapshot: int) -> pa.Table:
        """A delete file's positions with the snapshot that deleted each (``begin_snapshot`` when not recorded)."""
        return _stamped(pq.read_table(self._local(path), filesystem=self.fs), begin_snapshot)

    def deleted(self, delete: DeleteFile) -> pa.Table:
        """``read_delete`` of a registered delete file, kept in ``lookups``."""
        read = functools.partial(self.read_delete, delete.path, delete.begin_snapshot)
        table = self.lookups.get(_delete_positions(delete), read)
        assert isinstance(table, pa.Table)
        return table

    def remember_deleted(self, delete: DeleteFile, positions: pa.Table) -> None:
        """Keep the positions of a delete file this writer registered (as ``write_delete`` got them)."""
        self.lookups.put(_delete_positions(delete), _stamped(positions, delete.begin_snapshot))

    # -- key lookups -----------------------------------------------------------------------------
    def positions_of_keys(self, column: LakeColumn, files: Sequence[DataFile], keys: pa.Array) -> pa.Table:
        """``_etl_file`` (file name), ``_etl_pos`` and ``_etl_key`` (the value, in the type of ``keys``) of the rows
        of data files whose value of ``column`` (an integer or text column, found by field id) is one of ``keys``;
        deleted rows included. A file written
        before the column was widened holds narrower values: they are widened to the keys' type."""
        found = []
        for data_file in files:
            path = data_file.path
            cached = _key_column(data_file.data_file_id, path, column.column_id)
            values = self.lookups.get(cached, functools.partial(self._column, path, column))
            if values is None:  # a file from before the column existed: its rows hold NULL there
                continue
            values = pc.cast(values, keys.type)
            hits = pc.indices_nonzero(pc.is_in(values, value_set=keys))
            if len(hits):
                file = pa.array([path.rsplit("/", 1)[-1]] * len(hits), pa.string())
                key = values.take(hits)
                found.append(pa.table({"_etl_file": file, "_etl_pos": pc.cast(hits, pa.int64()), "_etl_key": key}))
        if not found:
            empty = [pa.array([], pa.string()), pa.array([], pa.int64()), pa.array([], keys.type)]
            return pa.table(empty, names=["_etl_file", "_etl_pos", "_etl_key"])
        return pa.concat_tables(found)

    def values_at(self, path: str, positions: np.ndarray, columns: Sequence[LakeColumn]) -> list[pa.Array]:
        """A data file's values of ``columns`` (found by field id, in their file form; where the file does not hold a
        column, what DuckDB reads there) at ``positions`` (ascending), reading only the row groups that hold them,
        one at a time (a row group of a large column is what the driver holds at once)."""
        with self.fs.open_input_file(self._local(path)) as handle:
            parquet = pq.ParquetFile(handle)
            meta = parquet.metadata
            starts = np.cumsum([0] + [meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
            group_of = np.searchsorted(starts, positions, side="right") - 1
            names = [_name_of_field(parquet.schema_arrow, c.column_id) for c in columns]
            present = [n for n in names if n is not None]
            parts: dict[str, list[pa.Array]] = {n: [] for n in present}
            for group in np.unique(group_of) if present else []:
                read = parquet.read_row_group(int(group), columns=present)
                local = pa.array(positions[group_of == group] - starts[group])
                for name in present:
                    parts[name].append(read[name].take(local).combine_chunks())
        return [
            _absent(c, len(positions)) if name is None else convert(pa.concat_arrays(parts[name]), c, Form.FILE)
            for c, name in zip(columns, names, strict=True)
        ]

    def warm(self, column: LakeColumn, files: Sequence[DataFile], stop: threading.Event) -> bool:
        """Read into ``lookups`` what ``positions_of_keys`` reads of ``files`` (their values of ``column``, their
        delete files) while it has room and ``stop`` is not set; whether it had room for them all."""
        for data_file in files:
            if stop.is_set() or self.lookups.nbytes >= self.lookups.max_bytes:
                return False
            cached = _key_column(data_file.data_file_id, data_file.path, column.column_id)
            self.lookups.get(cached, functools.partial(self._column, data_file.path, column))
            if data_file.delete is not None:
                self.deleted(data_file.delete)
        return True

    def remember_keys(self, data_file_id: int, path: str, column_id: int, values: pa.ChunkedArray) -> None:
        """Keep the key column of a data file this writer registered (its values in file order)."""
        self.lookups.put(_key_column(data_file_id, path, column_id), values)

    def _column(self, path: str, column: LakeColumn) -> pa.ChunkedArray | None:
        """A data file's values of a column found by field id; ``None`` when the file does not hold it."""
        with self.fs.open_input_file(self._local(path)) as handle:
            parquet = pq.ParquetFile(handle)
            name = _name_of_field(parquet.schema_arrow, column.column_id)
            return None if name is None else parquet.read(columns=[name]).column(0)

    # -- footers ---------------------------------------------------------------------------------
    def native_columns(self, path: str, columns: Sequence[LakeColumn]) -> frozenset[int]:
        """Ids of the ``NATIVE_TYPES`` columns and list elements that a data file holds in their own Parquet
        type, not as text."""
        ids = {c.column_id for column in columns for c in column.with_elements() if c.type in NATIVE_TYPES}
        if not ids:
            return frozenset()
        types = self._field_types(path)
        return frozenset(i for i in ids if i in types and not pa.types.is_string(types[i]))

    def defaulted_columns(self, path: str, columns: Sequence[LakeColumn]) -> frozenset[int]:
        """Ids of the columns with an initial default that a data file does not hold (written before them)."""
        with_default = [c.column_id for c in columns if c.initial_default is not None]
        if not with_default:
            return frozenset()
        types = self._field_types(path)
        return frozenset(i for i in with_default if i not in types)

    def _read_field_types(self, path: str) -> dict[int, pa.DataType]:
        """A data file's column and list element types by field id (data files never change: cached)."""
        found: dict[int, pa.DataType] = {}
        fields = list(pq.read_schema(self._local(path), filesystem=self.fs))
        while fields:
            field = fields.pop()
            if field.metadata and FIELD_ID in field.metadata:
                found[int(field.metadata[FIELD_ID])] = field.type
            if pa.types.is_list(field.type):
                fields.append(field.type.value_field)
        return found


def _absent(column: LakeColumn, rows: int) -> pa.Array:
    """What DuckDB reads of a column from a file written before it was added: its initial default, else NULL."""
    if column.initial_default is not None:
        return default_values(column, column.initial_default, rows, Form.FILE)
    return pa.nulls(rows, arrow_of(column, Form.FILE))


def _name_of_field(schema: pa.Schema, field_id: int) -> str | None:
    wanted = str(field_id).encode()
    for field in schema:
        if field.metadata and field.metadata.get(FIELD_ID) == wanted:
            return str(field.name)
    return None


def write_partition(spec: DataFileSpec) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The task that writes one frame partition's rows as data files (for ``mapInArrow``)."""

    def task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_task()
        yield metadata_batch(write_data_files(spec, batches))

    return task


def run_file_tasks(
    frame: DataFrame, spec: DataFileSpec, task: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
) -> list[NewFile]:
    """Run ``task`` on every partition of ``frame`` and collect the metadata of the files the tasks wrote."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    spark_types = {pa.string(): StringType(), pa.int64(): LongType()}
    schema = StructType([StructField(f.name, spark_types[f.type]) for f in METADATA_SCHEMA])
    return [from_metadata(row.asDict()) for row in frame.mapInArrow(task, schema).collect()]


def write_indexed(
    spark: SparkSession, count: int, spec: DataFileSpec, rows_of: Callable[[int], Iterable[pa.RecordBatch | pa.Table]]
) -> list[NewFile]:
    """Run ``count`` Spark tasks, task ``i`` writing the rows of ``rows_of(i)`` as data files; the files'
    metadata, in task order."""
    return run_file_tasks(spark.range(count, numPartitions=count), spec, _IndexedTask(spec, rows_of))


@dataclass(frozen=True)
class _IndexedTask:
    """The task of ``write_indexed``: a class of this module, so Spark's workers run the code they import."""

    spec: DataFileSpec
    rows_of: Callable[[int], Iterable[pa.RecordBatch | pa.Table]]

    def __call__(self, indexes: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_task()
        for batch in indexes:
            for index in pc.cast(batch.column(0), pa.int64()).to_pylist():
                yield metadata_batch(write_data_files(self.spec, self.rows_of(index)))


def _key_column(data_file_id: int, path: str, column_id: int) -> tuple[str, int, str, int]:
    return ("key", data_file_id, path, column_id)


def _delete_positions(delete: DeleteFile) -> tuple[str, int, str]:
    return ("delete", delete.delete_file_id, delete.path)


def _stamped(positions: pa.Table, begin_snapshot: int) -> pa.Table:
    """``pos`` and the snapshot that deleted each position (``begin_snapshot`` when the file records none)."""
    if SNAPSHOT.name not in positions.column_names:
        snapshots = pa.array([begin_snapshot] * positions.num_rows, pa.int64())
        positions = positions.append_column(SNAPSHOT.name, snapshots)
    return positions.select(["pos", SNAPSHOT.name])
