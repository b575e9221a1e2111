"""The SQLite side of the mirror: table names, DDL, the bookkeeping table and schema migrations.

Each source table ``schema.name`` becomes the SQLite table ``"schema.name"`` with the same columns in
the same order (types in ``etl_plugin_example.values``) and, when the source table has a replica
identity key, a unique index ``_etl_key_<table oid>`` on the key columns. The bookkeeping table
``_etl_mirror_tables`` holds, per source table (by OID, which survives renames), its SQLite table,
the source schema version it mirrors (with the columns' attribute numbers, which identify them across
renames after a restart too), and the watermark: the ``(commit_lsn, tx_ordinal)`` of the last change
applied.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

import structlog
from etl.api import (
    ColumnSchema,
    Lsn,
    TableError,
    TableId,
    TableName,
    TableSchema,
    lsn_from_text,
    lsn_to_text,
    match_columns,
    quote_ident,
    schema_from_json,
    schema_to_json,
)

from etl_plugin_example.values import sqlite_type, value_kind

log = structlog.get_logger(__name__)

META_TABLE = "_etl_mirror_tables"

CREATE_META = f"""
CREATE TABLE IF NOT EXISTS {META_TABLE} (
    table_id     INTEGER PRIMARY KEY,   -- the source table's OID
    sqlite_table TEXT NOT NULL UNIQUE,  -- the SQLite table mirroring it
    schema       TEXT NOT NULL,         -- JSON: the source schema version the table has
    commit_lsn   TEXT,                  -- watermark: 16 hex digits (unsigned 64-bit LSN), NULL before any change
    tx_ordinal   INTEGER
)"""

RESYNC_HINT = "resync the table: etl resync --table {name}"

Position = tuple[Lsn, int]
"""``(commit_lsn, tx_ordinal)``: where a change sits in the replication stream."""


def sqlite_table_name(name: TableName) -> str:
    return f"{name.schema}.{name.name}"


@dataclass(frozen=True)
class MirroredTable:
    """One row of the bookkeeping table."""

    sqlite_table: str
    schema: TableSchema
    watermark: Position | None

    @property
    def quoted(self) -> str:
        return quote_ident(self.sqlite_table)


def load(conn: sqlite3.Connection, table_id: TableId) -> MirroredTable | None:
    row = conn.execute(
        f"SELECT sqlite_table, schema, commit_lsn, tx_ordinal FROM {META_TABLE} WHERE table_id = ?", (table_id,)
    ).fetchone()
    return None if row is None else _mirrored(row)


def load_by_name(conn: sqlite3.Connection, sqlite_table: str) -> tuple[TableId, MirroredTable] | None:
    row = conn.execute(
        f"SELECT table_id, sqlite_table, schema, commit_lsn, tx_ordinal FROM {META_TABLE} WHERE sqlite_table = ?",
        (sqlite_table,),
    ).fetchone()
    return None if row is None else (row[0], _mirrored(row[1:]))


def load_all(conn: sqlite3.Connection) -> list[MirroredTable]:
    rows = conn.execute(f"SELECT sqlite_table, schema, commit_lsn, tx_ordinal FROM {META_TABLE}").fetchall()
    return [_mirrored(row) for row in rows]


def _mirrored(row: tuple[str, str, str | None, int | None]) -> MirroredTable:
    sqlite_table, schema, commit_lsn, tx_ordinal = row
    watermark = None if commit_lsn is None or tx_ordinal is None else (lsn_from_text(commit_lsn), tx_ordinal)
    return MirroredTable(sqlite_table, schema_from_json(schema), watermark)


def save_watermark(conn: sqlite3.Connection, table_id: TableId, position: Position) -> None:
    conn.execute(
        f"UPDATE {META_TABLE} SET commit_lsn = ?, tx_ordinal = ? WHERE table_id = ?",
        (lsn_to_text(position[0]), position[1], table_id),
    )


# -- creating and dropping ------------------------------------------------------------------------------------


def create(conn: sqlite3.Connection, schema: TableSchema) -> MirroredTable:
    """Create the table mirroring ``schema`` (moving a stale table of another OID out of its name)."""
    if not schema.columns:
        raise TableError(
            f"table {schema.name} has no columns; SQLite cannot hold a table without columns",
            hint="add a column to the source table or leave it out of the publication",
            table_id=schema.id,
        )
    name = sqlite_table_name(schema.name)
    _free_name(conn, name, schema.id)
    columns = ", ".join(f"{quote_ident(c.name)} {sqlite_type(c)}" for c in schema.columns)
    conn.execute(f"CREATE TABLE {quote_ident(name)} ({columns})")
    _create_key_index(conn, name, schema)
    conn.execute(
        f"INSERT INTO {META_TABLE} (table_id, sqlite_table, schema) VALUES (?, ?, ?)",
        (schema.id, name, schema_to_json(schema)),
    )
    return MirroredTable(name, schema, None)


def drop(conn: sqlite3.Connection, table_id: TableId) -> None:
    """Drop a table's SQLite table and its bookkeeping row (watermark included). Nothing to do when absent."""
    table = load(conn, table_id)
    if table is not None:
        conn.execute(f"DROP TABLE IF EXISTS {table.quoted}")  # drops its key index too
        conn.execute(f"DELETE FROM {META_TABLE} WHERE table_id = ?", (table_id,))


