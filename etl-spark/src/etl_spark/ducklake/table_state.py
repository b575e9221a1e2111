"""What planning reads of the catalog about a batch's tables, read for all of them at once.

A batch touching many tables would otherwise pay about ten catalog statements per table (its lake table and
columns, watermark, inlined data tables, data files, key bounds). Read per statement for all of them, on one
connection, it pays about ten in all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from etl.api import TableSchema
from etl_spark.ducklake.catalog import Catalog, DataFile, Handle, LakeTable


@dataclass(frozen=True)
class TableState:
    """A source table's state in the lake, as planning reads it."""

    handle: Handle | None
    """``None`` before the table's first write (or once its lake table is gone: see ``tracked``)."""
    tracked: bool = False
    """Whether this pipeline recorded a lake table for it, which may since have been dropped."""
    max_column_id: int = 0
    """The highest column id the lake table ever used."""
    inlined_tables: list[str] = field(default_factory=list)
    """Its inlined data tables that hold rows."""
    data_files: list[DataFile] = field(default_factory=list)
    """Its active data files, each with its active delete file, oldest first."""
    key_column_id: int | None = None
    """The lake column of a one-column integer key (by the key's name), whose statistics ``key_bounds`` are."""
    key_bounds: dict[int, tuple[int, int]] = field(default_factory=dict)
    """``data_file_id -> (min, max)`` of the ``key_column_id`` column, for the files whose statistics hold both (a
    file left out may hold any key)."""

    def bounds_of(self, column_id: int) -> dict[int, tuple[int, int]]:
        """``key_bounds`` if they are of that column (a schema change in the batch may have given the key's name to
        another column), else none: every file may hold any key."""
        return self.key_bounds if column_id == self.key_column_id else {}


def read_states(catalog: Catalog, schemas: Sequence[TableSchema]) -> dict[int, TableState]:
    """Each source table's ``TableState``, by source table id, read on one connection."""
    with catalog.engine.connect() as conn:
        handles = catalog.handles([s.id for s in schemas], conn)
        tables = [h.table for h in handles.values() if h is not None]
        if not tables:
            return {s.id: TableState(None, tracked=s.id in handles) for s in schemas}
        ids = [t.table_id for t in tables]
        max_ids = catalog.max_column_ids(ids, conn)
        inlined = catalog.inlined_tables_of(tables, conn)
        files = catalog.data_files_of(tables, conn)
        keys = {
            handle.table.table_id: column_id
            for s in schemas
            if (handle := handles.get(s.id)) is not None and (column_id := _integer_key(s, handle.table)) is not None
        }
        bounds = catalog.integer_bounds(keys, conn)
    states = {}
    for schema in schemas:
        handle = handles.get(schema.id)
        if handle is None:
            states[schema.id] = TableState(None, tracked=schema.id in handles)
            continue
        table_id = handle.table.table_id
        states[schema.id] = TableState(
            handle,
            tracked=True,
            max_column_id=max_ids.get(table_id, 0),
            inlined_tables=inlined[table_id],
            data_files=files[table_id],
            key_column_id=keys.get(table_id),
            key_bounds=bounds.get(table_id, {}),
        )
    return states


def _integer_key(schema: TableSchema, table: LakeTable) -> int | None:
    """The lake column id of the source table's key when that is one integer column the lake table has."""
    if len(schema.key_columns) != 1:
        return None
    name = schema.key_columns[0].name
    column = next((c for c in table.columns if c.name == name), None)
    return column.column_id if column is not None and column.type.startswith("int") else None
