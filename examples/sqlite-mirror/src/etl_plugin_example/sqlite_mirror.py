"""The ``sqlite_mirror`` destination: every source table mirrored into a table of one SQLite file.

Copy and changes become rows of the mirror tables (see ``mirror_schema`` for the layout and
``values`` for the types). Every ``write_*`` call is one SQLite transaction (``BEGIN IMMEDIATE`` ...
``COMMIT``, WAL mode, ``synchronous = FULL``) and is reported durable only after its commit.

Changes are applied per table in stream order from the batch's Arrow change tables: inserts and
updates as upserts by the replica identity key (an update that changes the key deletes the old key
first), deletes by key, and for ``REPLICA IDENTITY FULL`` tables without a key by whole row, one
matching row per delete. Columns an update lists in ``_etl_missing`` (unchanged TOAST values Postgres
did not send) keep their stored values. A truncate empties the table. A change segment under a newer
schema version alters the table first (``mirror_schema.migrate``).

Replays are exactly idempotent: each table's watermark, the ``(commit_lsn, tx_ordinal)`` of the last
change applied, is saved in the same transaction as the data, and changes at or below it are skipped.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from etl.api import (
    COMMIT_LSN_COLUMN,
    MISSING_COLUMN,
    OLD_COLUMN,
    OP_COLUMN,
    TX_ORDINAL_COLUMN,
    DestinationContext,
    DestinationError,
    EventBatch,
    Integer,
    Lsn,
    TableChanges,
    TableError,
    TableName,
    TableSchema,
    TransientError,
    WriteResult,
    quote_ident,
)
from pydantic import BaseModel, ConfigDict, Field

from etl_plugin_example import mirror_schema
from etl_plugin_example.mirror_reader import MirrorReader
from etl_plugin_example.mirror_schema import RESYNC_HINT, MirroredTable, Position
from etl_plugin_example.values import SqliteValue, encode_column

_BUSY = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_STORAGE = frozenset(
    {
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_NOMEM,
    }
)

Row = tuple[SqliteValue, ...]


class SqliteMirrorDestination:
    name: ClassVar[str] = "sqlite_mirror"

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        path: Path = Field(description="the SQLite file; created when missing (its directory must exist)")
        busy_timeout_ms: Integer = Field(5000, ge=0, description="how long a write waits for another writer")

    def __init__(self, path: Path, busy_timeout_ms: int = 5000) -> None:
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    @classmethod
    def from_config(cls, config: Config, context: DestinationContext) -> SqliteMirrorDestination:
        return cls(config.path, config.busy_timeout_ms)

    def __repr__(self) -> str:
        return f"<SqliteMirrorDestination {self.path}>"

    # -- lifecycle -----------------------------------------------------------------------------------------
    def startup(self) -> None:
        with self._lock:
            if self._conn is not None:
                return
            try:
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            except sqlite3.Error as exc:
                raise DestinationError(
                    f"cannot open the SQLite mirror {self.path}: {exc}",
                    hint="check that the directory exists and is writable",
                ) from None
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")  # a commit survives a crash of the machine
                conn.execute(mirror_schema.CREATE_META)
            except sqlite3.Error as exc:
                conn.close()
                raise self._error(exc, "opening") from None
            self._conn = conn

    def shutdown(self) -> None:
        with self._lock:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

    def flush(self) -> None:
        """Nothing to do: every write is durable when it returns."""

    # -- writes ------------------------------------------------------------------------------------------------
    def drop_table_for_copy(self, schema: TableSchema) -> None:
        with self._transaction("dropping " + str(schema.name)) as conn:
            mirror_schema.drop(conn, schema.id)

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        """Add copied rows. A copy is identified by its schema's ``snapshot_lsn``: the first call of a new
        copy replaces whatever the mirror held for the table, even if ``drop_table_for_copy`` was skipped."""
        with self._transaction("copying " + str(schema.name)) as conn, _table_errors(schema):
            if rows.schema.names != schema.column_names:
                raise TableError(
                    f"copied rows of {schema.name} have columns {rows.schema.names}, expected {schema.column_names}",
                    table_id=schema.id,
                )
            table = mirror_schema.load(conn, schema.id)
            if table is None or table.schema.snapshot_lsn != schema.snapshot_lsn:
                mirror_schema.drop(conn, schema.id)
                table = mirror_schema.create(conn, schema)
            if rows.num_rows:
                columns = [encode_column(rows.column(i)) for i in range(rows.num_columns)]
                conn.executemany(_Statements(table).upsert, zip(*columns, strict=True))
        return WriteResult.DURABLE

    def write_events(self, batch: EventBatch) -> WriteResult:
        with self._transaction("applying changes") as conn:
            for segments in batch.changes.values():
                for segment in segments:
                    with _table_errors(segment.schema):
                        self._apply(conn, segment)
        return WriteResult.DURABLE

    # -- reading back ----------------------------------------------------------------------------------------
    def rows(self, table: TableName | str) -> list[dict[str, Any]]:
        """The mirrored table's rows as psycopg would return the source's (see ``MirrorReader.rows``)."""
        with MirrorReader(self.path) as reader:
            return reader.rows(table)

    # -- internals ---------------------------------------------------------------------------------------------
    @contextmanager
    def _transaction(self, doing: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise DestinationError(f"the SQLite mirror {self.path} is not open", hint="call startup() first")
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):  # keep the original error
                        conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc, doing) from None
                raise

    def _error(self, exc: sqlite3.Error, doing: str) -> DestinationError | TransientError:
        code = getattr(exc, "sqlite_errorcode", sqlite3.SQLITE_ERROR) & 0xFF
        message = f"SQLite mirror {self.path}: {doing}: {exc}"
        if code in _BUSY:
            return TransientError(message, hint="another connection holds the write lock; raise busy_timeout_ms")
        if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            return DestinationError(message, hint="the file is not a SQLite database or is damaged; pick another path")
        return DestinationError(message, hint="check the file, its directory and the free disk space")

    def _apply(self, conn: sqlite3.Connection, segment: TableChanges) -> None:
        schema = segment.schema
        table = mirror_schema.load(conn, schema.id)
        if table is None:
            raise TableError(
                f"the SQLite mirror holds no copy of {schema.name} (oid {schema.id}) to apply changes to",
                hint=RESYNC_HINT.format(name=schema.name),
                table_id=schema.id,
            )
        stale = False
        if schema != table.schema:
            if schema.snapshot_lsn >= table.schema.snapshot_lsn:
                table = mirror_schema.migrate(conn, table, schema)
            else:
                stale = True  # a replay of changes made before a schema change the mirror already has
        changes = _after(segment.table, table.watermark)
        if not changes.num_rows:
            return
        if stale:
            raise TableError(
                f"changes to {schema.name} under schema version {schema.snapshot_lsn} arrived after the mirror"
                f" moved on to version {table.schema.snapshot_lsn}",
                hint=RESYNC_HINT.format(name=schema.name),
                table_id=schema.id,
            )
        _Applier(conn, table).apply(changes)
        last = changes.num_rows - 1
        lsn, ordinal = changes.column(COMMIT_LSN_COLUMN)[last].as_py(), changes.column(TX_ORDINAL_COLUMN)[last].as_py()
        mirror_schema.save_watermark(conn, schema.id, (Lsn(lsn), ordinal))


def _after(changes: pa.Table, watermark: Position | None) -> pa.Table:
    """The changes positioned after ``watermark``."""
    if watermark is None:
        return changes
    lsn, ordinal = changes.column(COMMIT_LSN_COLUMN), changes.column(TX_ORDINAL_COLUMN)
    at = pa.scalar(int(watermark[0]), pa.uint64())
    later = pc.or_(pc.greater(lsn, at), pc.and_(pc.equal(lsn, at), pc.greater(ordinal, watermark[1])))
    return changes.filter(later)


@contextmanager
def _table_errors(schema: TableSchema) -> Iterator[None]:
    """Failures caused by one table's data or shape become a ``TableError`` for that table alone."""
    try:
        yield
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorcode", sqlite3.SQLITE_ERROR) & 0xFF
        if code in _BUSY or code in _STORAGE:
            raise  # the whole write failed; the transaction turns it into a retried error
        raise TableError(
            f"SQLite mirror: table {schema.name}: {exc}", hint=RESYNC_HINT.format(name=schema.name), table_id=schema.id
        ) from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise TableError(
            f"SQLite mirror: table {schema.name}: a value cannot be stored: {exc}",
            hint=RESYNC_HINT.format(name=schema.name),
            table_id=schema.id,
        ) from None


