"""A snapshot commit's changes of data: data and delete files with their statistics, inlined rows, merges."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from etl_spark.ducklake.catalog import inlined, retention
from etl_spark.ducklake.catalog.model import Composed, DataFile, InlinedFlush, LakeTable, NewFile, Placed
from etl_spark.ducklake.catalog.snapshot_commit import CommitConflict, SnapshotCommit
from etl_spark.ducklake.stats import ColumnStats, arrow_stats, stats_kind, widen
from etl_spark.ducklake.types import Form, convert


class FileChanges(SnapshotCommit):
    """Registers data files (their statistics widen the table's), inlined rows and their flushes, the files
    merges and rewrites replace, and delete files."""

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
