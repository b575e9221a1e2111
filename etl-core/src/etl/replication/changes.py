"""Accumulate decoded changes column-wise and build ``EventBatch`` objects from them.

The hot path keeps each row where the decoder found it (its payload and the offset of its tuple,
not yet parsed); ``build()`` parses the rows of a table segment (``segment``) column by column with
``tuple_columns`` and converts every column with one ``decode_text_column`` call. The ordered
Python events of a batch are produced lazily from the same Arrow columns.

Ordering: every change carries its transaction's ``commit_lsn`` (the final LSN announced by
BEGIN) and ``tx_ordinal``, its 0-based position among the transaction's changes (inserts,
updates, deletes, truncates; the rows one truncate adds to several tables share its ordinal).
``BeginEvent`` has ordinal 0, a ``RelationEvent`` the ordinal of the change it precedes and
``CommitEvent`` the number of changes. A batch may end inside a transaction: the next batch goes
on with the same ``commit_lsn`` and ordinals. Transactions without changes produce no events
(their commit still moves ``EventBatch.last_commit_lsn``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Final

import pyarrow as pa

from etl.errors import EtlError
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
from etl.postgres.codecs import python_values
from etl.postgres.pgoutput import (
    OldKind,
    TupleData,
    Value,
)
from etl.replication.segment import Segment
from etl.schema import TableId, TableSchema

_INDEX_BITS: Final = 32
_INDEX_MASK: Final = (1 << _INDEX_BITS) - 1
_ROW_OVERHEAD: Final = 96
"""Estimated bytes per buffered row besides its payload (metadata columns, Python objects)."""


class ChangeBuilder:
    """Collects the changes of one batch; ``build()`` hands them over as an ``EventBatch`` and starts afresh.

    ``schema_of`` gives a table's current schema; it is asked at a table's first change in each
    batch. ``relation()`` announces a new schema version: the table's following changes start a
    new segment under it.
    """

    def __init__(self, schema_of: Callable[[TableId], TableSchema]) -> None:
        self._schema_of = schema_of
        # the transaction in progress, carried across build()
        self._in_transaction = False
        # Positions are kept as plain ints: an Lsn (an int subclass) is tracked by the garbage collector,
        # and hundreds of thousands of them in a batch made its collections a large cost of the apply loop.
        self._commit_lsn = 0
        self._commit_ts: datetime | None = None
        self._start_lsn: tuple[Lsn, int] = (Lsn.ZERO, 0)
        """The last ``start_lsn`` of a change and its int (the same for every change of a transaction)."""
        self._ordinal = 0
        self._last_commit_lsn = Lsn.ZERO
        self._reset()

    def _reset(self) -> None:
        self._segments: dict[TableId, list[Segment]] = {}
        self._open: dict[TableId, Segment] = {}
        self._segment_list: list[Segment] = []
        self._log: list[int | tuple[Any, ...]] = []
        """Changes as ``segment number << 32 | row index`` (an int: nothing for the garbage collector to
        track), transaction boundaries, relations and truncates as tuples, in stream order."""
        self._changes = 0
        self._commits = 0
        self._commit_times: list[datetime] = []
        self._commit_stamps: dict[int, datetime] = {}
        if self._in_transaction and self._commit_ts is not None:  # its changes go on in the next batch
            self._commit_stamps[self._commit_lsn] = self._commit_ts
        self._size = 0
        self._relations = 0

    # -- state ---------------------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        """Estimated memory held by the buffered changes."""
        return self._size

    @property
    def is_empty(self) -> bool:
        """No change or schema change is buffered (transaction boundaries alone may be)."""
        return self._changes == 0

    def holds(self, table_id: TableId) -> bool:
        """Whether a change or schema change of the table is buffered."""
        return table_id in self._segments

    @property
    def has_commits(self) -> bool:
        """A commit is buffered: building now would move ``last_commit_lsn``."""
        return self._commits > 0

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    @property
    def splits_a_transaction(self) -> bool:
        """Whether building now would end the batch inside a transaction: it holds changes of one still open."""
        log = self._log
        return self._in_transaction and bool(log) and not (isinstance(log[-1], tuple) and log[-1][0] == "B")

    def holds_rows_of(self, table_id: TableId) -> bool:
        """Whether the batch holds row changes of ``table_id`` (a new schema version would start a second
        segment of it)."""
        return any(segment.ops for segment in self._segments.get(table_id, ()))

    # -- transaction boundaries ------------------------------------------------------------------------
    def begin(self, xid: int, final_lsn: Lsn, commit_ts: datetime, start_lsn: Lsn) -> None:
        if self._in_transaction:
            raise EtlError(f"BEGIN of transaction {xid} inside another transaction: the stream is out of order")
        self._in_transaction = True
        self._commit_lsn = int(final_lsn)
        self._commit_ts = commit_ts
        self._commit_stamps[self._commit_lsn] = commit_ts
        self._ordinal = 0
        self._log.append(("B", int(start_lsn), self._commit_lsn, xid, commit_ts))

    def commit(self, commit_lsn: Lsn, end_lsn: Lsn, commit_ts: datetime, start_lsn: Lsn) -> None:
        if not self._in_transaction:
            raise EtlError(f"COMMIT at {commit_lsn} outside a transaction: the stream is out of order")
        self._in_transaction = False
        self._commits += 1
        self._last_commit_lsn = end_lsn
        self._commit_times.append(commit_ts)
        log = self._log
        if (
            log and isinstance(log[-1], tuple) and log[-1][0] == "B"
        ):  # nothing happened in between: leave the empty transaction out
            log.pop()
            self._commit_stamps.pop(self._commit_lsn, None)
        else:
            log.append(("C", int(start_lsn), self._commit_lsn, self._ordinal, int(end_lsn), commit_ts))

    # -- changes ---------------------------------------------------------------------------------------
    def relation(self, schema: TableSchema, start_lsn: Lsn) -> None:
        """A new schema version of ``schema.id``: emit a RelationEvent and start a new segment."""
        table_id = schema.id
        previous = self._open.get(table_id)
        segments = self._segments.setdefault(table_id, [])
        if previous is not None and not previous.ops:  # superseded before any row: drop it
            segments.remove(previous)
        segment = self._new_segment(table_id, schema)
        segments.append(segment)
        self._open[table_id] = segment
        self._changes += 1
        self._relations += 1
        self._log.append(("R", int(start_lsn), self._commit_lsn, self._ordinal, schema))

    def insert(self, table_id: TableId, new: Sequence[Value], start_lsn: Lsn) -> None:
        row = new if isinstance(new, TupleData) else TupleData.of(new)
        self.insert_tuple(table_id, row.data, row.start, start_lsn)

    def insert_tuple(self, table_id: TableId, payload: bytes, start: int, start_lsn: Lsn) -> None:
        """An insert whose new row is the pgoutput tuple at ``payload[start:]``."""
        segment = self._open.get(table_id) or self._start(table_id)
        self._add(segment, "I", payload, start, start_lsn)
        self._size += len(payload) + _ROW_OVERHEAD

    def insert_tuples(self, table_id: TableId, payloads: list[bytes], start: int, start_lsn: Lsn) -> None:
        """Inserts whose new rows are the pgoutput tuples at ``payload[start:]`` of each payload, added at once."""
        if not self._in_transaction:
            raise EtlError("a change outside a transaction: the stream is out of order")
        segment = self._open.get(table_id) or self._start(table_id)
        n, first = len(payloads), len(segment.ops)
        segment.payloads.extend(payloads)
        segment.starts.extend(itertools.repeat(start, n))
        segment.ops.extend(itertools.repeat("I", n))
        segment.lsns.extend(itertools.repeat(self._commit_lsn, n))
        segment.ordinals.extend(range(self._ordinal, self._ordinal + n))
        segment.start_lsns.extend(itertools.repeat(int(start_lsn), n))
        self._ordinal += n
        entry = segment.number << _INDEX_BITS | first
        self._log.extend(range(entry, entry + n))
        self._changes += n
        self._size += sum(map(len, payloads)) + n * _ROW_OVERHEAD

    def update(
        self,
        table_id: TableId,
        old_kind: OldKind | None,
        old: Sequence[Value] | None,
        new: Sequence[Value],
        start_lsn: Lsn,
    ) -> None:
        segment = self._open.get(table_id) or self._start(table_id)
        row = _raw(new)
        index = self._add(segment, "U", row.data, row.start, start_lsn)
        segment.old_kinds[index] = old_kind
        self._size += len(row.data) + _ROW_OVERHEAD
        if old is not None:
            old_row = segment.old_rows[index] = _raw(old)
            if old_row.data is not row.data:  # as decoded, both share one payload
                self._size += len(old_row.data)

    def delete(self, table_id: TableId, old_kind: OldKind, old: Sequence[Value], start_lsn: Lsn) -> None:
        segment = self._open.get(table_id) or self._start(table_id)
        row = _raw(old)
        index = self._add(segment, "D", row.data, row.start, start_lsn)
        segment.old_kinds[index] = old_kind
        self._size += len(row.data) + _ROW_OVERHEAD

    def truncate(self, table_ids: Iterable[TableId], cascade: bool, restart_identity: bool, start_lsn: Lsn) -> None:
        """One ``T`` row (row columns null) in each table's segment, one ``TruncateEvent`` in the events."""
        ids = tuple(table_ids)
        ordinal = self._next_ordinal()
        for table_id in ids:
            segment = self._open.get(table_id) or self._start(table_id)
            segment.payloads.append(None)
            segment.starts.append(0)
            segment.ops.append("T")
            segment.lsns.append(self._commit_lsn)
            segment.ordinals.append(ordinal)
            segment.start_lsns.append(int(start_lsn))
            self._size += _ROW_OVERHEAD
        self._changes += 1
        self._log.append(("T", int(start_lsn), self._commit_lsn, ordinal, ids, cascade, restart_identity))

    def discard_table(self, table_id: TableId) -> None:
        """Forget the buffered changes of one table (after its values failed to convert)."""
        dropped = self._segments.pop(table_id, [])
        self._open.pop(table_id, None)
        kept: list[int | tuple[Any, ...]] = []
        for entry in self._log:
            if isinstance(entry, int):
                if self._segment_list[entry >> _INDEX_BITS].table_id != table_id:
                    kept.append(entry)
                continue
            head = entry[0]
            if head == "R" and entry[4].id == table_id:
                continue
            elif head == "T" and table_id in entry[4]:
                rest = tuple(t for t in entry[4] if t != table_id)
                if rest:
                    kept.append((*entry[:4], rest, *entry[5:]))
            else:
                kept.append(entry)
        self._log = kept
        self._changes = sum(1 for entry in kept if isinstance(entry, int) or entry[0] not in ("B", "C"))
        self._size -= sum(len(s.ops) for s in dropped) * _ROW_OVERHEAD

    # -- building ----------------------------------------------------------------------------------------
    def build(self) -> EventBatch:
        """The buffered changes as an ``EventBatch``; the builder is then empty (an open transaction stays open).

        Raises ``TableError`` (with ``table_id``) when a table's values cannot be converted; nothing
        is lost then: ``discard_table`` that table and build again.
        """
        tables = {segment: segment.build() for segments in self._segments.values() for segment in segments}
        changes = {
            table_id: [TableChanges(segment.schema, tables[segment]) for segment in segments]
            for table_id, segments in self._segments.items()
        }
        log, segment_list = self._log, self._segment_list
        commit_times, relations = self._commit_times, self._relations
        stamps = self._commit_stamps
        self._reset()
        return EventBatch(
            changes,
            lambda: _events(log, segment_list, tables),
            self._last_commit_lsn,
            commit_times,
            relations,
            stamps,
        )

    # -- internals -----------------------------------------------------------------------------------------
    def _start(self, table_id: TableId) -> Segment:
        segment = self._new_segment(table_id, self._schema_of(table_id))
        self._segments.setdefault(table_id, []).append(segment)
        self._open[table_id] = segment
        return segment

    def _new_segment(self, table_id: TableId, schema: TableSchema) -> Segment:
        segment = Segment(len(self._segment_list), table_id, schema)
        self._segment_list.append(segment)
        return segment

    def _next_ordinal(self) -> int:
        if not self._in_transaction:
            raise EtlError("a change outside a transaction: the stream is out of order")
        ordinal = self._ordinal
        self._ordinal += 1
        return ordinal

    def _add(self, segment: Segment, op: str, payload: bytes, start: int, start_lsn: Lsn) -> int:
        if not self._in_transaction:
            raise EtlError("a change outside a transaction: the stream is out of order")
        index = len(segment.ops)
        segment.payloads.append(payload)
        segment.starts.append(start)
        segment.ops.append(op)
        segment.lsns.append(self._commit_lsn)
        segment.ordinals.append(self._ordinal)
        if start_lsn is not self._start_lsn[0]:
            self._start_lsn = (start_lsn, int(start_lsn))
        segment.start_lsns.append(self._start_lsn[1])
        self._ordinal += 1
        self._log.append(segment.number << _INDEX_BITS | index)
        self._changes += 1
        return index


