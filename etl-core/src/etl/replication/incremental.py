"""An incremental copy: a table copied in key-ordered chunks while its changes stream.

Each chunk is read in a short transaction of its own (``copy_chunk``), on a copy thread launched between two
transactions of the stream, and written as upserts at that point of the stream (the table's changes after it wait for
the chunk: ``etl.replication.chunked_copy``). Until a key is copied, the stream's changes to it are dropped: the chunk
that copies the key reads it later, so it holds them. From then on they are applied as any others. The one exception is
a transaction the stream already delivered but that the chunk's snapshot saw not completed (its commit was in the WAL,
but not yet visible: a synchronous standby's acknowledgement pending, say): its changes would be in neither. The chunk's
snapshot tells the transactions it saw not completed (those in its ``xip``, and every one at or above its ``xmax``:
``XidSnapshot``); when one of them was streamed between the last chunk and this one's launch, the chunk is read again
later (``IncrementalCopy.misses``). A transaction streamed before the copy began is covered by waiting, before the first
chunk, until the transactions running when the copy began have ended (``barrier``: the snapshot's ``xip`` and the
transactions ``pg_stat_activity`` and ``pg_prepared_xacts`` show at or above its ``xmax``, which a snapshot cannot
list).

The key is the table's replica identity key, of any columns and types (``incremental_key``), chunked in the order of
its index. Whether a streamed change's key is copied yet is asked of ``KeyOrder``: the source compares it with the
last key copied (``etl.postgres.key_order``: under the columns' collations), but for a one-column integer key, whose
order is the same in Arrow (``IntegerKeyOrder``). An update that moves a row from a copied key to one not yet
copied becomes a delete of the copied key (the new key's chunk brings the row).

A run can die after its destination made a chunk durable and before the store recorded the chunk's last key. The
next run reads that chunk again, but the destination may still hold rows of it that the source has deleted, or moved
to another key, since: the stream's deletes of keys not yet copied are dropped, and the new read leaves those keys
out. So before each chunk is written, the last key it holds is recorded (``upto``): up to that key, until the chunks
reach it, the stream's changes are applied as deletes of their key, and the chunk read later brings the row back if
the source still holds it.

A backfill (``etl resync --where``) runs the same chunks over the rows a predicate picks, into a table that is
already whole: it leaves none of the stream's changes out, and its chunks are placed in the stream as a copy's
are, so a change committed after a chunk's read is applied after the chunk. This module is sans-IO.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.events import (
    COMMIT_LSN_COLUMN,
    MISSING_COLUMN,
    OLD_COLUMN,
    OLD_IS_KEY_COLUMN,
    OP_COLUMN,
    TX_ORDINAL_COLUMN,
    DeleteEvent,
    Event,
    EventBatch,
    InsertEvent,
    TableChanges,
    TruncateEvent,
    UpdateEvent,
)
from etl.key_sql import KeyValue, key_column_gone, parse_key
from etl.lsn import Lsn
from etl.postgres.codecs import python_values
from etl.postgres.xid_snapshot import XidSnapshot
from etl.replication.segment import change_schema
from etl.schema import TableId, TableSchema

if TYPE_CHECKING:
    from etl.postgres.copy_session import ChunkKey

CHUNK_ORDINAL_BASE: Final = 1 << 40
"""Chunk rows sit after every change of the transaction the stream was at, whose ordinals count from 0."""


def table_key(schema: TableSchema) -> ChunkKey:
    """The table's key as a copy records it (``ChunkKey``): a copy whose table's key is another by the time a chunk
    is read (another column, or another type) starts again; its chunks, and the stream's changes it leaves out,
    were of keys that may no longer be unique."""
    return tuple((c.name, c.type_oid) for c in schema.key_columns)


def incremental_key(schema: TableSchema, partitioned: bool) -> tuple[str, ...] | None:
    """The columns an incremental copy of the table orders by: its replica identity key (of any columns and types);
    ``None`` when it has none (or is published through its partition root), and a snapshot copy it gets instead."""
    keys = schema.key_columns
    if partitioned or not keys:
        return None
    return tuple(c.name for c in keys)


class KeyOrder(Protocol):
    """How a table's key orders, as the source orders it."""

    def at_most(self, keys: Sequence[pa.Array | pa.ChunkedArray], bound: KeyValue) -> np.ndarray:
        """Which rows of ``keys`` (one array per key column) are at most ``bound``; a row with a null: not."""
        ...

    def not_after(self, value: KeyValue, bound: KeyValue) -> bool:
        """Whether ``value`` is at most ``bound``."""
        ...


