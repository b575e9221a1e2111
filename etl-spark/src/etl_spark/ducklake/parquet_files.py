"""Data files written with pyarrow, where the rows are: in a Spark task, or on the driver.

A file is written in place under its table's directory, as ``ducklake-<uuid>.parquet``, and is
described by its footer (rows, sizes, column statistics) for the catalog. It is registered in the
catalog only later, by the driver, so a writer that dies leaves at worst an unregistered file. Names
start with a prefix chosen per job (``job_prefix``), so the files of a failed task attempt are found
and removed. Every column, list elements included, carries its DuckLake column id as Parquet field
id, and values are in their file form (``types.Form.FILE``): DuckDB reads these files as its own. Codec and
row groups follow the lake's Parquet options (``ParquetOptions``).
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from etl.api import DestinationError
from etl_spark.ducklake.catalog import LakeColumn, NewFile
from etl_spark.ducklake.stats import ColumnStats, file_stats, stats_kind
from etl_spark.ducklake.types import FIELD_ID, LIST, Form, Stats, arrow_of, convert

DICTIONARY_PAGE_BYTES: Final = 64 * 1024
"""A column chunk stops dictionary encoding once its dictionary passes this size. Low-cardinality columns
keep their dictionaries; high-cardinality ones fall back to plain pages early, instead of after pyarrow's
1 MiB default: measured on the copy bench's table, that halves the write time and shrinks the files."""
MIN_ROW_GROUP_ROWS: Final = 2048
"""The fewest rows DuckDB puts in a row group whatever ``parquet_row_group_size`` says (its vector size)."""
MAX_ROW_GROUP_ROWS: Final = 64 * 1024 * 1024
"""The most rows pyarrow puts in a row group (its ``max_row_group_length``)."""
_CODECS: Final = {
    "uncompressed": "none",
    "snappy": "snappy",
    "gzip": "gzip",
    "zstd": "zstd",
    "brotli": "brotli",
    "lz4": "lz4",  # pyarrow writes LZ4_RAW, as DuckDB does for both names
    "lz4_raw": "lz4",
}


@dataclass(frozen=True)
class ParquetOptions:
    """How data files are encoded: the lake's ``parquet_*`` options (``CALL lake.set_option(...)`` in DuckDB),
    with DuckLake's defaults (its codec and row-group size) where a lake sets none."""

    compression: str = "snappy"
    """pyarrow's name of the codec."""
    compression_level: int | None = None
    """For zstd (DuckLake's default there: 3); other codecs take their own default."""
    row_group_rows: int = 122_880

    @classmethod
    def of(cls, options: Mapping[str, str], schema: str | None = None, table: str | None = None) -> ParquetOptions:
        """The encoding ``options`` ask for: a table's (``LakeOptions.of_table``), or those of one scope (the lake's,
        ``schema``'s or ``table``'s, which messages name). ``DestinationError`` for a value this writer cannot
        apply. Every value is checked whatever the codec, so options that pass scope by scope pass merged."""

        def bad(key: str, what: str) -> DestinationError:
            scope = f", schema => '{schema}'" if schema is not None else ""
            scope += f", table_name => '{table}'" if table is not None else ""
            owner = "" if schema is None else f" of schema {schema}" if table is None else f" of table {schema}.{table}"
            return DestinationError(
                f"the lake's option {key}{owner} is {options[key]!r}, which this writer cannot apply",
                hint=f"set it to {what} (in DuckDB: CALL lake.set_option('{key}', ...{scope})), then start the"
                " pipeline again",
            )

        def integer(key: str, default: int, allowed: range, what: str) -> int:
            text = options.get(key)
            if text is None:
                return default
            try:
                value = int(text)
            except ValueError:
                raise bad(key, what) from None
            if value not in allowed:
                raise bad(key, what)
            return value

        codec = options.get("parquet_compression", "snappy").strip().lower()
        if codec not in _CODECS:
            raise bad("parquet_compression", "one of " + ", ".join(_CODECS))
        level = integer("parquet_compression_level", 3, range(-131072, 23), "an integer from -131072 to 22")
        rows = integer("parquet_row_group_size", cls.row_group_rows, range(1, 2**31), "an integer from 1 to 2147483647")
        return cls(
            _CODECS[codec], level if codec == "zstd" else None, min(max(rows, MIN_ROW_GROUP_ROWS), MAX_ROW_GROUP_ROWS)
        )


