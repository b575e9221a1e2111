"""The values the catalog reads and writes: lake tables and columns as they stand, and what a commit adds."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from etl_spark.ducklake.stats import ColumnStats
from etl_spark.ducklake.types import LakeType

SourceColumn = tuple[int | None, int, int]
"""What this writer records of the source column a lake column holds: attribute number, type OID, type modifier."""

UNKNOWN_SOURCE_TYPE = (0, -1)
"""The type recorded when it is not known (InvalidOid): equal to no source type."""


@dataclass(frozen=True)
class LakeColumn:
    column_id: int
    name: str
    type: str
    nullable: bool
    attnum: int | None = None
    """The Postgres attribute it holds, when known (this writer records it; not for columns DuckDB added)."""
    source_type: tuple[int, int] | None = None
    """Type OID and modifier of the source column it holds, when this writer recorded them."""
    element: LakeColumn | None = None
    """The element of a ``list`` column (named ``element``, with its own id; itself a list for a nested one)."""
    initial_default: str | None = None
    """What DuckDB reads for it from files written before it existed (DuckDB's text; ``initial_default``)."""

    def with_elements(self) -> Iterator[LakeColumn]:
        """The column, then its element, the element's element, ... (ids in that order)."""
        column: LakeColumn | None = self
        while column is not None:
            yield column
            column = column.element


@dataclass(frozen=True)
class LakeTable:
    table_id: int
    schema_name: str
    name: str
    directory: str
    """Absolute directory of the table's files, ending in ``/``."""
    relative_directory: str | None
    """The directory relative to the lake's data path, when it is relative."""
    columns: tuple[LakeColumn, ...]
    """The top-level columns, in order; list elements hang off their list."""


@dataclass(frozen=True)
class DeleteFile:
    delete_file_id: int
    path: str
    begin_snapshot: int
    partial: bool
    delete_count: int


@dataclass(frozen=True)
class DataFile:
    data_file_id: int
    path: str
    record_count: int
    delete: DeleteFile | None
    size_bytes: int
    begin_snapshot: int
    row_id_start: int | None
    """``None`` when the catalog records none: a rewritten file, which holds its rows' ids
    (``_ducklake_internal_row_id``; files of flushed and merged rows hold them too, with a start)."""


@dataclass(frozen=True)
class Handle:
    """A pipeline's source table as it stands in the lake."""

    table: LakeTable
    watermark: tuple[int, int]
    """``(commit_lsn, tx_ordinal)`` of the last change applied."""


@dataclass(frozen=True)
class LakeOptions:
    """The lake's options (``ducklake_metadata``) as DuckDB's ``set_option`` keeps them: lake-wide, per schema
    and per table; a table's override its schema's, which override the lake's. Those of dropped schemas and
    tables are left out."""

    lake: Mapping[str, str]
    schemas: Mapping[str, Mapping[str, str]]
    """By schema name."""
    tables: Mapping[int, tuple[str, str, Mapping[str, str]]]
    """By table id: the table's schema and name, and its options."""

    def of_table(self, schema_name: str, table_id: int | None) -> dict[str, str]:
        """The options that hold for a table (``table_id`` ``None``: one not created yet)."""
        own = self.tables[table_id][2] if table_id is not None and table_id in self.tables else {}
        return {**self.lake, **self.schemas.get(schema_name, {}), **own}

    def scopes(self) -> Iterator[tuple[str | None, str | None, Mapping[str, str]]]:
        """The options of each scope on their own, with its schema and table name (``None`` where it has none)."""
        yield None, None, self.lake
        for schema, options in self.schemas.items():
            yield schema, None, options
        for schema, table, options in self.tables.values():
            yield schema, table, options


@dataclass(frozen=True)
class NewFile:
    """A Parquet file already in place under the table's directory, ready to register."""

    name: str
    """File name relative to the table directory."""
    record_count: int
    size_bytes: int
    footer_size: int
    stats: Sequence[ColumnStats] = ()


@dataclass(frozen=True)
class NewColumn:
    name: str
    type: LakeType
    """A ``list`` type carries its element's type (``LakeType.element``)."""
    nullable: bool
    initial_default: str | None = None
    """What the rows older than the column hold (``initial_default``, DuckDB's text); ``None``: NULL."""


@dataclass(frozen=True)
class Placed:
    """Where the rows of a file that keeps its rows' ids (``_ducklake_internal_row_id``) sit: flushed inlined
    rows, merged and rewritten files. Rows of many snapshots also carry each one's
    (``_ducklake_internal_snapshot_id``)."""

    row_id_start: int | None
    begin_snapshot: int | None
    """The first snapshot of its rows; ``None``: the commit's."""
    partial_max: int | None
    """The last snapshot of its rows, when they are of many."""


@dataclass(frozen=True)
class Composed:
    """A data file written from rows that keep their ids, ready to register, with the delete file of those of
    its rows that were already deleted (with the snapshot that deleted each)."""

    file: NewFile
    placed: Placed
    deletes: NewFile | None = None
    deletes_begin: int = 0
    """The first snapshot of the deletes."""


@dataclass(frozen=True)
class InlinedFlush:
    """Inlined rows written to a data file, ready to replace them in the catalog."""

    shape: tuple[int, int]
    """Rows, and ended rows, when they were read; the commit checks that those of row ids up to
    ``last_row_id`` are still so (rows are only ever inserted, with higher ids, ended, or removed)."""
    last_row_id: int
    written: Composed


_PLAIN: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def directory_name(name: str) -> str:
    """The directory, relative to its parent's and ending in ``/``, of a schema or table called ``name``.

    Names come from the source and may be hostile (``../../etc``, ``a/b``, control characters). Letters,
    digits, ``_`` and ``-`` stand for themselves, as in the directories DuckDB makes; every other byte of
    the UTF-8 name becomes ``~`` and two hex digits. So the directory is one path segment that cannot
    leave its parent, no two names share one, and no character needs quoting in a URI or an S3 key.
    Postgres names have at most 63 bytes, so directory names at most 189 characters.
    """
    return "".join(chr(b) if b in _PLAIN else f"~{b:02X}" for b in name.encode()) + "/"


def inside(data_path: str, directory: str) -> bool:
    """Whether a directory (absolute, as the catalog resolves it) lies inside the lake's data path: below it,
    with no ``.`` or ``..`` segment on the way."""
    if not directory.startswith(data_path):
        return False
    return all(part not in (".", "..") for part in directory[len(data_path) :].split("/"))


def table_directory(data_path: str, schema_path: str, schema_relative: Any, path: str, relative: Any) -> str:
    """A table's directory from its catalog entries: its path under its schema's, each relative or not."""
    schema = data_path + schema_path if schema_relative else schema_path
    return schema + path if relative else path
