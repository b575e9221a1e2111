"""Replication events, and the batches in which destinations receive them.

A batch holds its changes twice over, lazily: per table as Arrow change tables (what bulk
destinations want) and as ordered Python events (what simple destinations want). Neither view is
built until asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from etl.lsn import Lsn
from etl.schema import TableId, TableSchema


class _Missing:
    """An unchanged TOAST value the source did not send and that could not be recovered."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()

Row = tuple[Any, ...]
"""Column values in the order of the table schema; ``MISSING`` marks unchanged TOAST."""


@dataclass(frozen=True)
class _Positioned:
    start_lsn: Lsn
    commit_lsn: Lsn
    tx_ordinal: int


@dataclass(frozen=True)
class BeginEvent(_Positioned):
    xid: int
    timestamp: datetime


@dataclass(frozen=True)
class CommitEvent(_Positioned):
    end_lsn: Lsn
    timestamp: datetime


@dataclass(frozen=True)
class RelationEvent(_Positioned):
    """The schema in force for the table's following rows."""

    schema: TableSchema


@dataclass(frozen=True)
class InsertEvent(_Positioned):
    table_id: TableId
    row: Row


@dataclass(frozen=True)
class UpdateEvent(_Positioned):
    table_id: TableId
    row: Row
    """The new row; may hold ``MISSING`` for unchanged TOAST values that could not be recovered."""
    old_row: Row | None
    """The old row when Postgres sent one: the key columns only (``old_is_key``) or all columns."""
    old_is_key: bool


@dataclass(frozen=True)
class DeleteEvent(_Positioned):
    table_id: TableId
    old_row: Row
    old_is_key: bool


@dataclass(frozen=True)
class TruncateEvent(_Positioned):
    table_ids: tuple[TableId, ...]
    cascade: bool
    restart_identity: bool


Event = BeginEvent | CommitEvent | RelationEvent | InsertEvent | UpdateEvent | DeleteEvent | TruncateEvent

# Metadata columns of an Arrow change table, after the row columns.
OP_COLUMN: Final = "_etl_op"
"""``I`` insert, ``U`` update, ``D`` delete, ``T`` truncate (row columns all null)."""
CHANGE_KINDS: Final = {"I": "insert", "U": "update", "D": "delete", "T": "truncate"}
"""The name of each ``OP_COLUMN`` value."""
COMMIT_LSN_COLUMN: Final = "_etl_commit_lsn"
TX_ORDINAL_COLUMN: Final = "_etl_tx_ordinal"
MISSING_COLUMN: Final = "_etl_missing"
"""list<string>: names of columns holding unrecovered unchanged TOAST values (null in the row)."""
OLD_COLUMN: Final = "_etl_old"
"""struct of the row columns: the old row of an update when Postgres sent one, else null."""
OLD_IS_KEY_COLUMN: Final = "_etl_old_is_key"
"""For updates and deletes: whether the old row (``_etl_old``, or the row of a delete) holds only key columns."""
METADATA_COLUMNS: Final = (
    OP_COLUMN,
    COMMIT_LSN_COLUMN,
    TX_ORDINAL_COLUMN,
    MISSING_COLUMN,
    OLD_COLUMN,
    OLD_IS_KEY_COLUMN,
)


@dataclass(frozen=True)
class TableChanges:
    """Consecutive changes of one table under one schema version, in source order.

    For inserts and updates the row columns hold the new row; for deletes they hold the old row
    (key columns only when ``_etl_old_is_key``, other columns null).
    """

    schema: TableSchema
    table: pa.Table


