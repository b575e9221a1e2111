"""A snapshot commit's changes of schemas, tables and columns (DuckLake's DDL, written into its catalog)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence, Set
from dataclasses import dataclass

import sqlalchemy as sa
import structlog

from etl.api import TableError
from etl_spark.ducklake.catalog.column_ids import ELEMENT, ColumnIds, assign_column_ids
from etl_spark.ducklake.catalog.ddl import COLUMNS_TABLE, STATE_TABLE, TABLES, quote
from etl_spark.ducklake.catalog.model import LakeTable, NewColumn, directory_name
from etl_spark.ducklake.catalog.snapshot_commit import CommitConflict, SnapshotCommit
from etl_spark.ducklake.types import LIST, LakeType

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _Holder:
    """An active lake table that holds a name, and who keeps it."""

    table_id: int
    source_table_id: int | None
    """The source table this pipeline keeps in it, if this pipeline keeps it."""
    other_pipeline: int | None
    """The other pipeline that keeps it, if another one does."""


class TableChanges(SnapshotCommit):
    """Creates, renames, parks and drops lake tables; adds, drops, renames and retypes their columns."""

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

    def max_column_id(self, table_id: int) -> int:
        return self.catalog.max_column_id(table_id, self.conn)

    def add_column(self, table: LakeTable, column: NewColumn, column_id: int) -> None:
        """Add a column under ``column_id`` (above every id the table ever used), with the column's initial
        default (what the rows already stored read). A list's elements take the ids after it, as
        ``assign_column_ids(..., start=column_id)`` gives them."""
        if column_id <= self.max_column_id(table.table_id):
            raise CommitConflict(f"column id {column_id} of table {table.table_id} is taken")
        order = 1 + int(
            self._run(
                "SELECT coalesce(max(column_order), 0) FROM ducklake_column WHERE table_id = :t", {"t": table.table_id}
            ).scalar_one()
        )
        (ids,) = assign_column_ids([column], column_id)
        self._insert_new_column(
            table.table_id,
            column.name,
            column.type,
            column.nullable,
            ids,
            order_offset=order - column_id,
            initial_default=column.initial_default,
        )
        held = self._record_count(table.table_id) > 0
        if not (held and column.initial_default is not None):  # else unknown bounds (no row): they hold the default
            self._insert_stats_rows(table.table_id, list(ids), contains_null=held)
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
        initial_default: str | None = None,
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
                "initial_default": initial_default,
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
