"""The memory destination: keeps every table's current rows in process memory.

Used by tests, examples and the demo. It applies changes the way a real destination must: by
replica identity key (or, for ``REPLICA IDENTITY FULL`` tables without a key, by whole row, one
occurrence per delete), skipping changes at or below the last ``(commit_lsn, tx_ordinal)`` it
applied to a table, so replays after a restart are idempotent.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import threading
import uuid
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal
from operator import itemgetter
from typing import Any, ClassVar

import pyarrow as pa

from etl.destination.base import InProcessDestination, TablePreview, WriteResult
from etl.events import (
    MISSING,
    DeleteEvent,
    EventBatch,
    InsertEvent,
    RelationEvent,
    Row,
    TruncateEvent,
    UpdateEvent,
)
from etl.postgres.codecs import python_values
from etl.schema import TableId, TableName, TableSchema, match_columns

_ORDERED_KEYS = (int, str, bytes, float, Decimal, dt.date, dt.time, uuid.UUID)
"""Types whose values of one type always order (``datetime`` is a ``date``; a column holds aware or naive ones)."""


def sort_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` in an order that depends only on their values: what comparing two tables row for row needs.

    When the first column holds distinct values of one ordered type (a key, as in most tables), they alone
    decide, six times quicker on 200k rows than the general order: the ``repr`` of every value. Both give equal
    lists for equal multisets of rows, as each choice depends on the rows' values only.
    """
    rows = list(rows)
    firsts: list[Any] = [next(iter(row.values()), None) for row in rows]
    kinds = {type(v) for v in firsts}
    kind = kinds.pop() if len(kinds) == 1 else type(None)
    if issubclass(kind, _ORDERED_KEYS) and not (issubclass(kind, (float, Decimal)) and any(map(_is_nan, firsts))):
        with contextlib.suppress(TypeError):  # aware and naive times together do not order
            if len(set(firsts)) == len(firsts):
                return [row for _, row in sorted(zip(firsts, rows, strict=True), key=itemgetter(0))]
    return sorted(rows, key=lambda row: [repr(v) for v in row.values()])


def _is_nan(value: Any) -> bool:
    """A NaN is not equal to itself: it does not order."""
    return value.is_nan() if isinstance(value, Decimal) else isinstance(value, float) and math.isnan(value)


def _hashable(value: Any) -> Any:
    """A key value as a dict key: an array (a list) as the tuple of its elements."""
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