class _Statements:
    """The SQL of one mirrored table."""

    def __init__(self, table: MirroredTable) -> None:
        schema = table.schema
        self.table = t = table.quoted
        self.names = [quote_ident(c.name) for c in schema.columns]
        self.key = [i for i, c in enumerate(schema.columns) if c.primary_key]
        marks = ", ".join("?" * len(self.names))
        verb = "INSERT OR REPLACE" if self.key else "INSERT"  # the key's unique index decides what is replaced
        self.upsert = f"{verb} INTO {t} ({', '.join(self.names)}) VALUES ({marks})"
        self.delete_key = f"DELETE FROM {t} WHERE " + " AND ".join(f"{self.names[i]} = ?" for i in self.key)
        every = " AND ".join(f"{n} IS ?" for n in self.names)
        self.delete_row = f"DELETE FROM {t} WHERE rowid = (SELECT rowid FROM {t} WHERE {every} LIMIT 1)"
        self.truncate = f"DELETE FROM {t}"

    def update_some(self, columns: Sequence[int]) -> str:
        """Set only ``columns`` of the row with a given key (``UPDATE OR REPLACE``: a new key may be taken)."""
        sets = ", ".join(f"{self.names[i]} = ?" for i in columns)
        where = " AND ".join(f"{self.names[i]} = ?" for i in self.key)
        return f"UPDATE OR REPLACE {self.table} SET {sets} WHERE {where}"