def _raw(values: Sequence[Value]) -> TupleData:
    return values if isinstance(values, TupleData) else TupleData.of(values)


def _events(
    log: list[int | tuple[Any, ...]], segment_list: list[Segment], tables: dict[Segment, pa.Table]
) -> Iterator[Event]:
    """The ordered events of a built batch, with Python values taken from its Arrow columns."""
    views: dict[Segment, _RowView] = {}
    for entry in log:
        if isinstance(entry, int):
            segment, index = segment_list[entry >> _INDEX_BITS], entry & _INDEX_MASK
            view = views.get(segment)
            if view is None:
                view = views[segment] = _RowView(tables[segment], segment.width)
            yield view.event(segment.table_id, index, Lsn(segment.start_lsns[index]))
            continue
        head = entry[0]
        if head == "B":
            _, start_lsn, commit_lsn, xid, ts = entry
            yield BeginEvent(Lsn(start_lsn), Lsn(commit_lsn), 0, xid, ts)
        elif head == "C":
            _, start_lsn, commit_lsn, ordinal, end_lsn, ts = entry
            yield CommitEvent(Lsn(start_lsn), Lsn(commit_lsn), ordinal, Lsn(end_lsn), ts)
        elif head == "R":
            _, start_lsn, commit_lsn, ordinal, schema = entry
            yield RelationEvent(Lsn(start_lsn), Lsn(commit_lsn), ordinal, schema)
        else:
            _, start_lsn, commit_lsn, ordinal, ids, cascade, restart = entry
            yield TruncateEvent(Lsn(start_lsn), Lsn(commit_lsn), ordinal, ids, cascade, restart)