class _Table:
    """Rows of one table: keyed by replica identity key, or a multiset of whole rows."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self.keyed: dict[Row, Row] = {}
        self.unkeyed: Counter[Row] = Counter()
        self.position: tuple[int, int] = (-1, -1)

    def key_positions(self) -> list[int]:
        return [i for i, c in enumerate(self.schema.columns) if c.primary_key]

    def key_of(self, row: Row) -> Row | None:
        positions = self.key_positions()
        if not positions:
            return None
        return tuple(_hashable(row[i]) for i in positions)

    def insert(self, row: Row) -> None:
        key = self.key_of(row)
        if key is None:
            self.unkeyed[row] += 1
        else:
            self.keyed[key] = row

    def delete(self, old: Row) -> None:
        key = self.key_of(old)
        if key is not None:
            self.keyed.pop(key, None)
        elif self.unkeyed[old] > 0:
            self.unkeyed[old] -= 1
            if not self.unkeyed[old]:
                del self.unkeyed[old]

    def update(self, new: Row, old: Row | None) -> None:
        previous = self._current(old if old is not None else new)
        if any(v is MISSING for v in new):
            if previous is None:
                raise ValueError(f"{self.schema.name}: update with unrecoverable unchanged TOAST value for unknown row")
            new = tuple(p if v is MISSING else v for v, p in zip(new, previous, strict=True))
        if previous is not None:
            self.delete(previous)
        self.insert(new)

    def _current(self, row: Row) -> Row | None:
        key = self.key_of(row)
        if key is not None:
            return self.keyed.get(key)
        return row if self.unkeyed[row] else None

    def rows(self) -> list[Row]:
        return [*self.keyed.values(), *self.unkeyed.elements()]

    def migrate(self, schema: TableSchema) -> None:
        """Reshape stored rows to a new schema version (added columns are null)."""
        if schema.columns != self.schema.columns:
            picks = [position for position, _ in match_columns(self.schema, schema)]
            rows = self.rows()
            self.keyed.clear()
            self.unkeyed.clear()
            self.schema = schema
            for row in rows:
                self.insert(tuple(None if i is None else row[i] for i in picks))
        self.schema = schema


class MemoryDestination(InProcessDestination):
    """Keeps each table's current contents in memory; every write is reported durable."""

    name: ClassVar[str] = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[TableId, _Table] = {}
        self.write_table_rows_calls: dict[TableId, int] = {}
        self.event_count = 0

    def drop_table_for_copy(self, schema: TableSchema) -> None:
        with self._lock:
            self._tables.pop(schema.id, None)
            self.write_table_rows_calls.pop(schema.id, None)

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        columns = [python_values(rows.column(i)) for i in range(rows.num_columns)]
        with self._lock:
            table = self._tables.setdefault(schema.id, _Table(schema))
            table.schema = schema
            for row in zip(*columns, strict=True):
                table.insert(row)
            self.write_table_rows_calls[schema.id] = self.write_table_rows_calls.get(schema.id, 0) + 1
        return WriteResult.DURABLE

    def write_events(self, batch: EventBatch) -> WriteResult:
        with self._lock:
            for event in batch.events():
                self.event_count += 1
                self._apply(event)
        return WriteResult.DURABLE

    def _apply(self, event: object) -> None:
        if isinstance(event, RelationEvent):
            table = self._tables.get(event.schema.id)
            if table is None:
                self._tables[event.schema.id] = _Table(event.schema)
            elif (int(event.commit_lsn), event.tx_ordinal) > table.position:  # a replayed older version: not again
                table.migrate(event.schema)
            return
        if isinstance(event, TruncateEvent):
            for table_id in event.table_ids:
                table = self._tables.get(table_id)
                if table is not None and self._advance(table, event.commit_lsn, event.tx_ordinal):
                    table.keyed.clear()
                    table.unkeyed.clear()
            return
        if not isinstance(event, InsertEvent | UpdateEvent | DeleteEvent):
            return  # transaction markers
        table = self._tables.get(event.table_id)
        if table is None or not self._advance(table, event.commit_lsn, event.tx_ordinal):
            return
        if isinstance(event, InsertEvent):
            table.insert(event.row)
        elif isinstance(event, UpdateEvent):
            table.update(event.row, event.old_row)
        else:
            table.delete(event.old_row)

    @staticmethod
    def _advance(table: _Table, commit_lsn: int, tx_ordinal: int) -> bool:
        """True (and remember the position) unless the change was applied before."""
        position = (int(commit_lsn), tx_ordinal)
        if position <= table.position:
            return False
        table.position = position
        return True

    # -- reading back --------------------------------------------------------------------------------
    def table_names(self) -> list[TableName]:
        with self._lock:
            return sorted(t.schema.name for t in self._tables.values())

    def schema(self, name: TableName | str) -> TableSchema:
        return self._find(name).schema

    def rows(self, name: TableName | str) -> list[dict[str, Any]]:
        """The table's current rows as dicts, sorted for comparison."""
        with self._lock:
            table = self._find(name)
            names = table.schema.column_names
            return sort_rows(dict(zip(names, row, strict=False)) for row in table.rows())

    def preview(self, table: TableName, limit: int) -> TablePreview:
        """The table's row count and first ``limit`` rows in column order (``PreviewableDestination``)."""
        rows = self.rows(table)
        with contextlib.suppress(TypeError):  # a column whose values do not order: keep the comparison order
            rows.sort(key=lambda row: [(v is None, 0 if v is None else v) for v in row.values()])
        return TablePreview(len(rows), rows[:limit], "the memory destination")

    def _find(self, name: TableName | str) -> _Table:
        wanted = TableName.parse(name) if isinstance(name, str) else name
        for table in self._tables.values():
            if table.schema.name == wanted:
                return table
        raise KeyError(f"no table {wanted} in the memory destination")