@dataclass(frozen=True)
class IntegerKeyOrder:
    """A one-column integer key's order (``key_sql.integer_key``), in Arrow: the same as the source's."""

    def at_most(self, keys: Sequence[pa.Array | pa.ChunkedArray], bound: KeyValue) -> np.ndarray:
        found: np.ndarray = pc.fill_null(pc.less_equal(keys[0], int(bound[0])), False).to_numpy(zero_copy_only=False)
        return found

    def not_after(self, value: KeyValue, bound: KeyValue) -> bool:
        return int(value[0]) <= int(bound[0])


DROP, KEEP, AS_DELETE, AS_UPDATE = 0, 1, 2, 3
"""What a copy does with each of the stream's changes to its table (``IncrementalCopy.filtered``)."""


@dataclass(frozen=True)
class ChunkMark:
    """Where a chunk's rows sit among the stream's changes: after every change up to ``position`` (the end of a
    transaction), numbered up to ``ordinal``. Destinations that skip what they applied before (by commit LSN and
    ordinal) take a chunk only after the marks of the chunks before it, so each chunk gets a mark past the last
    one's, recorded before it is written: a chunk written by a run that died before recording its key is read
    again by the next run, and must not be skipped as written before."""

    position: Lsn
    ordinal: int

    def next(self, stream_position: Lsn, rows: int) -> ChunkMark:
        """The mark of a chunk of ``rows`` rows written when the stream is at ``stream_position`` (the end of the
        last transaction received, or a keepalive's position), after this mark. It sits just before the stream's
        position: after every transaction received (each commits before its end), and before every one to come
        (each commits at or after it: the next commit record may start right where the last one ended)."""
        position = Lsn(stream_position - 1)
        if position > self.position:
            return ChunkMark(position, CHUNK_ORDINAL_BASE + rows - 1)
        return ChunkMark(self.position, self.ordinal + rows)

    def to_json(
        self,
        after: KeyValue | None,
        where: str | None = None,
        upto: KeyValue | None = None,
        read_before: Lsn = Lsn.ZERO,
        *,
        key: ChunkKey = (),
        note: str | None = None,
    ) -> str:
        return json.dumps(
            {
                "after": None if after is None else list(after),
                "position": str(self.position),
                "ordinal": self.ordinal,
                "where": where,
                "upto": None if upto is None else list(upto),
                "read_before": str(read_before),
                "key": [list(column) for column in key],
                "note": note,
            }
        )

    @staticmethod
    def noted(text: str, note: str) -> str:
        """What ``to_json`` wrote, with ``note``."""
        return json.dumps(json.loads(text) | {"note": note})

    @classmethod
    def from_json(cls, text: str) -> Recorded:
        """What ``to_json`` wrote (by this release or an earlier one)."""
        obj = json.loads(text)
        mark = cls(Lsn.parse(obj["position"]), int(obj["ordinal"]))
        read_before = Lsn.parse(obj.get("read_before") or "0/0")
        key = tuple((str(name), int(type_oid)) for name, type_oid in obj.get("key") or ())
        after, upto = (None if obj.get(name) is None else parse_key(obj[name]) for name in ("after", "upto"))
        return Recorded(after, mark, obj.get("where"), upto, read_before, key, obj.get("note"))


class Recorded(NamedTuple):
    """An incremental copy's position as the store holds it (``ChunkMark.to_json``); see ``IncrementalCopy``."""

    after: KeyValue | None
    mark: ChunkMark
    where: str | None
    upto: KeyValue | None
    read_before: Lsn
    key: ChunkKey = ()
    """The table's key the copy orders by (``table_key``); ``()``: not recorded (by an earlier release)."""
    note: str | None = None
    """What the copy waits for, or what became of it, for ``etl status``."""