METADATA_SCHEMA: Final = pa.schema(
    [
        ("name", pa.string()),
        ("record_count", pa.int64()),
        ("size_bytes", pa.int64()),
        ("footer_size", pa.int64()),
        ("stats", pa.string()),
    ]
)
"""What a Spark task returns per file it wrote: the file's metadata, never its rows."""

ROW_ID: Final = LakeColumn(2147483540, "_ducklake_internal_row_id", "int64", True)
"""The row ids of a file's rows, in files whose rows keep the ids they had (flushed, merged, rewritten)."""
ONE_FILE: Final = 2**62
"""A target size no file reaches: a job that writes exactly one file (a flush, a merge, a rewrite)."""
SNAPSHOT: Final = LakeColumn(2147483539, "_ducklake_internal_snapshot_id", "int64", True)
"""The snapshot that inserted each row, in files of rows of many snapshots (and, in delete files, that
deleted each)."""


@dataclass(frozen=True)
class DataFileSpec:
    """Where and how to write a table's data files; small, and pickled into Spark tasks."""

    data_path: str
    """The lake's data path (a local path or a URI pyarrow's file systems reach)."""
    directory: str
    """The table's directory under it, ending in ``/``."""
    columns: tuple[LakeColumn, ...]
    target_size_bytes: int
    """A file is closed once it holds about this many bytes, and the next one started."""
    prefix: str
    """Every file name starts with it (``job_prefix``)."""
    parquet: ParquetOptions


def job_prefix() -> str:
    """A file name prefix of its own for one write job: ``ducklake-`` and the first two groups of a uuid.

    The rest of each name completes the uuid, so names keep the shape DuckDB gives its files.
    """
    return f"ducklake-{str(uuid.uuid4())[:13]}"


def file_schema(columns: Sequence[LakeColumn]) -> pa.Schema:
    """The Arrow schema of a table's data files: field ids on every column and list element."""
    return pa.schema([_field(c.name, c) for c in columns])


def _field(name: str, column: LakeColumn) -> pa.Field:
    if column.type == LIST and column.element is not None:
        kind: pa.DataType = pa.list_(_field("element", column.element))
    else:
        kind = arrow_of(column, Form.FILE)
    return pa.field(name, kind, nullable=True, metadata={FIELD_ID: str(column.column_id).encode()})


def write_data_files(spec: DataFileSpec, parts: Iterable[pa.RecordBatch | pa.Table]) -> list[NewFile]:
    """Write the rows of ``parts`` (columns named as ``spec.columns``, in either value form) as data files.

    Empty input writes no file.
    """
    fs, root = filesystem(spec.data_path)
    schema = file_schema(spec.columns)
    written: list[NewFile] = []
    file: _OpenFile | None = None
    try:
        for rows in _row_groups(parts, spec.parquet.row_group_rows):
            table = pa.Table.from_arrays(
                [convert(rows[c.name], c, Form.FILE).cast(f.type) for c, f in zip(spec.columns, schema, strict=True)],
                schema=schema,
            )
            if file is None:
                file = _OpenFile(fs, root, spec, schema)
            file.writer.write_table(table, row_group_size=spec.parquet.row_group_rows)
            if file.sink.tell() >= spec.target_size_bytes:
                written.append(file.close(spec.columns))
                file = None
        if file is not None:
            written.append(file.close(spec.columns))
            file = None
    finally:
        if file is not None:
            file.abandon()
    return written


def _row_groups(parts: Iterable[pa.RecordBatch | pa.Table], size: int) -> Iterator[pa.Table]:
    """The rows of ``parts`` in tables of ``size`` rows, the last one smaller: one row group each (copy batches are
    smaller, a batch of streamed upserts may be larger). Slices, no copies."""
    pending: list[pa.Table] = []
    rows = 0
    for part in parts:
        table = pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) else part
        while table.num_rows:
            taken = table.slice(0, size - rows)
            pending.append(taken)
            rows += taken.num_rows
            table = table.slice(taken.num_rows)
            if rows == size:
                yield pa.concat_tables(pending)
                pending, rows = [], 0
    if pending:
        yield pa.concat_tables(pending)


