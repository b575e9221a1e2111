"""What a catalog reads of the rows inlined into it (``inlined``): which inlined data tables of a lake table hold
rows, the rows, and which of this pipeline's tables have any. ``Catalog`` reads them through this mixin."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from etl.api import DestinationError
from etl_spark.ducklake.catalog import inlined
from etl_spark.ducklake.catalog.ddl import STATE_TABLE
from etl_spark.ducklake.catalog.model import LakeColumn, LakeTable
from etl_spark.ducklake.types import Form


class InlinedReads:
    """The inlined-row reads of ``Catalog``, which provides the engine, its reading connections and schema
    versions."""

    pipeline_id: int

    @property
    def engine(self) -> Engine:
        raise NotImplementedError

    def _reading(self, conn: Connection | None) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def schema_versions(self, table_ids: Sequence[int], conn: Connection | None = None) -> dict[int, int]:
        raise NotImplementedError

    def inlined_tables(self, table: LakeTable, conn: Connection | None = None) -> list[str]:
        """The table's inlined data tables that hold rows (``inlined_tables_of``)."""
        return self.inlined_tables_of([table], conn)[table.table_id]

    def inlined_tables_of(self, tables: Sequence[LakeTable], conn: Connection | None = None) -> dict[int, list[str]]:
        """Each table's inlined data tables that hold rows, by table id.

        One of an earlier schema version is read as holding the current columns, which it must then have
        (versions that only renamed the table). This writer flushes a table's inlined rows before it changes
        its columns; rows left under other columns (by a DuckDB writer with inlining on) are refused.
        """
        held: dict[int, list[str]] = {t.table_id: [] for t in tables}
        with self._reading(conn) as c:
            registered = inlined.registered(c, list(held))
            if not registered:
                return held
            versions = self.schema_versions(list(registered), c)
            holding = inlined.holding_rows(c, [n for by_version in registered.values() for n in by_version.values()])
            for table in tables:
                current = [col.name for col in table.columns]
                for version, name in sorted(registered.get(table.table_id, {}).items()):
                    if name not in holding:
                        continue
                    if version != versions[table.table_id] and inlined.column_names(c, name) != current:
                        raise DestinationError(
                            f"DuckLake table {table.schema_name}.{table.name} holds rows inlined into the catalog"
                            " under other columns",
                            hint="run CALL ducklake_flush_inlined_data('<lake>') in DuckDB with the pipeline paused",
                        )
                    held[table.table_id].append(name)
        return held

    def inlined_rows(
        self,
        names: Sequence[str],
        columns: Sequence[LakeColumn],
        form: Form,
        *,
        live: bool = True,
        keys: tuple[str, Sequence[int]] | None = None,
    ) -> pa.Table:
        """Rows of inlined data tables (``inlined.read``), by row id."""
        with self.engine.connect() as conn:
            tables = [inlined.read(conn, name, columns, form, live=live, keys=keys) for name in names]
        return pa.concat_tables(tables).sort_by("row_id") if len(tables) != 1 else tables[0]

    def inlined_count(self, table: LakeTable) -> int:
        """Rows, live and ended, inlined into the table."""
        with self.engine.connect() as conn:
            return sum(inlined.shape(conn, n)[0] for n in self.inlined_tables(table, conn))

    def tables_with_inlined_rows(self) -> list[int]:
        """The lake tables this pipeline keeps that have inlined rows."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT s.table_id, r.table_name FROM {STATE_TABLE} s"
                    f" JOIN {inlined.REGISTRY} r ON r.table_id = s.table_id"
                    " WHERE s.pipeline_id = :p AND NOT s.replaced"
                ),
                {"p": self.pipeline_id},
            ).all()
            holding = inlined.holding_rows(conn, [name for _, name in rows])
        return sorted({int(t) for t, name in rows if name in holding})