NO_MARK: Final = ChunkMark(Lsn.ZERO, CHUNK_ORDINAL_BASE - 1)
NOTHING_RECORDED: Final = Recorded(None, NO_MARK, None, None, Lsn.ZERO)
"""The position of a copy before its first chunk."""


@dataclass
class IncrementalCopy:
    """One table's incremental copy as the apply worker drives it."""

    table_id: TableId
    key: tuple[str, ...]
    """The key's columns, in the order of its index (``etl.postgres.key_order.key_index_order``)."""
    table_key: ChunkKey
    """The table's key when the copy began (``table_key``); a chunk that finds another starts the copy again."""
    after: KeyValue | None
    """The last key copied; ``None`` before the first chunk."""
    rows: int
    """Rows copied so far, over every run."""
    mark: ChunkMark
    """The mark of the last chunk written (or about to be)."""
    barrier: frozenset[int] | None
    """The transactions (64-bit ids) running when this run took the copy on, of those not seen ended since; the first
    chunk waits until they have ended."""
    order: KeyOrder
    """How the key orders (the source's order)."""
    streamed: set[int] = field(default_factory=set)
    """Transactions the stream delivered since the last chunk read (``misses``)."""
    where: str | None = None
    """A backfill's predicate (``etl resync --where``): its chunks hold the rows it picks, upserted into a table
    that holds every row already, so none of the stream's changes is left out."""
    estimate: int | None = None
    """Rows the copy is expected to take, as recorded when it began (for ``etl status``)."""
    started_at: datetime | None = None
    """When the copy began, over every run; ``None``: now."""
    upto: KeyValue | None = None
    """The last key a chunk written, or about to be, may have put into the destination (see the module); keys after
    ``after`` up to it are neither copied nor surely absent there."""
    read_before: Lsn = Lsn.ZERO
    """A WAL position past the commit of every transaction the last chunk's snapshot saw committed: the stream's
    inserts committed before it may be of rows a chunk holds already, so they go to the destination as updates
    (see the module)."""
    finished: bool = False
    """The last chunk is written: every key is copied, and the copy ends once the stream is past ``read_before``."""
    note: str | None = None
    """What the copy waits for, or what became of it, recorded with its position for ``etl status``
    (``Recorded.note``)."""
    failed: bool = False
    """A backfill's chunk failed: it is dropped (``finished``), and the table streams on."""

    def misses(self, snapshot: XidSnapshot) -> bool:
        """Whether a chunk read in ``snapshot`` misses a streamed transaction (see the module). Forgets the
        transactions it saw ended: every later snapshot sees them too."""
        missed = {xid for xid in self.streamed if snapshot.saw_running(xid)}
        self.streamed = missed
        return bool(missed)

    @property
    def adds_new_keys(self) -> bool:
        """Whether the next chunk's keys are surely absent from the destination: a copy's, with no key after
        ``after`` that a run which died may have written (``upto``)."""
        return self.where is None and self._upto == self.after

    def will_write(self, last: KeyValue | None) -> None:
        """Before a chunk whose last key is ``last`` (``None``: an empty one) is written and recorded as written:
        ``upto`` at least that key."""
        if last is not None and (self.upto is None or self.order.not_after(self.upto, last)):
            self.upto = last

    # -- the stream's changes ----------------------------------------------------------------------------------
    def filtered(self, batch: EventBatch) -> EventBatch:
        """``batch`` without the changes to keys not copied yet (updates from a copied key to one not yet copied
        become deletes of the copied key), in its Arrow changes and its events alike; a backfill's all of it. The
        events take what the Arrow changes decided, row for row (``DROP`` ... ``AS_UPDATE``)."""
        segments = batch.changes.get(self.table_id)
        if not segments:
            return batch
        changes = dict(batch.changes)
        decided = [self._decide(s) for s in segments]
        changes[self.table_id] = [_filtered_segment(s, d) for s, d in zip(segments, decided, strict=True)]
        decisions = np.concatenate(decided)
        source, table_id = batch.events, self.table_id

        def events() -> Iterator[Event]:
            row = 0
            for event in source():
                if isinstance(event, TruncateEvent) and table_id in event.table_ids:
                    row += 1  # its row in the table's changes: kept
                elif isinstance(event, InsertEvent | UpdateEvent | DeleteEvent) and event.table_id == table_id:
                    decision, row = decisions[row], row + 1
                    if decision != DROP:
                        yield _decided_event(event, decision)
                    continue
                yield event

        return replace(batch, changes=changes, _events=events)

    def _key_columns(self, schema: TableSchema) -> None:
        """A ``TableError`` when a schema change took a key column away (renamed or dropped): the copy cannot tell
        copied keys from others any more, and starts again."""
        names = schema.column_names
        missing = [k for k in self.key if k not in names]
        if missing:
            gone = f"{schema.name}: its key column {missing[0]} was renamed or dropped during its incremental copy"
            raise key_column_gone(self.table_id, gone)

    def _decide(self, segment: TableChanges) -> np.ndarray:
        """What becomes of each change of ``segment`` (``DROP`` ... ``AS_UPDATE``)."""
        self._key_columns(segment.schema)
        table = segment.table
        old = table.column(OLD_COLUMN)
        keys = [table.column(k) for k in self.key]
        old_keys = [pc.struct_field(old, k) for k in self.key]
        no_old = pc.is_null(old).to_numpy(zero_copy_only=False)
        new = self._at_most(keys, self.after)
        upto = self._upto
        own = new if upto == self.after else self._at_most(keys, upto)
        moved = self._at_most(old_keys, upto) if not no_old.all() else np.zeros(len(no_old), np.bool_)
        # A change to a key not copied yet whose old key is copied, or may be in the destination, is a delete there.
        as_deletes = ~new & np.where(no_old, own, moved)
        op = table.column(OP_COLUMN)
        truncates = pc.equal(op, "T").to_numpy(zero_copy_only=False)
        seen = pc.less(table.column(COMMIT_LSN_COLUMN), int(self.read_before)).to_numpy(zero_copy_only=False)
        inserts = pc.equal(op, "I").to_numpy(zero_copy_only=False)
        decisions = np.full(table.num_rows, DROP, np.int8)
        decisions[truncates | new] = KEEP
        decisions[new & seen & inserts] = AS_UPDATE  # the insert of a row a chunk may hold
        decisions[as_deletes] = AS_DELETE
        return decisions

    @property
    def _upto(self) -> KeyValue | None:
        """The last key that may be in the destination: ``upto`` until the chunks pass it, then ``after``."""
        if self.upto is None or self.after is None:
            return self.after if self.upto is None else self.upto
        return self.after if self.order.not_after(self.upto, self.after) else self.upto

    def _at_most(self, keys: Sequence[pa.Array | pa.ChunkedArray], last: KeyValue | None) -> np.ndarray:
        """Which of ``keys`` are at most ``last`` (``None``: none are; a null key, as in a truncate's row: no); of a
        backfill's, or a finished copy's, every key."""
        if self.where is not None or self.finished:
            every = np.ones(len(keys[0]), np.bool_)
            for column in keys:
                every &= pc.is_valid(column).to_numpy(zero_copy_only=False)
            return every
        if last is None:
            return np.zeros(len(keys[0]), np.bool_)
        return self.order.at_most(keys, last)

    # -- a chunk as a batch ------------------------------------------------------------------------------------
    def chunk_batch(self, schema: TableSchema, rows: pa.Table, mark: ChunkMark, now: datetime) -> EventBatch:
        """A chunk's rows as inserts (destinations apply them as upserts) at ``mark``, after every change of the
        stream before it; those of keys up to ``upto``, which a run that died may have written, as updates (a
        destination may take an insert's key for new). Built before ``will_write``. The batch commits nothing:
        it moves no progress."""
        n = rows.num_rows
        position, first = mark.position, mark.ordinal - n + 1
        upto = self._upto
        if self.where is None and upto == self.after:  # no key of it was written before
            written = np.zeros(n, np.bool_)
        else:  # of a backfill's: all
            written = self._at_most([rows.column(k) for k in self.key], upto)
        table = rows.append_column(OP_COLUMN, pa.array(np.where(written, "U", "I"), pa.string()))
        table = table.append_column(COMMIT_LSN_COLUMN, pa.array(np.full(n, int(position), np.uint64)))
        ordinals = np.arange(first, first + n, dtype=np.int64)
        table = table.append_column(TX_ORDINAL_COLUMN, pa.array(ordinals))
        types = change_schema(schema)
        table = table.append_column(MISSING_COLUMN, pa.nulls(n, types.field(MISSING_COLUMN).type))
        table = table.append_column(OLD_COLUMN, pa.nulls(n, types.field(OLD_COLUMN).type))
        table = table.append_column(OLD_IS_KEY_COLUMN, pa.nulls(n, pa.bool_())).cast(types)
        return EventBatch(
            {self.table_id: [TableChanges(schema, table)]},
            _rows(self.table_id, rows, written, position, first),
            commit_timestamps={int(position): now},
        )