class _OpenFile:
    def __init__(self, fs: pafs.FileSystem, root: str, spec: DataFileSpec, schema: pa.Schema) -> None:
        self.fs = fs
        self.name = f"{spec.prefix}{str(uuid.uuid4())[13:]}.parquet"
        self.path = local_path(root, spec.data_path, spec.directory + self.name)
        fs.create_dir(self.path.rsplit("/", 1)[0])
        self.sink = fs.open_output_stream(self.path)
        parquet = spec.parquet
        self.writer = pq.ParquetWriter(
            self.sink,
            schema,
            compression=parquet.compression,
            compression_level=parquet.compression_level,
            dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES,
        )

    def close(self, columns: Sequence[LakeColumn]) -> NewFile:
        """Finish the file; its entry comes from the writer's own footer, without reading the file back."""
        data_end = self.sink.tell()
        self.writer.close()  # writes the footer, then its length and PAR1 (8 bytes)
        size = self.sink.tell()
        self.sink.close()
        metadata = self.writer.writer.metadata
        return NewFile(self.name, metadata.num_rows, size, size - data_end - 8, file_stats(metadata, _kinds(columns)))

    def abandon(self) -> None:
        try:
            self.writer.close()
            self.sink.close()
        finally:
            self.fs.delete_file(self.path)


def describe(fs: pafs.FileSystem, path: str, name: str, columns: Sequence[LakeColumn]) -> NewFile:
    """A file's catalog entry read from its footer: rows, sizes, top-level column statistics."""
    size = fs.get_file_info(path).size
    with fs.open_input_file(path) as handle:
        handle.seek(size - 8)
        footer_size = struct.unpack("<I", handle.read(4))[0]
        handle.seek(0)
        metadata = pq.ParquetFile(handle).metadata
    return NewFile(name, metadata.num_rows, size, footer_size, file_stats(metadata, _kinds(columns)))


def own_stats(columns: Sequence[LakeColumn], file: NewFile) -> NewFile:
    """The file's entry with the statistics of ``columns`` only (not those of its row ids and snapshots)."""
    own = {c.column_id for top in columns for c in top.with_elements()}
    return replace(file, stats=[s for s in file.stats if s.column_id in own])


def _kinds(columns: Sequence[LakeColumn]) -> dict[str, tuple[int, Stats | None]]:
    return {c.name: (c.column_id, stats_kind(c.type)) for c in columns}


def metadata_batch(files: Sequence[NewFile]) -> pa.RecordBatch:
    """Files' entries as one Arrow batch (what a Spark task returns)."""
    return pa.RecordBatch.from_pylist(
        [
            {
                "name": f.name,
                "record_count": f.record_count,
                "size_bytes": f.size_bytes,
                "footer_size": f.footer_size,
                "stats": json.dumps([asdict(s) for s in f.stats]),
            }
            for f in files
        ],
        schema=METADATA_SCHEMA,
    )


def from_metadata(row: Mapping[str, Any]) -> NewFile:
    """A file entry back from a row of ``metadata_batch``."""
    stats = [ColumnStats(**s) for s in json.loads(row["stats"])]
    return NewFile(row["name"], int(row["record_count"]), int(row["size_bytes"]), int(row["footer_size"]), stats)


def filesystem(data_path: str) -> tuple[pafs.FileSystem, str]:
    """The file system of a lake's data path, and the data path as a path of it (ending in ``/``)."""
    fs, root = pafs.FileSystem.from_uri(data_path)
    return fs, root.rstrip("/") + "/"


def local_path(root: str, data_path: str, path: str) -> str:
    """A lake path (under ``data_path``) as a path of the file system whose root is ``root``."""
    if path.startswith(data_path):
        return root + path[len(data_path) :]
    return str(pafs.FileSystem.from_uri(path)[1])
