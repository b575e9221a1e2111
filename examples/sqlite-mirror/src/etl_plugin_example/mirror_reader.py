"""Reading a SQLite mirror back, from any process, while a pipeline writes it or after it crashed."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import TracebackType
from typing import Any

from etl.api import DestinationError, TableName, TableSchema, quote_ident
from etl.testing.compare import sort_rows

from etl_plugin_example import mirror_schema
from etl_plugin_example.mirror_schema import MirroredTable, Position
from etl_plugin_example.values import decoder


def mirrored_rows(path: str | Path, table: TableName | str) -> list[dict[str, Any]] | None:
    """``MirrorReader.rows`` of ``table`` in the mirror at ``path``; ``None`` while the pipeline has not made the
    mirror, its bookkeeping or the table yet (for polls of a pipeline's progress)."""
    try:
        with MirrorReader(path) as reader:
            return reader.rows(table)
    except (DestinationError, KeyError, sqlite3.OperationalError):
        return None


class MirrorReader:
    """A connection to a mirror file for reading (the file must exist).

    Sees the last committed state: an interrupted write is invisible, as in the file after a crash.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DestinationError(f"no SQLite mirror at {self.path}", hint="check the destination's path")
        self._conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=rw", uri=True)

    def __enter__(self) -> MirrorReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def tables(self) -> list[TableName]:
        """The source tables mirrored under their own names, sorted."""
        return sorted(
            t.schema.name
            for t in mirror_schema.load_all(self._conn)
            if t.sqlite_table == mirror_schema.sqlite_table_name(t.schema.name)
        )

    def schema(self, table: TableName | str) -> TableSchema:
        """The source schema version the mirrored table has."""
        return self._find(table).schema

    def watermark(self, table: TableName | str) -> Position | None:
        """``(commit_lsn, tx_ordinal)`` of the last change applied to the table; None before the first change."""
        return self._find(table).watermark

    def rows(self, table: TableName | str) -> list[dict[str, Any]]:
        """Every row as ``{column: value}``, with the Python values psycopg returns for the source's values.

        Sorted like ``MemoryDestination.rows`` and ``etl.testing.compare.source_rows``, so the result
        compares directly with the source (json, uuid, inet and the like as text, as ``source_rows``
        reads them). Raises ``KeyError`` when the table is not mirrored.
        """
        found = self._find(table)
        columns = found.schema.columns
        decoders = [decoder(c) for c in columns]
        names = [c.name for c in columns]
        select = ", ".join(quote_ident(n) for n in names)
        result = [
            {name: decode(value) for name, decode, value in zip(names, decoders, row, strict=True)}
            for row in self._conn.execute(f"SELECT {select} FROM {found.quoted}")
        ]
        return sort_rows(result)

    def _find(self, table: TableName | str) -> MirroredTable:
        name = TableName.parse(table) if isinstance(table, str) else table
        found = mirror_schema.load_by_name(self._conn, mirror_schema.sqlite_table_name(name))
        if found is None:
            raise KeyError(f"no table {name} in the SQLite mirror {self.path}")
        return found[1]
