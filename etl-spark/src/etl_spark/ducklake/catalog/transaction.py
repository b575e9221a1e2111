"""The inside of one snapshot commit: schema, table, column and file changes, and the watermark.

Ids come from the latest snapshot, read when the transaction starts; ``finish`` writes the new snapshot
row, whose primary key is the commit point. Every change also records DuckLake's change token for it
(``created_table:...``, ``altered_table:<id>``, ...), which readers and ``check_conflicts`` go by.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import pyarrow as pa
import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Connection

from etl.api import TableError
from etl_spark.ducklake.catalog import inlined, retention
from etl_spark.ducklake.catalog.column_ids import ELEMENT, ColumnIds, assign_column_ids
from etl_spark.ducklake.catalog.ddl import COLUMNS_TABLE, STATE_TABLE, TABLES, quote
from etl_spark.ducklake.catalog.model import (
    Composed,
    DataFile,
    InlinedFlush,
    LakeTable,
    NewColumn,
    NewFile,
    Placed,
    SourceColumn,
    directory_name,
)
from etl_spark.ducklake.stats import ColumnStats, arrow_stats, stats_kind, widen
from etl_spark.ducklake.types import LIST, Form, LakeType, convert

log = structlog.get_logger(__name__)

_TOKEN: Final = re.compile(r"([a-z_]+):(\d+)")
_INSERT_ONLY: Final = ("inserted_into_table", "inlined_insert")
_Params = dict[str, Any] | list[dict[str, Any]]


class CommitConflict(Exception):
    """Another writer changed a table this commit's inputs were computed from; recompute and retry."""


@dataclass(frozen=True)
class _Holder:
    """An active lake table that holds a name, and who keeps it."""

    table_id: int
    source_table_id: int | None
    """The source table this pipeline keeps in it, if this pipeline keeps it."""
    other_pipeline: int | None
    """The other pipeline that keeps it, if another one does."""


class CatalogReads(Protocol):
    """What a transaction reads of its catalog (``reads.Catalog``), passing its own connection."""

    pipeline_id: int
    author: str
    data_path: str

    def table(self, table_id: int, conn: Connection | None = None) -> LakeTable | None: ...

    def tables(self, table_ids: Sequence[int], conn: Connection | None = None) -> dict[int, LakeTable]: ...

    def max_column_id(self, table_id: int, conn: Connection | None = None) -> int: ...

    def inlined_tables(self, table: LakeTable, conn: Connection | None = None) -> list[str]: ...

    def schema_versions(self, table_ids: Sequence[int], conn: Connection | None = None) -> dict[int, int]: ...


