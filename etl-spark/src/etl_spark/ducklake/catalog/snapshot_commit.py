"""The core of one snapshot commit: ids from the latest snapshot, change tokens, the pipeline's state rows.

Ids come from the latest snapshot, read when the commit starts; ``finish`` writes the new snapshot
row, whose primary key is the commit point. Every change also records DuckLake's change token for it
(``created_table:...``, ``altered_table:<id>``, ...), which readers and ``check_conflicts`` go by.
"""

from __future__ import annotations

import re
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Connection

from etl.api import Lsn
from etl_spark.ducklake.catalog import positions, staging
from etl_spark.ducklake.catalog.ddl import COLUMNS_TABLE, STATE_TABLE, TABLES
from etl_spark.ducklake.catalog.model import LakeTable, SourceColumn

log = structlog.get_logger(__name__)

_TOKEN: Final = re.compile(r"([a-z_]+):(\d+)")
_INSERT_ONLY: Final = ("inserted_into_table", "inlined_insert")
_Params = dict[str, Any] | list[dict[str, Any]]


class CommitConflict(Exception):
    """Another writer changed a table this commit's inputs were computed from; recompute and retry."""


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
class SnapshotCommit:
    """What every change of one snapshot commit builds on: the connection, the ids allocated from the latest
    snapshot, the change tokens, the pipeline's own state rows, and ``finish``, which writes the snapshot."""

    catalog: CatalogReads
    conn: Connection
    snapshot_id: int = 0
    schema_version: int = 0
    next_catalog_id: int = 0
    next_file_id: int = 0
    changes: list[str] = field(default_factory=list)
    position: Lsn | None = None
    """The stream's position the snapshot brings the lake to (a batch's end: ``positions``); ``None`` for others."""
    consistent: bool = False
    """With a ``position``: the snapshot holds a state the source had, across all the pipeline's tables."""
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

    def end_open(self, marker: str) -> bool:
        """The pipeline's open transaction commits in this snapshot: remove its marker (``staging``); whether it was
        still there (else an earlier commit of it landed)."""
        return staging.forget(self.conn, self.catalog.pipeline_id, marker) > 0

    def forget(self, source_table_id: int) -> None:
        self._run(
            f"DELETE FROM {STATE_TABLE} WHERE pipeline_id = :p AND source_table_id = :s",
            {"p": self.catalog.pipeline_id, "s": source_table_id},
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

    def _insert_stats_rows(self, table_id: int, column_ids: list[int], *, contains_null: bool) -> None:
        """Table statistics of new columns: no bounds yet; ``contains_null`` known (a new table holds no rows; a
        column added to one that does holds only nulls; one with an initial default gets no row, unknown)."""
        if column_ids:
            self._insert(
                "ducklake_table_column_stats",
                [{"table_id": table_id, "column_id": c, "contains_null": contains_null} for c in column_ids],
            )

    def _forget_bounds(self, table_id: int, column_ids: Set[int]) -> None:
        """Make the table statistics of these columns unknown: no row (DuckDB then keeps none either)."""
        stats = TABLES["ducklake_table_column_stats"]
        self.conn.execute(
            sa.delete(stats).where(stats.c.table_id == table_id, stats.c.column_id.in_(sorted(column_ids)))
        )

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

    def new_delete_file_id(self) -> int:
        return self._file_id()

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
        info = (
            {}
            if self.position is None
            else positions.commit_info(self.catalog.pipeline_id, self.position, self.consistent)
        )
        self._insert(
            "ducklake_snapshot_changes",
            {
                "snapshot_id": self.snapshot_id,
                "changes_made": ",".join(self.changes),
                "author": self.catalog.author,
                **info,
            },
        )
        if self.position is not None:
            positions.record(self.conn, self.catalog.pipeline_id, self.position, self.snapshot_id)
