"""Batches of changes for destination tests, built as the engine builds them: Arrow change tables per table
(``EventBatch.changes``) and the matching events (``EventBatch.events``), so a destination that reads either
sees the same changes.

::

    batch = BatchBuilder().commit().insert(ITEMS, {"id": 1, "note": "a"}).update(ITEMS, {"id": 1, "note": "b"}).build()
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa

from etl.events import (
    COMMIT_LSN_COLUMN,
    MISSING,
    MISSING_COLUMN,
    OLD_COLUMN,
    OLD_IS_KEY_COLUMN,
    OP_COLUMN,
    TX_ORDINAL_COLUMN,
    BeginEvent,
    CommitEvent,
    DeleteEvent,
    Event,
    EventBatch,
    InsertEvent,
    RelationEvent,
    TableChanges,
    TruncateEvent,
    UpdateEvent,
)
from etl.lsn import Lsn
from etl.postgres.codecs import arrow_type
from etl.schema import TableSchema


def rows_table(schema: TableSchema, rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (dicts by column name; a missing name is null) as the Arrow table the engine's copy hands over."""
    return pa.table(
        {c.name: pa.array([r.get(c.name) for r in rows], arrow_type(c)) for c in schema.columns},
    )


class BatchBuilder:
    """Builds an EventBatch twice over, as the engine does: Arrow change tables and the matching events (each
    transaction's ``BeginEvent`` and ``CommitEvent`` included; ``build`` ends the one under way)."""

    def __init__(self, lsn: int = 0x1000) -> None:
        self.lsn = lsn
        self.ordinal = 0
        """The 0-based position of the transaction's next change, as the engine numbers them."""
        self._open = False
        self._ended = 0
        """The commit LSN of the last transaction ended."""
        self._changes: list[tuple[TableSchema, dict[str, Any] | None]] = []
        self._events: list[Event] = []
        self._relation: dict[int, TableSchema] = {}

    def commit(self, at: int | None = None) -> BatchBuilder:
        """Start the next transaction (its ``BeginEvent``), ending the one before (its ``CommitEvent``); ``at``: its
        commit record's LSN (by default 0x100 past the one before; the end of the one before is the least)."""
        self._end()
        self.lsn = self.lsn + 0x100 if at is None else at
        self.ordinal = 0
        self._open = True
        lsn = Lsn(self.lsn)
        self._events.append(BeginEvent(lsn, lsn, 0, self.lsn // 0x100, commit_time(self.lsn)))
        return self

    def _end(self) -> None:
        if self._open:
            lsn = Lsn(self.lsn)
            self._events.append(CommitEvent(lsn, lsn, self.ordinal, Lsn(self.lsn + 1), commit_time(self.lsn)))
            self._open = False
            self._ended = self.lsn

    def _position(self) -> dict[str, Any]:
        """The position of the transaction's next change (a schema version takes the position of the change it
        comes before)."""
        return {"start_lsn": Lsn(self.lsn), "commit_lsn": Lsn(self.lsn), "tx_ordinal": self.ordinal}

    def _add(
        self,
        schema: TableSchema,
        *,
        op: str,
        row: dict[str, Any],
        old: dict[str, Any] | None,
        old_is_key: bool,
        missing: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        if self._relation.get(schema.id) != schema:
            self._relation[schema.id] = schema
            self._events.append(RelationEvent(**self._position(), schema=schema))
        position = self._position()
        self.ordinal += 1
        self._changes.append(
            (schema, {"op": op, "row": row, "old": old, "old_is_key": old_is_key, "missing": list(missing), **position})
        )
        return position

    def relation(self, schema: TableSchema) -> BatchBuilder:
        """A schema version with no change of its own in the batch (the DDL trigger reports one at the DDL)."""
        self._relation[schema.id] = schema
        self._events.append(RelationEvent(**self._position(), schema=schema))
        self._changes.append((schema, None))
        return self

    def insert(self, schema: TableSchema, row: dict[str, Any]) -> BatchBuilder:
        position = self._add(schema, op="I", row=row, old=None, old_is_key=False)
        self._events.append(InsertEvent(**position, table_id=schema.id, row=_tuple(schema, row)))
        return self

    def update(
        self, schema: TableSchema, row: dict[str, Any], old: dict[str, Any] | None = None, missing: tuple[str, ...] = ()
    ) -> BatchBuilder:
        old_is_key = old is not None and set(old) <= {c.name for c in schema.key_columns}
        position = self._add(
            schema,
            op="U",
            row={k: v for k, v in row.items() if k not in missing},
            old=old,
            old_is_key=old_is_key,
            missing=missing,
        )
        new = tuple(MISSING if c.name in missing else row.get(c.name) for c in schema.columns)
        self._events.append(
            UpdateEvent(
                **position,
                table_id=schema.id,
                row=new,
                old_row=_tuple(schema, old) if old else None,
                old_is_key=old_is_key,
            )
        )
        return self

    def delete(self, schema: TableSchema, old: dict[str, Any]) -> BatchBuilder:
        old_is_key = set(old) <= {c.name for c in schema.key_columns}
        position = self._add(schema, op="D", row=old, old=None, old_is_key=old_is_key)
        self._events.append(
            DeleteEvent(**position, table_id=schema.id, old_row=_tuple(schema, old), old_is_key=old_is_key)
        )
        return self

    def truncate(self, schema: TableSchema) -> BatchBuilder:
        position = self._add(schema, op="T", row={}, old=None, old_is_key=False)
        self._events.append(TruncateEvent(**position, table_ids=(schema.id,), cascade=False, restart_identity=False))
        return self

    def build(self, ends_in_transaction: bool = False) -> EventBatch:
        """The batch so far; ``ends_in_transaction``: the transaction under way goes on in the next one, as the
        stream splits a transaction larger than a batch."""
        changes: dict[int, list[TableChanges]] = {}
        segments: list[tuple[TableSchema, list[dict[str, Any]]]] = []
        current: dict[int, tuple[TableSchema, list[dict[str, Any]]]] = {}
        for schema, change in self._changes:
            segment = current.get(schema.id)
            if segment is None or segment[0] != schema:
                segment = (schema, [])
                current[schema.id] = segment
                segments.append(segment)
            if change is not None:
                segment[1].append(change)
        for schema, items in segments:
            changes.setdefault(schema.id, []).append(TableChanges(schema, _change_table(schema, items)))
        if not ends_in_transaction:
            self._end()
        events = list(self._events)
        stamps = {int(c["commit_lsn"]): commit_time(int(c["commit_lsn"])) for _, c in self._changes if c is not None}
        self._changes, self._events = [], []
        return EventBatch(
            changes,
            lambda: iter(events),
            # as the stream gives it: where the last commit ends
            Lsn((self._ended + 1 if self._ended else 0) if ends_in_transaction else self.lsn),
            commit_timestamps=stamps,
            ends_in_transaction=ends_in_transaction,
        )


def commit_time(lsn: int) -> dt.datetime:
    """The commit time the kit gives the transaction at ``lsn``: a second per 0x100 of LSN after 2026-01-01."""
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=lsn / 0x100)


def _tuple(schema: TableSchema, row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(c.name) for c in schema.columns)


def _change_table(schema: TableSchema, items: list[dict[str, Any]]) -> pa.Table:
    rows = rows_table(schema, [i["row"] for i in items])
    old_type = pa.struct([pa.field(c.name, arrow_type(c)) for c in schema.columns])
    old = pa.array([i["old"] for i in items], old_type)
    return (
        rows.append_column(OP_COLUMN, pa.array([i["op"] for i in items], pa.string()))
        .append_column(COMMIT_LSN_COLUMN, pa.array([int(i["commit_lsn"]) for i in items], pa.uint64()))
        .append_column(TX_ORDINAL_COLUMN, pa.array([i["tx_ordinal"] for i in items], pa.int64()))
        .append_column(MISSING_COLUMN, pa.array([i["missing"] for i in items], pa.list_(pa.string())))
        .append_column(OLD_COLUMN, old)
        .append_column(OLD_IS_KEY_COLUMN, pa.array([i["old_is_key"] for i in items], pa.bool_()))
    )