@dataclass
class Transaction:
    """The inside of one snapshot commit; ids are allocated from the latest snapshot."""

    catalog: CatalogReads
    conn: Connection
    snapshot_id: int = 0
    schema_version: int = 0
    next_catalog_id: int = 0
    next_file_id: int = 0
    changes: list[str] = field(default_factory=list)
    _schema_changed: set[int] = field(default_factory=set)
    _ddl: bool = False

    def __post_init__(self) -> None:
        row = self.conn.execute(
            sa.text(
                "SELECT snapshot_id, schema_version, next_catalog_id, next_file_id FROM ducklake_snapshot"
                " WHERE snapshot_id = (SELECT max(snapshot_id) FROM ducklake_snapshot)"
            )
        ).one()
        self.snapshot_id = int(row.snapshot_id) + 1
        self.schema_version = int(row.schema_version)
        self.next_catalog_id = int(row.next_catalog_id)
        self.next_file_id = int(row.next_file_id)

    def _run(self, sql: str, params: _Params | None = None) -> sa.CursorResult[Any]:
        return self.conn.execute(sa.text(sql), params)

    def _insert(self, table: str, rows: _Params) -> None:
        """Insert rows into a catalog table, naming their columns (the ones left out are NULL)."""
        self.conn.execute(sa.insert(TABLES[table]), rows)

    def _change(self, token: str) -> None:
        if token not in self.changes:
            self.changes.append(token)

    def check_conflicts(self, base_snapshot: int, tables: set[int]) -> None:
        rows = self._run(
            "SELECT changes_made FROM ducklake_snapshot_changes WHERE snapshot_id > :b", {"b": base_snapshot}
        )
        for (changes,) in rows:
            for kind, ident in _TOKEN.findall(changes or ""):
                if int(ident) in tables and kind not in _INSERT_ONLY:
                    raise CommitConflict(f"{kind}:{ident} committed after snapshot {base_snapshot}")

    # -- state -----------------------------------------------------------------------------------
    def table(self, table_id: int) -> LakeTable:
        return self.tables([table_id])[table_id]

    def tables(self, table_ids: Sequence[int]) -> dict[int, LakeTable]:
        """The active tables of these ids, by id, as this transaction reads them; one that was dropped conflicts."""
        tables = self.catalog.tables(table_ids, self.conn)
        if dropped := set(table_ids) - tables.keys():
            raise CommitConflict(f"DuckLake tables {sorted(dropped)} were dropped")
        return tables

    def set_watermark(self, source_table_id: int, table_id: int, position: tuple[int, int]) -> None:
        """Record the source table's lake table and watermark. A mark for replacement stays (a plan made before
        the mark may commit after it); ``create_table`` forgets the marked row, so the copy inserts a new one."""
        params = {
            "pipeline_id": self.catalog.pipeline_id,
            "source_table_id": source_table_id,
            "table_id": table_id,
            "commit_lsn": position[0],
            "tx_ordinal": position[1],
        }
        updated = self._run(
            f"UPDATE {STATE_TABLE} SET table_id = :table_id, commit_lsn = :commit_lsn, tx_ordinal = :tx_ordinal"
            " WHERE pipeline_id = :pipeline_id AND source_table_id = :source_table_id",
            params,
        )
        if not updated.rowcount:
            self._insert(STATE_TABLE, {**params, "replaced": False})

    def set_source_columns(self, table_id: int, sources: dict[int, SourceColumn]) -> None:
        """Record which source column each column (by id) of a lake table holds, replacing what was recorded."""
        self._run(f"DELETE FROM {COLUMNS_TABLE} WHERE table_id = :t", {"t": table_id})
        if sources:
            self._insert(
                COLUMNS_TABLE,
                [
                    {"table_id": table_id, "column_id": c, "attnum": a, "type_oid": oid, "type_modifier": mod}
                    for c, (a, oid, mod) in sources.items()
                ],
            )

    def forget(self, source_table_id: int) -> None:
        self._run(
            f"DELETE FROM {STATE_TABLE} WHERE pipeline_id = :p AND source_table_id = :s",
            {"p": self.catalog.pipeline_id, "s": source_table_id},
        )

    # -- schemas and tables ----------------------------------------------------------------------
    def schema_id(self, name: str) -> int:
        """The id of the named schema, created in this snapshot when missing."""
        found = self._run(
            "SELECT schema_id FROM ducklake_schema WHERE schema_name = :n AND end_snapshot IS NULL", {"n": name}
        ).scalar()
        if found is not None:
            return int(found)
        schema_id = self._catalog_id()
        self._insert(
            "ducklake_schema",
            {
                "schema_id": schema_id,
                "schema_uuid": str(uuid.uuid4()),
                "begin_snapshot": self.snapshot_id,
                "schema_name": name,
                "path": directory_name(name),
                "path_is_relative": True,
            },
        )
        self._bump_schema_version()
        self._change(f"created_schema:{quote(name)}")
        return schema_id

    def create_table(
        self, schema_name: str, name: str, columns: Sequence[NewColumn], *, source_table_id: int
    ) -> LakeTable:
        """Create the lake table of a source table, its columns numbered as ``assign_column_ids`` numbers them
        from 1; ``set_watermark`` then records it for the source table.

        The lake table this pipeline kept for the source table is ended in this snapshot when it was marked for
        replacement (``Catalog.mark_for_replacement``), whatever its name, and its state row goes. Another active
        table of the same name is parked when it holds another source table of this pipeline (renamed at the
        source, or dropped there), else ended: this writer owns the name.
        """
        schema_id = self.schema_id(schema_name)
        self._end_replaced(source_table_id)
        holder = self._holder(schema_id, name)
        if holder is not None:
            if holder.source_table_id is not None:
                self._park(holder.table_id, holder.source_table_id)
            elif holder.other_pipeline is not None:
                raise TableError(
                    f"cannot create DuckLake table {schema_name}.{name}: pipeline {holder.other_pipeline} keeps a"
                    " table of that name in this lake",
                    hint="give each pipeline its own lake, or leave the table out of one of the publications",
                )
            else:
                self.drop_table(holder.table_id)
        table_id = self._catalog_id()
        self._insert(
            "ducklake_table",
            {
                "table_id": table_id,
                "table_uuid": str(uuid.uuid4()),
                "begin_snapshot": self.snapshot_id,
                "schema_id": schema_id,
                "table_name": name,
                "path": directory_name(name),
                "path_is_relative": True,
            },
        )
        ids = assign_column_ids(columns)
        for column, column_ids in zip(columns, ids, strict=True):
            self._insert_new_column(table_id, column.name, column.type, column.nullable, column_ids, order_offset=0)
        self._insert_stats_rows(table_id, [i for column_ids in ids for i in column_ids], contains_null=False)
        self._table_schema_changed(table_id)
        self._change(f"created_table:{quote(schema_name)}.{quote(name)}")
        return self.table(table_id)

    def _end_replaced(self, source_table_id: int) -> None:
        """End the lake table of the source table if it is marked for replacement (and still there)."""
        marked = self._run(
            f"SELECT table_id FROM {STATE_TABLE} WHERE pipeline_id = :p AND source_table_id = :s AND replaced",
            {"p": self.catalog.pipeline_id, "s": source_table_id},
        ).scalar()
        if marked is None:
            return
        if self.catalog.table(int(marked), self.conn) is not None:
            self.drop_table(int(marked))
            log.info("replaced a ducklake table by its new copy", table_id=int(marked), source_table_id=source_table_id)
        self.forget(source_table_id)

    def rename_table(self, table: LakeTable, schema_name: str, name: str) -> None:
        """Give a table a new name, in the same or another schema (created when missing), as DuckDB renames:
        its row ends and one with the same id begins. Its files stay where they are: a table moved to another
        schema gets its directory as an absolute path, since a relative one is read under the schema's."""
        schema_id = self.schema_id(schema_name)
        holder = self._holder(schema_id, name)
        if holder is not None and holder.table_id != table.table_id:
            if holder.source_table_id is None:
                raise TableError(
                    f"cannot rename DuckLake table {table.schema_name}.{table.name} to {schema_name}.{name}:"
                    " the lake has a table of that name that this pipeline does not keep",
                    hint="drop or rename that lake table, then resync this one (etl resync --table ...)",
                )
            self._park(holder.table_id, holder.source_table_id)
        row = self._run(
            "SELECT table_uuid, schema_id, path, path_is_relative FROM ducklake_table"
            " WHERE table_id = :t AND end_snapshot IS NULL",
            {"t": table.table_id},
        ).one()
        path, relative = row.path, bool(row.path_is_relative)
        if int(row.schema_id) != schema_id and relative:
            path, relative = table.directory, False
        self._run(
            "UPDATE ducklake_table SET end_snapshot = :s WHERE table_id = :t AND end_snapshot IS NULL",
            {"s": self.snapshot_id, "t": table.table_id},
        )
        self._insert(
            "ducklake_table",
            {
                "table_id": table.table_id,
                "table_uuid": row.table_uuid,
                "begin_snapshot": self.snapshot_id,
                "schema_id": schema_id,
                "table_name": name,
                "path": path,
                "path_is_relative": relative,
            },
        )
        self._table_schema_changed(table.table_id)
        self._change(f"created_table:{quote(schema_name)}.{quote(name)}")  # what DuckDB records for a rename

    def _holder(self, schema_id: int, name: str) -> _Holder | None:
        """The active table of that name, and who keeps it."""
        row = self._run(
            f"SELECT t.table_id, k.pipeline_id, k.source_table_id FROM ducklake_table t LEFT JOIN {STATE_TABLE} k"
            " ON k.table_id = t.table_id"
            " WHERE t.schema_id = :s AND t.table_name = :n AND t.end_snapshot IS NULL",
            {"s": schema_id, "n": name},
        ).first()
        if row is None:
            return None
        if row.pipeline_id is None:
            return _Holder(int(row.table_id), None, None)
        if int(row.pipeline_id) == self.catalog.pipeline_id:
            return _Holder(int(row.table_id), int(row.source_table_id), None)
        return _Holder(int(row.table_id), None, int(row.pipeline_id))

    def _park(self, table_id: int, source_table_id: int) -> None:
        """Move a table of this pipeline out of the way of a name another of its source tables took. It goes to
        ``<name>_etl_parked_<source table OID>``; its own next change gives it its source table's name again."""
        table = self.table(table_id)
        parked = f"{table.name}_etl_parked_{source_table_id}"
        self.rename_table(table, table.schema_name, parked)
        log.warning(
            "parked a ducklake table whose name another source table took",
            table=f"{table.schema_name}.{table.name}",
            parked_as=parked,
            source_table_id=source_table_id,
        )

    def drop_table(self, table_id: int) -> None:
        self._run(f"DELETE FROM {COLUMNS_TABLE} WHERE table_id = :t", {"t": table_id})
        for table in ("ducklake_table", "ducklake_column", "ducklake_data_file", "ducklake_delete_file"):
            self._run(
                f"UPDATE {table} SET end_snapshot = :s WHERE table_id = :t AND end_snapshot IS NULL",
                {"s": self.snapshot_id, "t": table_id},
            )
        self._bump_schema_version()
        self._change(f"dropped_table:{table_id}")

    # -- columns ---------------------------------------------------------------------------------
    def max_column_id(self, table_id: int) -> int:
        return self.catalog.max_column_id(table_id, self.conn)

    def add_column(self, table: LakeTable, column: NewColumn, column_id: int) -> None:
        """Add a column under ``column_id`` (above every id the table ever used), with no default. A list's
        elements take the ids after it, as ``assign_column_ids(..., start=column_id)`` gives them."""
        if column_id <= self.max_column_id(table.table_id):
            raise CommitConflict(f"column id {column_id} of table {table.table_id} is taken")
        order = 1 + int(
            self._run(
                "SELECT coalesce(max(column_order), 0) FROM ducklake_column WHERE table_id = :t", {"t": table.table_id}
            ).scalar_one()
        )
        (ids,) = assign_column_ids([column], column_id)
        self._insert_new_column(
            table.table_id, column.name, column.type, column.nullable, ids, order_offset=order - column_id
        )
        self._insert_stats_rows(table.table_id, list(ids), contains_null=self._record_count(table.table_id) > 0)
        self._altered(table.table_id)

    def drop_column(self, table: LakeTable, column_id: int) -> None:
        """End the column, and the elements of a list."""
        rows = self._run(
            "SELECT column_id, parent_column FROM ducklake_column"
            " WHERE table_id = :t AND end_snapshot IS NULL AND parent_column IS NOT NULL ORDER BY column_id",
            {"t": table.table_id},
        )
        ended = {column_id}
        for row in rows:  # an element's id is above its list's
            if int(row.parent_column) in ended:
                ended.add(int(row.column_id))
        self._end_columns(table.table_id, ended)
        self._altered(table.table_id)

    def rename_column(self, table: LakeTable, column_id: int, new_name: str) -> None:
        """End the column's row and add one with the same id under the new name (as DuckDB does)."""
        self._replace_column(table, column_id, column_name=new_name)

    def retype_column(self, table: LakeTable, column_id: int, new_type: str) -> None:
        """A type promotion DuckDB reads from the old files (int32 -> int64, ...): same id, new type."""
        self._replace_column(table, column_id, column_type=new_type)
        self._forget_bounds(table.table_id, {column_id})

    def _replace_column(self, table: LakeTable, column_id: int, **changed: str) -> None:
        """End the column's row and begin a copy of it with ``changed`` values; a list's elements stay as they are."""
        columns = TABLES["ducklake_column"]
        row = self.conn.execute(
            sa.select(columns).where(
                columns.c.table_id == table.table_id,
                columns.c.column_id == column_id,
                columns.c.end_snapshot.is_(None),
            )
        ).one()
        self._end_columns(table.table_id, {column_id})
        self._insert("ducklake_column", {**row._asdict(), "begin_snapshot": self.snapshot_id, **changed})
        self._altered(table.table_id)

    def _end_columns(self, table_id: int, column_ids: Set[int]) -> None:
        columns = TABLES["ducklake_column"]
        self.conn.execute(
            sa.update(columns)
            .where(
                columns.c.table_id == table_id,
                columns.c.column_id.in_(sorted(column_ids)),
                columns.c.end_snapshot.is_(None),
            )
            .values(end_snapshot=self.snapshot_id)
        )

    def _insert_new_column(
        self,
        table_id: int,
        name: str,
        lake_type: LakeType,
        nullable: bool,
        ids: ColumnIds,
        *,
        order_offset: int,
        parent: int | None = None,
    ) -> None:
        """Insert a new column's row, then its element's (nullable, as DuckDB makes them), and so on down.
        Orders run with the ids, ``order_offset`` apart."""
        self._insert(
            "ducklake_column",
            {
                "column_id": ids.column_id,
                "begin_snapshot": self.snapshot_id,
                "table_id": table_id,
                "column_order": ids.column_id + order_offset,
                "column_name": name,
                "column_type": lake_type.name,
                "default_value": "NULL",
                "nulls_allowed": nullable,
                "parent_column": parent,
                "default_value_type": "" if lake_type.name == LIST else "literal",  # as DuckDB writes them
                "default_value_dialect": "duckdb",
            },
        )
        if lake_type.element is not None and ids.element is not None:
            self._insert_new_column(
                table_id, ELEMENT, lake_type.element, True, ids.element, order_offset=order_offset, parent=ids.column_id
            )

    def _insert_stats_rows(self, table_id: int, column_ids: list[int], *, contains_null: bool) -> None:
        """Table statistics of new columns: no bounds yet; ``contains_null`` known (a new table holds no rows; a
        column added to one that does holds only nulls)."""
        if column_ids:
            self._insert(
                "ducklake_table_column_stats",
                [{"table_id": table_id, "column_id": c, "contains_null": contains_null} for c in column_ids],
            )

    def _altered(self, table_id: int) -> None:
        self._table_schema_changed(table_id)
        self._change(f"altered_table:{table_id}")

    def _table_schema_changed(self, table_id: int) -> None:
        if table_id not in self._schema_changed:
            self._schema_changed.add(table_id)
            self._bump_schema_version()

    def _bump_schema_version(self) -> None:
        if not self._ddl:
            self._ddl = True
            self.schema_version += 1

    # -- data ------------------------------------------------------------------------------------
    def add_data_file(
        self, table: LakeTable, file: NewFile, placed: Placed | None = None, change: str = "inserted_into_table"
    ) -> int:
        """Register a data file: row ids, table statistics and file column statistics.

        The rows of a ``placed`` file (``Composed``) keep the row ids and snapshots they have; its caller counts
        them in the table statistics as fits.
        """
        data_file_id = self._file_id()
        if placed is None:
            row_id_start: int | None = self._take_row_ids(table.table_id, file.record_count, file.size_bytes)
        else:
            row_id_start = placed.row_id_start
        self._insert(
            "ducklake_data_file",
            {
                "data_file_id": data_file_id,
                "table_id": table.table_id,
                "begin_snapshot": self.snapshot_id
                if placed is None or placed.begin_snapshot is None
                else placed.begin_snapshot,
                "path": file.name,
                "path_is_relative": True,
                "file_format": "parquet",
                "record_count": file.record_count,
                "file_size_bytes": file.size_bytes,
                "footer_size": file.footer_size,
                "row_id_start": row_id_start,
                "partial_max": None if placed is None else placed.partial_max,
            },
        )
        if file.stats:
            self._insert(
                "ducklake_file_column_stats",
                [
                    {
                        "data_file_id": data_file_id,
                        "table_id": table.table_id,
                        "column_id": s.column_id,
                        "column_size_bytes": s.size_bytes,
                        "value_count": s.value_count,
                        "null_count": s.null_count,
                        "min_value": s.min_value,
                        "max_value": s.max_value,
                    }
                    for s in file.stats
                ],
            )
        self._widen_all(table, file.stats, file.record_count)
        self._change(f"{change}:{table.table_id}")
        return data_file_id

    def _count(self, table_id: int, *, size_bytes: int = 0, records: int = 0) -> None:
        """Add to the table statistics' bytes and rows."""
        self._run(
            "UPDATE ducklake_table_stats SET file_size_bytes = file_size_bytes + :size,"
            " record_count = record_count + :records WHERE table_id = :t",
            {"t": table_id, "size": size_bytes, "records": records},
        )

    def add_composed(self, table: LakeTable, composed: Composed, change: str) -> None:
        """Register a composed data file and the delete file of its rows already deleted."""
        data_file_id = self.add_data_file(table, composed.file, composed.placed, change)
        if composed.deletes is not None:
            self._insert(
                "ducklake_delete_file",
                {
                    "delete_file_id": self._file_id(),
                    "table_id": table.table_id,
                    "begin_snapshot": composed.deletes_begin,
                    "data_file_id": data_file_id,
                    "path": composed.deletes.name,
                    "path_is_relative": True,
                    "format": "parquet",
                    "delete_count": composed.deletes.record_count,
                    "file_size_bytes": composed.deletes.size_bytes,
                    "footer_size": composed.deletes.footer_size,
                },
            )

    def _take_row_ids(self, table_id: int, count: int, size_bytes: int) -> int:
        """Give ``count`` new rows the next row ids (the first one returned), and count them and their bytes."""
        stats = self._run(
            "SELECT record_count, next_row_id, file_size_bytes FROM ducklake_table_stats WHERE table_id = :t",
            {"t": table_id},
        ).one_or_none()
        if stats is None:
            self._insert(
                "ducklake_table_stats",
                {"table_id": table_id, "record_count": count, "next_row_id": count, "file_size_bytes": size_bytes},
            )
            return 0
        start = int(stats.next_row_id)
        self._run(
            "UPDATE ducklake_table_stats SET record_count = :c, next_row_id = :r, file_size_bytes = :size"
            " WHERE table_id = :t",
            {
                "t": table_id,
                "c": int(stats.record_count) + count,
                "r": start + count,
                "size": int(stats.file_size_bytes) + size_bytes,
            },
        )
        return start

    def _widen_all(self, table: LakeTable, stats: Sequence[ColumnStats], rows: int) -> None:
        """Widen the table bounds to cover new rows, of which ``stats`` are the statistics: one read of the
        table's bounds, one update of those that changed. No row means unknown bounds, and stays so; a row
        without bounds, that the column held no value yet."""
        kinds = {c.column_id: stats_kind(c.type) for top in table.columns for c in top.with_elements()}
        stored = {
            int(row.column_id): row
            for row in self._run(
                "SELECT column_id, contains_null, min_value, max_value FROM ducklake_table_column_stats"
                " WHERE table_id = :t",
                {"t": table.table_id},
            )
        }
        forget = kinds.keys() - {s.column_id for s in stats} if rows else set()  # values the bounds do not cover
        updates: list[dict[str, Any]] = []
        for file in stats:
            row = stored.get(file.column_id)
            if row is None:
                continue
            kind = kinds.get(file.column_id)
            contains_null = bool(row.contains_null) or file.null_count > 0
            low, high = row.min_value, row.max_value
            if file.value_count:
                if kind is None or file.min_value is None or file.max_value is None:
                    forget.add(file.column_id)
                    continue
                if low is None or high is None:
                    low, high = file.min_value, file.max_value
                else:
                    low, high = widen(kind, low, high, file.min_value, file.max_value)
            if (contains_null, low, high) != (bool(row.contains_null), row.min_value, row.max_value):
                updates.append({"t": table.table_id, "c": file.column_id, "n": contains_null, "lo": low, "hi": high})
        if updates:
            self._run(
                "UPDATE ducklake_table_column_stats SET contains_null = :n, min_value = :lo, max_value = :hi"
                " WHERE table_id = :t AND column_id = :c",
                updates,
            )
        if forget:
            self._forget_bounds(table.table_id, forget)

    # -- inlined rows ----------------------------------------------------------------------------
    def inline_rows(self, table: LakeTable, rows: pa.Table) -> None:
        """Insert rows (columns named as the table's) into the table's inlined data, with new row ids."""
        name = self._inlined_table(table)
        start = self._take_row_ids(table.table_id, rows.num_rows, 0)
        inlined.insert(self.conn, name, table.columns, rows, row_id_start=start, snapshot=self.snapshot_id)
        values = pa.table({c.name: convert(rows[c.name], c, Form.FILE) for c in table.columns})
        kinds = {c.name: (c.column_id, stats_kind(c.type)) for c in table.columns}
        self._widen_all(table, arrow_stats(values, kinds), rows.num_rows)
        self._file_id()  # as DuckDB does: an inlined insert takes a file id
        self._change(f"inlined_insert:{table.table_id}")

    def end_inlined_rows(self, table: LakeTable, row_ids: Sequence[int]) -> None:
        """End inlined rows (deleted or updated); all of them must still be live."""
        names = self.catalog.inlined_tables(table, self.conn)
        if sum(inlined.end(self.conn, name, row_ids, self.snapshot_id) for name in names) != len(row_ids):
            raise CommitConflict(f"inlined rows of DuckLake table {table.table_id} changed")  # ended by another writer
        self._change(f"inlined_delete:{table.table_id}")

    def flush_inlined_rows(self, table: LakeTable, name: str, flush: InlinedFlush) -> None:
        """Replace the inlined rows of ``name`` by the data file (and delete file) they were written to."""
        if inlined.shape(self.conn, name, flush.last_row_id) != flush.shape:
            raise CommitConflict(f"inlined rows of DuckLake table {table.table_id} changed")
        self.add_composed(table, flush.written, "inline_flush")
        self._count(table.table_id, size_bytes=flush.written.file.size_bytes)
        inlined.remove(self.conn, name, flush.last_row_id)

    # -- upkeep ----------------------------------------------------------------------------------
    def merge_data_files(self, table: LakeTable, files: Sequence[DataFile], merged: Composed) -> None:
        """Replace data files (and their delete files) by the one they were merged into, which keeps their rows'
        ids and snapshots: time travel and the change feed read what they read before. The old files leave the
        catalog and are scheduled for deletion, as DuckDB's ``merge_adjacent_files`` does."""
        self._check_unchanged(files)
        for file in files:
            doomed = [(file.data_file_id, file.path)]
            if file.delete is not None:
                doomed.append((file.delete.delete_file_id, file.delete.path))
                self._run(
                    "DELETE FROM ducklake_delete_file WHERE delete_file_id = :d", {"d": file.delete.delete_file_id}
                )
            self._run("DELETE FROM ducklake_file_column_stats WHERE data_file_id = :d", {"d": file.data_file_id})
            self._run("DELETE FROM ducklake_data_file WHERE data_file_id = :d", {"d": file.data_file_id})
            for file_id, path in doomed:
                self._schedule_deletion(file_id, path)
        self.add_composed(table, merged, "merge_adjacent")  # the table statistics stay, as DuckDB's

    def rewrite_data_file(self, table: LakeTable, file: DataFile, rewritten: Composed | None) -> None:
        """Replace a data file with many deleted rows by one of its live rows (``None``: it has none), which keep
        their ids. The old file and its delete file end here (time travel to before reads them) and go when
        their snapshots expire."""
        self._check_unchanged([file])
        for catalog_table in ("ducklake_data_file", "ducklake_delete_file"):
            self._run(
                f"UPDATE {catalog_table} SET end_snapshot = :s WHERE data_file_id = :d AND end_snapshot IS NULL",
                {"s": self.snapshot_id, "d": file.data_file_id},
            )
        if rewritten is not None:
            self.add_composed(table, rewritten, "rewrite_delete")
        else:
            self._change(f"rewrite_delete:{table.table_id}")
        kept, size = (rewritten.file.record_count, rewritten.file.size_bytes) if rewritten is not None else (0, 0)
        self._count(table.table_id, size_bytes=size, records=kept - file.record_count)  # as DuckDB counts it

    def _check_unchanged(self, files: Sequence[DataFile]) -> None:
        """Raise ``CommitConflict`` unless each file is still active with the same delete file."""
        for file in files:
            current = self._run(
                "SELECT d.end_snapshot, x.delete_file_id FROM ducklake_data_file d LEFT JOIN ducklake_delete_file x"
                " ON x.data_file_id = d.data_file_id AND x.end_snapshot IS NULL WHERE d.data_file_id = :d",
                {"d": file.data_file_id},
            ).one_or_none()
            expected = file.delete.delete_file_id if file.delete is not None else None
            if current is None or current.end_snapshot is not None or current.delete_file_id != expected:
                raise CommitConflict(f"data file {file.data_file_id} changed")

    def _schedule_deletion(self, file_id: int, path: str) -> None:
        """Schedule a file that left the catalog (``path`` absolute) for deletion."""
        retention.schedule(self.conn, self.catalog.data_path, [(file_id, path)])

    def _inlined_table(self, table: LakeTable) -> str:
        """The table's inlined data table at its current schema version, created when missing."""
        version = self.schema_version if table.table_id in self._schema_changed else None
        if version is None:
            version = self.catalog.schema_versions([table.table_id], self.conn)[table.table_id]
        existing = inlined.registered(self.conn, [table.table_id]).get(table.table_id, {}).get(version)
        return existing if existing is not None else inlined.create(self.conn, table.table_id, version, table.columns)

    def _forget_bounds(self, table_id: int, column_ids: Set[int]) -> None:
        """Make the table statistics of these columns unknown: no row (DuckDB then keeps none either)."""
        stats = TABLES["ducklake_table_column_stats"]
        self.conn.execute(
            sa.delete(stats).where(stats.c.table_id == table_id, stats.c.column_id.in_(sorted(column_ids)))
        )

    def new_delete_file_id(self) -> int:
        return self._file_id()

    def replace_delete_file(
        self,
        table: LakeTable,
        *,
        data_file: DataFile,
        delete_file_id: int,
        file: NewFile,
        begin_snapshot: int,
        partial: bool,
    ) -> None:
        """Make ``file`` the data file's one active delete file; the previous one is removed and scheduled to go."""
        current = self._run(
            "SELECT delete_file_id, path, path_is_relative FROM ducklake_delete_file"
            " WHERE data_file_id = :d AND end_snapshot IS NULL",
            {"d": data_file.data_file_id},
        ).one_or_none()
        active = self._run(
            "SELECT count(*) FROM ducklake_data_file WHERE data_file_id = :d AND end_snapshot IS NULL",
            {"d": data_file.data_file_id},
        ).scalar_one()
        if not active:
            raise CommitConflict(f"data file {data_file.data_file_id} is no longer active")
        expected = data_file.delete.delete_file_id if data_file.delete else None
        if (current.delete_file_id if current else None) != expected:
            raise CommitConflict(f"the delete file of data file {data_file.data_file_id} changed")
        if current is not None:
            self._run("DELETE FROM ducklake_delete_file WHERE delete_file_id = :d", {"d": current.delete_file_id})
            path = table.directory + current.path if current.path_is_relative else current.path
            self._schedule_deletion(current.delete_file_id, path)
        self._insert(
            "ducklake_delete_file",
            {
                "delete_file_id": delete_file_id,
                "table_id": table.table_id,
                "begin_snapshot": begin_snapshot,
                "data_file_id": data_file.data_file_id,
                "path": file.name,
                "path_is_relative": True,
                "format": "parquet",
                "delete_count": file.record_count,
                "file_size_bytes": file.size_bytes,
                "footer_size": file.footer_size,
                "partial_max": self.snapshot_id if partial else None,
            },
        )
        self._change(f"deleted_from_table:{table.table_id}")

    def end_data_files(self, table: LakeTable) -> None:
        """Truncate: end every active data file, and every live inlined row, of the table."""
        self._run(
            "UPDATE ducklake_data_file SET end_snapshot = :s WHERE table_id = :t AND end_snapshot IS NULL",
            {"s": self.snapshot_id, "t": table.table_id},
        )
        self._change(f"deleted_from_table:{table.table_id}")
        for name in inlined.registered(self.conn, [table.table_id]).get(table.table_id, {}).values():
            if inlined.end_all(self.conn, name, self.snapshot_id):
                self._change(f"inlined_delete:{table.table_id}")

    def _record_count(self, table_id: int) -> int:
        value = self._run("SELECT record_count FROM ducklake_table_stats WHERE table_id = :t", {"t": table_id}).scalar()
        return int(value or 0)

    def _catalog_id(self) -> int:
        value = self.next_catalog_id
        self.next_catalog_id += 1
        return value

    def _file_id(self) -> int:
        value = self.next_file_id
        self.next_file_id += 1
        return value

    def finish(self) -> None:
        if self._schema_changed:
            self._insert(
                "ducklake_schema_versions",
                [
                    {"begin_snapshot": self.snapshot_id, "schema_version": self.schema_version, "table_id": table_id}
                    for table_id in self._schema_changed
                ],
            )
        self._insert(
            "ducklake_snapshot",
            {
                "snapshot_id": self.snapshot_id,
                "snapshot_time": datetime.now(UTC),
                "schema_version": self.schema_version,
                "next_catalog_id": self.next_catalog_id,
                "next_file_id": self.next_file_id,
            },
        )
        self._insert(
            "ducklake_snapshot_changes",
            {"snapshot_id": self.snapshot_id, "changes_made": ",".join(self.changes), "author": self.catalog.author},
        )
