"""The schema in force for each table, as the stream moves on.

pgoutput sends a RELATION message before a table's first change in every session, not only after
DDL, so a new schema version is stored only when what the message describes differs from the
current version. RELATION messages carry names, types, type modifiers, key flags and the replica
identity; nullability, type names and attribute numbers are carried over from the previous version
for columns that kept their name.
"""

from __future__ import annotations

import threading

import structlog

from etl.errors import StoreError
from etl.lsn import Lsn
from etl.postgres import pgoutput as pg
from etl.schema import ColumnSchema, ReplicaIdentity, TableId, TableName, TableSchema
from etl.store.base import Store

log = structlog.get_logger(__name__)


def wire_shape(schema: TableSchema) -> tuple[object, ...]:
    """What a RELATION message can tell about a schema (with FULL identity it flags every column as key)."""
    full = schema.replica_identity is ReplicaIdentity.FULL
    return (
        schema.name,
        schema.replica_identity,
        tuple((c.name, c.type_oid, c.type_modifier, full or c.primary_key) for c in schema.columns),
    )


def schema_from_relation(msg: pg.Relation, previous: TableSchema | None, lsn: Lsn) -> TableSchema:
    known = {c.name: c for c in previous.columns} if previous is not None else {}
    full = msg.replica_identity is ReplicaIdentity.FULL
    columns = []
    for col in msg.columns:
        before = known.get(col.name)
        same_type = before is not None and before.type_oid == col.type_oid
        # With FULL identity the message flags every column; the primary key is what identifies a row.
        key = (before is not None and before.primary_key) if full else col.flags_key
        columns.append(
            ColumnSchema(
                name=col.name,
                type_oid=col.type_oid,
                type_modifier=col.type_modifier,
                nullable=before.nullable if before is not None else True,
                primary_key=key,
                type_name=before.type_name if before is not None and same_type else "",
                attnum=before.attnum if before is not None else None,
            )
        )
    return TableSchema(msg.oid, TableName(msg.namespace, msg.name), tuple(columns), msg.replica_identity, lsn)


class SchemaTracker:
    """Current schema per table, loaded from and saved to the store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._current: dict[TableId, TableSchema] = {}
        self._lock = threading.Lock()

    def current(self, table_id: TableId) -> TableSchema:
        schema = self._current.get(table_id)
        if schema is None:
            schema = self._store.get_table_schema(table_id)
            if schema is None:
                raise StoreError(f"no stored schema for table {table_id}", hint="resync the table: etl resync")
            with self._lock:
                self._current[table_id] = schema
        return schema

    def forget(self, table_id: TableId) -> None:
        with self._lock:
            self._current.pop(table_id, None)

    def observe(self, msg: pg.Relation, lsn: Lsn) -> TableSchema | None:
        """Record the schema a RELATION message describes; return it when it is a new version."""
        previous = self._current.get(msg.oid) or self._store.get_table_schema(msg.oid)
        schema = schema_from_relation(msg, previous, lsn)
        if previous is not None and wire_shape(previous) == wire_shape(schema):
            with self._lock:
                self._current[msg.oid] = previous
            return None
        self._store.store_table_schema(schema)
        with self._lock:
            self._current[msg.oid] = schema
        log.info("table schema changed", table=str(schema.name), lsn=str(lsn), columns=schema.column_names)
        return schema
