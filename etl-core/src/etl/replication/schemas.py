"""The schema in force for each table, as the stream moves on.

Two sources describe a table's shape:

- The DDL event trigger's messages (``etl.postgres.ddl``): the full shape after each
  ``ALTER TABLE`` (attribute numbers, nullability, defaults), at the position of the DDL.
- pgoutput RELATION messages, sent before a table's first change in every session and after
  DDL: names, types, type modifiers, key flags and the replica identity only. Nullability, type
  names, defaults (and the values older rows hold) and attribute numbers are carried over from the
  previous version for columns that kept their name, so a RELATION that follows a trigger message
  matches it and adds no version.

A new version is stored only when the description differs from the current version. Versions
are keyed by the final (commit) LSN of the transaction that made them, whatever the source, so
their order in the store is the order of the stream; several changes in one transaction each
emit a ``Relation`` event, and the store keeps the last.

Rename heuristic (RELATION only): a rename and a drop plus an add look alike on the wire. When a
RELATION has as many columns as the previous version, every position keeps its type and type
modifier, and each column whose name changed has a name the previous version did not have (and
the old name is gone), the columns are taken as renamed: they keep their attribute number,
nullability and default. Dropping a table's last column and adding one of the same type (with no
row of the table between the two) is indistinguishable and is taken as a rename too; the trigger
removes the ambiguity.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import structlog

from etl.errors import StoreError
from etl.lsn import Lsn
from etl.postgres import pgoutput as pg
from etl.postgres.ddl import SchemaChange
from etl.schema import ColumnSchema, ReplicaIdentity, TableId, TableName, TableSchema, renamed_in_place
from etl.store.base import Store

log = structlog.get_logger(__name__)


def wire_key(column: ColumnSchema, identity: ReplicaIdentity) -> bool:
    """The key flag a RELATION message gives the column: every column with FULL identity, none with NOTHING."""
    if identity is ReplicaIdentity.FULL:
        return True
    if identity is ReplicaIdentity.NOTHING:
        return False
    return column.primary_key


def wire_shape(schema: TableSchema) -> tuple[object, ...]:
    """What a RELATION message can tell about a schema."""
    identity = schema.replica_identity
    return (
        schema.name,
        identity,
        tuple((c.name, c.type_oid, c.type_modifier, wire_key(c, identity)) for c in schema.columns),
    )


def schema_from_relation(msg: pg.Relation, previous: TableSchema | None, lsn: Lsn) -> TableSchema:
    if previous is None:
        matches: list[ColumnSchema | None] = [None] * len(msg.columns)
    elif renamed_in_place(previous.columns, msg.columns):
        matches = list(previous.columns)
        log.info(
            "columns taken as renamed (inferred from a RELATION message)",
            table=f"{msg.namespace}.{msg.name}",
            renames={b.name: c.name for c, b in zip(msg.columns, previous.columns, strict=True) if c.name != b.name},
        )
    else:
        by_name = {c.name: c for c in previous.columns}
        matches = [by_name.get(c.name) for c in msg.columns]
    # With FULL or NOTHING identity the message's flags do not say which columns form the primary key.
    flags_name_key = msg.replica_identity in (ReplicaIdentity.DEFAULT, ReplicaIdentity.INDEX)
    columns = []
    for col, before in zip(msg.columns, matches, strict=True):
        same_type = before is not None and before.type_oid == col.type_oid
        columns.append(
            ColumnSchema(
                name=col.name,
                type_oid=col.type_oid,
                type_modifier=col.type_modifier,
                nullable=before.nullable if before is not None else True,
                primary_key=col.flags_key if flags_name_key else (before is not None and before.primary_key),
                type_name=before.type_name if before is not None and same_type else "",
                attnum=before.attnum if before is not None else None,
                default=before.default if before is not None and same_type else None,
                missing_value=before.missing_value if before is not None and same_type else None,
            )
        )
    return TableSchema(msg.oid, TableName(msg.namespace, msg.name), tuple(columns), msg.replica_identity, lsn)


class SchemaTracker:
    """Current schema per table, loaded from and saved to the store.

    ``publication`` selects the columns a trigger message keeps (a publication may list columns);
    without it every column logical replication can send is kept.
    """

    def __init__(self, store: Store, publication: str | None = None) -> None:
        self._store = store
        self._publication = publication
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

    def record_partitions(
        self, table_id: TableId, partitions: tuple[TableId, ...], attachments: tuple[tuple[TableId, int], ...]
    ) -> None:
        """Record the partitions of the table's current version: its leaves, and when its tree's were attached."""
        schema = replace(self.current(table_id), partitions=partitions, attachments=attachments)
        self._store.store_table_schema(schema)
        with self._lock:
            self._current[table_id] = schema

    def forget(self, table_id: TableId) -> None:
        with self._lock:
            self._current.pop(table_id, None)

    def observe(self, msg: pg.Relation, lsn: Lsn) -> TableSchema | None:
        """Record the schema a RELATION message describes; return it when it is a new version."""
        previous = self._previous(msg.oid)
        schema = schema_from_relation(msg, previous, lsn)
        same = previous is not None and wire_shape(previous) == wire_shape(schema)
        return self._record(schema, previous, same)

    def observe_ddl(self, change: SchemaChange, lsn: Lsn) -> TableSchema | None:
        """Record the schema a DDL trigger message describes; return it when it is a new version.

        ``None`` too when the tracker's publication does not publish the table (any more).
        """
        schema = change.table_schema(self._publication, lsn)
        if schema is None:
            return None
        previous = self._previous(change.table_id)
        same = previous is not None and previous.same_shape(schema)
        return self._record(schema, previous, same)

    def _previous(self, table_id: TableId) -> TableSchema | None:
        return self._current.get(table_id) or self._store.get_table_schema(table_id)

    def _record(self, schema: TableSchema, previous: TableSchema | None, same: bool) -> TableSchema | None:
        if same and previous is not None:
            with self._lock:
                self._current[schema.id] = previous
            return None
        if previous is not None and schema.partitions is None:  # messages do not tell; the copy recorded them
            schema = replace(schema, partitions=previous.partitions, attachments=previous.attachments)
        self._store.store_table_schema(schema)
        with self._lock:
            self._current[schema.id] = schema
        log.info(
            "table schema changed", table=str(schema.name), lsn=str(schema.snapshot_lsn), columns=schema.column_names
        )
        return schema