@dataclass
class EventBatch:
    """A slice of the replication stream, handed to ``Destination.write_events``.

    ``changes`` gives, per table, its change segments in order; a table gets a new segment when its
    schema changes. ``events()`` yields the same changes, plus transaction markers and relation
    events, as ordered Python objects. Per-table order is preserved; a batch ends at a commit, but for a
    transaction larger than a batch, which is split over batches.
    """

    changes: dict[TableId, list[TableChanges]]
    _events: Callable[[], Iterator[Event]] = field(repr=False)
    last_commit_lsn: Lsn = Lsn.ZERO
    """End LSN of the last transaction that commits in this batch; progress after a durable write."""
    commit_times: Sequence[datetime] = ()
    """Source commit time of every transaction that commits in this batch, in order (for metrics)."""
    schema_changes: int = 0
    """Relation events (new schema versions) in the batch, for metrics."""
    commit_timestamps: Mapping[int, datetime] = field(default_factory=dict)
    """Source commit time by commit LSN (``_etl_commit_lsn``) of every transaction with changes in the batch,
    also of one that began in an earlier batch or commits in a later one (Postgres sends it at BEGIN)."""
    ends_in_transaction: bool = False
    """The batch ends inside a transaction larger than a batch, whose rest comes in the next ones."""
    all_tables_ready: bool = False
    """Every published table was ready when the stream cut the batch: copied and caught up, none errored, no copy
    or backfill in chunks under way. A destination that applies the batch in one step, after every earlier one,
    then holds a state the source had (unless ``ends_in_transaction``)."""

    def events(self) -> Iterator[Event]:
        return self._events()

    @property
    def table_ids(self) -> Sequence[TableId]:
        return list(self.changes)

    def change_counts_by_table(self) -> dict[TableId, dict[str, int]]:
        """Each table's changes by kind (``CHANGE_KINDS``' names), counted in Arrow; tables without changes
        (a schema change alone) are left out."""
        by_table: dict[TableId, dict[str, int]] = {}
        for table_id, segments in self.changes.items():
            counts = dict.fromkeys(CHANGE_KINDS.values(), 0)
            for segment in segments:
                if segment.table.num_rows:
                    for entry in pc.value_counts(segment.table.column(OP_COLUMN)).to_pylist():
                        counts[CHANGE_KINDS[entry["values"]]] += entry["counts"]
            if any(counts.values()):
                by_table[table_id] = counts
        return by_table

    def without_table(self, table_id: TableId) -> EventBatch:
        """The same batch minus one table's changes (after that table failed: so no longer ``all_tables_ready``)."""
        source = self._events

        def events() -> Iterator[Event]:
            for event in source():
                if isinstance(event, TruncateEvent):
                    rest = tuple(t for t in event.table_ids if t != table_id)
                    if rest:
                        yield replace(event, table_ids=rest) if len(rest) != len(event.table_ids) else event
                elif _table_of(event) != table_id:
                    yield event

        changes = {t: segs for t, segs in self.changes.items() if t != table_id}
        return replace(self, changes=changes, _events=events, all_tables_ready=False)

    def row_count(self) -> int:
        return sum(seg.table.num_rows for segs in self.changes.values() for seg in segs)

    def parted(
        self, table_id: TableId, from_lsn: Lsn, *, holding: bool = False
    ) -> tuple[EventBatch, EventBatch | None]:
        """The batch without the changes of ``table_id`` from the first whose transaction commits at or after
        ``from_lsn`` on (all of them when ``holding``: an earlier batch's were held), and those changes as a batch of
        their own that commits nothing (``None`` when there are none). A schema change goes with what follows it
        once one change is held, so the table's order is kept in both views of the batch."""
        segments = self.changes.get(table_id)
        if not segments:
            return self, None
        kept: list[TableChanges] = []
        held: list[TableChanges] = []
        bound = pa.scalar(int(from_lsn), pa.uint64())
        for segment in segments:
            if holding or held:
                held.append(segment)
                continue
            later = pc.greater_equal(segment.table.column(COMMIT_LSN_COLUMN), bound)
            count = pc.sum(later).as_py() or 0
            if count == 0:
                kept.append(segment)
            elif count == segment.table.num_rows:
                held.append(segment)
            else:
                kept.append(TableChanges(segment.schema, segment.table.filter(pc.invert(later))))
                held.append(TableChanges(segment.schema, segment.table.filter(later)))
        if not held:
            return self, None
        source = self._events

        def sorted_out() -> Iterator[tuple[bool, Event]]:
            """Each event, and whether it is held: the table's from its first at or after ``from_lsn`` on."""
            holds = holding
            for event in source():
                if isinstance(event, TruncateEvent) and table_id in event.table_ids:
                    holds = holds or event.commit_lsn >= from_lsn
                    if not holds:
                        yield False, event
                        continue
                    others = tuple(t for t in event.table_ids if t != table_id)
                    if others:
                        yield False, replace(event, table_ids=others)
                    yield True, replace(event, table_ids=(table_id,))
                elif _table_of(event) == table_id:
                    holds = holds or (event.commit_lsn >= from_lsn and not isinstance(event, RelationEvent))
                    yield holds, event
                else:
                    yield False, event

        def rest() -> Iterator[Event]:
            return (event for held_back, event in sorted_out() if not held_back)

        def own() -> Iterator[Event]:
            return (event for held_back, event in sorted_out() if held_back)

        changes = {t: (kept if t == table_id else segs) for t, segs in self.changes.items()}
        if not kept:
            del changes[table_id]
        remaining = replace(self, changes=changes, _events=rest, all_tables_ready=False)
        return remaining, EventBatch({table_id: held}, own, commit_timestamps=self.commit_timestamps)


def joined(batches: Sequence[EventBatch]) -> EventBatch:
    """``batches`` one after the other as one batch; consecutive segments of a table under the same schema become
    one. What the batch commits, ends in and counts is the last batch's."""
    changes: dict[TableId, list[TableChanges]] = {}
    for batch in batches:
        for table_id, segments in batch.changes.items():
            merged = changes.setdefault(table_id, [])
            for segment in segments:
                if merged and merged[-1].schema == segment.schema:
                    both = pa.concat_tables([merged[-1].table, segment.table])
                    merged[-1] = TableChanges(segment.schema, both)
                else:
                    merged.append(segment)
    timestamps: dict[int, datetime] = {}
    for batch in batches:
        timestamps.update(batch.commit_timestamps)

    def events() -> Iterator[Event]:
        for batch in batches:
            yield from batch.events()

    return replace(batches[-1], changes=changes, _events=events, commit_timestamps=timestamps)


def summed_counts(by_table: Mapping[TableId, Mapping[str, int]]) -> dict[str, int]:
    """Changes by kind over all tables, from ``EventBatch.change_counts_by_table``."""
    counts = dict.fromkeys(CHANGE_KINDS.values(), 0)
    for table in by_table.values():
        for kind, count in table.items():
            counts[kind] += count
    return counts


def _table_of(event: Event) -> TableId | None:
    if isinstance(event, RelationEvent):
        return event.schema.id
    if isinstance(event, InsertEvent | UpdateEvent | DeleteEvent):
        return event.table_id
    return None