class _Applier:
    """Applies one segment's change rows in order; consecutive statements of one kind run as one ``executemany``."""

    def __init__(self, conn: sqlite3.Connection, table: MirroredTable) -> None:
        self.conn = conn
        self.table = table
        self.sql = _Statements(table)
        self._pending_sql = ""
        self._pending: list[Sequence[SqliteValue]] = []

    def apply(self, changes: pa.Table) -> None:
        schema = self.table.schema
        width, key = len(schema.columns), self.sql.key
        columns = [encode_column(changes.column(i)) for i in range(width)]
        rows: list[Row] = list(zip(*columns, strict=True))
        olds = _old_rows(changes.column(OLD_COLUMN))
        ops: list[str] = changes.column(OP_COLUMN).to_pylist()
        missing: list[list[str] | None] = changes.column(MISSING_COLUMN).to_pylist()
        for i, op in enumerate(ops):
            row = rows[i]
            if op == "I":
                self._add(self.sql.upsert, row)
            elif op == "D" and key:
                self._add(self.sql.delete_key, [row[k] for k in key])
            elif op == "D":
                self._add(self.sql.delete_row, row)
            elif op == "U":
                self._update(row, olds[i], missing[i])
            elif op == "T":
                self._run(self.sql.truncate, ())
            else:
                raise ValueError(f"unknown change operation {op!r}")
        self._flush()

    def _update(self, row: Row, old: Row | None, missing: list[str] | None) -> None:
        schema, key = self.table.schema, self.sql.key
        if not key:
            if old is None or missing:
                raise TableError(
                    f"an update of {schema.name}, which has no replica identity key, came without its old row",
                    hint="give the table a primary key or REPLICA IDENTITY FULL, then resync it",
                    table_id=schema.id,
                )
            self._add(self.sql.delete_row, old)
            self._add(self.sql.upsert, row)
            return
        old_key = [(old if old is not None else row)[k] for k in key]
        if missing:
            gone = set(missing)
            present = [i for i, c in enumerate(schema.columns) if c.name not in gone]
            cursor = self._run(self.sql.update_some(present), [*(row[i] for i in present), *old_key])
            if cursor.rowcount == 0:
                raise TableError(
                    f"an update of {schema.name} left large values unchanged ({', '.join(missing)}) in a row the"
                    " mirror does not hold, so their values are unknown",
                    hint=RESYNC_HINT.format(name=schema.name),
                    table_id=schema.id,
                )
            return
        if old_key != [row[k] for k in key]:
            self._add(self.sql.delete_key, old_key)
        self._add(self.sql.upsert, row)

    def _add(self, sql: str, params: Sequence[SqliteValue]) -> None:
        if sql != self._pending_sql:
            self._flush()
            self._pending_sql = sql
        self._pending.append(params)

    def _run(self, sql: str, params: Sequence[SqliteValue]) -> sqlite3.Cursor:
        self._flush()
        return self.conn.execute(sql, params)

    def _flush(self) -> None:
        if self._pending:
            self.conn.executemany(self._pending_sql, self._pending)
            self._pending = []


def _old_rows(old: pa.ChunkedArray) -> list[Row | None]:
    """The ``_etl_old`` struct column as encoded rows (None where Postgres sent no old row)."""
    if old.null_count == len(old):
        return [None] * len(old)
    struct = old.combine_chunks()
    fields = [encode_column(f) for f in struct.flatten()]
    valid = struct.is_valid().to_pylist()
    return [row if ok else None for ok, row in zip(valid, zip(*fields, strict=True), strict=True)]