def _free_name(conn: sqlite3.Connection, name: str, table_id: TableId) -> None:
    """Move the table of another source OID that holds ``name`` aside, to ``"<name>#<oid>"``.

    That table's source was renamed (its next change renames it again) or dropped (etl leaves
    destination tables of dropped sources alone): either way its data is kept, never overwritten.
    """
    holder = load_by_name(conn, name)
    if holder is None or holder[0] == table_id:
        return
    other_id, other = holder
    aside = f"{name}#{other_id}"
    conn.execute(f"ALTER TABLE {other.quoted} RENAME TO {quote_ident(aside)}")
    conn.execute(f"UPDATE {META_TABLE} SET sqlite_table = ? WHERE table_id = ?", (aside, other_id))
    log.warning("sqlite mirror: moved a table of another source table aside", table=name, to=aside, oid=other_id)


def _key_index(table_id: TableId) -> str:
    return quote_ident(f"_etl_key_{table_id}")


def _create_key_index(conn: sqlite3.Connection, name: str, schema: TableSchema) -> None:
    key = schema.key_columns
    if key:
        columns = ", ".join(quote_ident(c.name) for c in key)
        conn.execute(f"CREATE UNIQUE INDEX {_key_index(schema.id)} ON {quote_ident(name)} ({columns})")


# -- schema changes --------------------------------------------------------------------------------------------


@dataclass
class ColumnChanges:
    renames: list[tuple[str, str]] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)
    adds: list[ColumnSchema] = field(default_factory=list)


def column_changes(old: TableSchema, new: TableSchema) -> ColumnChanges:
    """How the mirrored columns must change from ``old`` to ``new``.

    Columns match by etl's rule, ``etl.schema.match_columns``: by attribute number (which a rename
    keeps and the mirror stores with each schema), else by name, else -- for columns added while only
    RELATION messages described the table -- as the engine inferred a rename. A matched column whose
    values would read differently (``integer`` to ``text``, say) fails the table with a hint to resync
    it: the mirrored values are not converted.
    """
    changes = ColumnChanges()
    matched: set[int] = set()
    for position, column in match_columns(old, new):
        if position is None:
            changes.adds.append(column)
            continue
        matched.add(position)
        previous = old.columns[position]
        if value_kind(previous) != value_kind(column):
            raise TableError(
                f"table {new.name}: column {column.name} changed type from {previous.type_name or previous.type_oid}"
                f" to {column.type_name or column.type_oid}; the mirrored values cannot be converted",
                hint=RESYNC_HINT.format(name=new.name),
                table_id=new.id,
            )
        if previous.name != column.name:
            changes.renames.append((previous.name, column.name))
    changes.drops = [c.name for i, c in enumerate(old.columns) if i not in matched]
    return changes


def migrate(conn: sqlite3.Connection, table: MirroredTable, schema: TableSchema) -> MirroredTable:
    """Bring the mirrored table to ``schema``: rename it and its columns, drop and add columns, re-key it.

    Added columns are NULL in existing rows: Postgres fills them with the column default without
    logging a change for each row, so nothing tells the mirror their values.
    """
    name = sqlite_table_name(schema.name)
    current = table.sqlite_table
    if name != current:
        _free_name(conn, name, schema.id)
        conn.execute(f"ALTER TABLE {quote_ident(current)} RENAME TO {quote_ident(name)}")
        log.info("sqlite mirror: renamed table", table=current, to=name)
    changes = column_changes(table.schema, schema)
    quoted = quote_ident(name)
    conn.execute(f"DROP INDEX IF EXISTS {_key_index(schema.id)}")  # columns of an index cannot be dropped
    # Renames go through temporary names, with the drops in between, so that swaps, chains (a->b, b->c)
    # and a rename onto the name of a dropped column cannot collide.
    for i, (old, _) in enumerate(changes.renames):
        conn.execute(f"ALTER TABLE {quoted} RENAME COLUMN {quote_ident(old)} TO {quote_ident(f'_etl_rename_{i}')}")
    for column_name in changes.drops:
        conn.execute(f"ALTER TABLE {quoted} DROP COLUMN {quote_ident(column_name)}")
    for i, (_, new) in enumerate(changes.renames):
        conn.execute(f"ALTER TABLE {quoted} RENAME COLUMN {quote_ident(f'_etl_rename_{i}')} TO {quote_ident(new)}")
    for column in changes.adds:
        conn.execute(f"ALTER TABLE {quoted} ADD COLUMN {quote_ident(column.name)} {sqlite_type(column)}")
    _create_key_index(conn, name, schema)
    conn.execute(
        f"UPDATE {META_TABLE} SET sqlite_table = ?, schema = ? WHERE table_id = ?",
        (name, schema_to_json(schema), schema.id),
    )
    if changes.renames or changes.drops or changes.adds:
        log.info(
            "sqlite mirror: table schema changed",
            table=name,
            renamed=changes.renames,
            dropped=changes.drops,
            added=[c.name for c in changes.adds],
        )
    return MirroredTable(name, schema, table.watermark)