class _RowView:
    """Python values of one change segment, converted column by column once."""

    def __init__(self, table: pa.Table, width: int) -> None:
        columns = [python_values(table.column(i)) for i in range(width)]
        self.rows: list[tuple[Any, ...]] = list(zip(*columns, strict=True)) if width else [()] * table.num_rows
        self.names = table.schema.names[:width]
        self.ops = table.column(OP_COLUMN).to_pylist()
        self.lsns = table.column(COMMIT_LSN_COLUMN).to_pylist()
        self.ordinals = table.column(TX_ORDINAL_COLUMN).to_pylist()
        self.missing = table.column(MISSING_COLUMN).to_pylist()
        self.old_is_key = table.column(OLD_IS_KEY_COLUMN).to_pylist()
        old = table.column(OLD_COLUMN)
        self.old: list[tuple[Any, ...] | None] | None = None
        if old.null_count < len(old):
            self.old = [None if o is None else tuple(o.values()) for o in python_values(old)]

    def event(self, table_id: TableId, index: int, start_lsn: Lsn) -> Event:
        op, commit_lsn, ordinal = self.ops[index], Lsn(self.lsns[index]), self.ordinals[index]
        row = self.rows[index]
        if op == "I":
            return InsertEvent(start_lsn, commit_lsn, ordinal, table_id, row)
        if op == "D":
            return DeleteEvent(start_lsn, commit_lsn, ordinal, table_id, row, bool(self.old_is_key[index]))
        missing = self.missing[index]
        if missing:
            gone = set(missing)
            row = tuple(MISSING if name in gone else value for name, value in zip(self.names, row, strict=True))
        old_row = self.old[index] if self.old is not None else None
        return UpdateEvent(start_lsn, commit_lsn, ordinal, table_id, row, old_row, bool(self.old_is_key[index]))