def _rows(
    table_id: TableId, rows: pa.Table, written: np.ndarray, position: Lsn, first: int
) -> Callable[[], Iterator[Event]]:
    def events() -> Iterator[Event]:
        columns = [python_values(rows.column(i)) for i in range(rows.num_columns)]
        for ordinal, (row, update) in enumerate(zip(zip(*columns, strict=True), written, strict=True), first):
            if update:
                yield UpdateEvent(position, position, ordinal, table_id, tuple(row), None, False)
            else:
                yield InsertEvent(position, position, ordinal, table_id, tuple(row))

    return events


def _filtered_segment(segment: TableChanges, decisions: np.ndarray) -> TableChanges:
    """``segment`` as ``decisions`` say (``IncrementalCopy._decide``)."""
    table = segment.table
    as_deletes = decisions == AS_DELETE
    if as_deletes.any():
        table = _as_deletes(table, pa.array(as_deletes))
    as_updates = decisions == AS_UPDATE
    if as_updates.any():
        op = table.column_names.index(OP_COLUMN)
        table = table.set_column(op, OP_COLUMN, pc.if_else(pa.array(as_updates), "U", table.column(OP_COLUMN)))
    return TableChanges(segment.schema, table.filter(pa.array(decisions != DROP)))


def _decided_event(event: InsertEvent | UpdateEvent | DeleteEvent, decision: int) -> Event:
    """``event`` as ``decision`` says (not ``DROP``), as ``_filtered_segment`` makes its row."""
    if decision == KEEP:
        return event
    if decision == AS_UPDATE:
        assert isinstance(event, InsertEvent)
        return UpdateEvent(event.start_lsn, event.commit_lsn, event.tx_ordinal, event.table_id, event.row, None, False)
    row = event.old_row if isinstance(event, DeleteEvent) else event.row
    old, old_is_key = row, True  # a row's own key identifies it; its other values may be MISSING
    if isinstance(event, UpdateEvent) and event.old_row is not None:
        old, old_is_key = event.old_row, event.old_is_key
    elif isinstance(event, DeleteEvent):
        old_is_key = event.old_is_key
    return DeleteEvent(event.start_lsn, event.commit_lsn, event.tx_ordinal, event.table_id, old, old_is_key)


def _as_deletes(table: pa.Table, rows: pa.Array) -> pa.Table:
    """``table`` with the changes at ``rows`` turned into deletes of their old row (``_etl_old``), or of their own
    row, by its key, where they have none (an insert, an update that kept its key; a delete stays as it is)."""
    old = table.column(OLD_COLUMN)
    from_old = pc.and_(rows, pc.is_valid(old))
    by_key = pc.and_(pc.and_(rows, pc.is_null(old)), pc.not_equal(table.column(OP_COLUMN), "D"))
    columns = []
    for name in table.column_names:
        column = table.column(name)
        if name == OP_COLUMN:
            column = pc.if_else(rows, pa.scalar("D"), column)
        elif name in (OLD_COLUMN, MISSING_COLUMN):
            column = pc.if_else(rows, pa.scalar(None, column.type), column)
        elif name == OLD_IS_KEY_COLUMN:
            column = pc.if_else(by_key, pa.scalar(True), column)
        elif name not in (COMMIT_LSN_COLUMN, TX_ORDINAL_COLUMN):
            column = pc.if_else(from_old, pc.struct_field(old, name), column)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=table.schema)
