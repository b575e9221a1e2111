"""An incremental copy: a table copied in key-ordered chunks while its changes stream.

The apply worker reads each chunk in a short transaction of its own (``copy_chunk``) between two transactions of
the stream, and writes it as upserts at that point of the stream. Until a key is copied, the stream's changes to it
are dropped: the chunk that copies the key reads it later, so it holds them. From then on they are applied as any
others. The one exception is a transaction the stream already delivered but that the chunk's snapshot saw not
completed (its commit was in the WAL, but not yet visible: a synchronous standby's acknowledgement pending, say): its
changes would be in neither. The chunk's snapshot tells the transactions it saw not completed (those in its ``xip``,
and every one at or above its ``xmax``: ``XidSnapshot``); when one of them was streamed since the last chunk, the
chunk is read again later (``IncrementalCopy.misses``). A transaction streamed before the copy began is covered by
waiting, before the first chunk, until the transactions running when the copy began have ended (``barrier``: the
snapshot's ``xip`` and the transactions ``pg_stat_activity`` and ``pg_prepared_xacts`` show at or above its
``xmax``, which a snapshot cannot list).

The key is one integer column (``incremental_key``): its order in Postgres and in Arrow is the same, so the stream's
changes are compared with the last key copied in Arrow. An update that moves a row from a copied key to one not
yet copied becomes a delete of the copied key (the new key's chunk brings the row).

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.errors import TableError
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
    RelationEvent,
    TableChanges,
    UpdateEvent,
)
from etl.lsn import Lsn
from etl.postgres.codecs import python_values
from etl.postgres.xid_snapshot import XidSnapshot
from etl.replication.segment import change_schema
from etl.schema import TableId, TableSchema

if TYPE_CHECKING:
    from etl.postgres.copy_session import ChunkKey

INTEGER_KEY_TYPES: Final = frozenset({20, 21, 23})
"""int8, int2 and int4: the key types an incremental copy orders by."""
CHUNK_ORDINAL_BASE: Final = 1 << 40
"""Chunk rows sit after every change of the transaction the stream was at, whose ordinals count from 0."""


def table_key(schema: TableSchema) -> ChunkKey:
    """The table's key as a copy records it (``ChunkKey``): a copy whose table's key is another by the time a chunk
    is read (another column, or another type) starts again; its chunks, and the stream's changes it leaves out,
    were of keys that may no longer be unique."""
    return tuple((c.name, c.type_oid) for c in schema.key_columns)


def incremental_key(schema: TableSchema, partitioned: bool) -> str | None:
    """The column an incremental copy of the table orders by: its one-column integer key; ``None`` when it has
    none (or is published through its partition root), and a snapshot copy it gets instead."""
    keys = schema.key_columns
    if partitioned or len(keys) != 1 or keys[0].type_oid not in INTEGER_KEY_TYPES:
        return None
    return keys[0].name


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
        after: int | None,
        where: str | None = None,
        upto: int | None = None,
        read_before: Lsn = Lsn.ZERO,
        *,
        key: ChunkKey = (),
        note: str | None = None,
    ) -> str:
        return json.dumps(
            {
                "after": after,
                "position": str(self.position),
                "ordinal": self.ordinal,
                "where": where,
                "upto": upto,
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
        return Recorded(obj["after"], mark, obj.get("where"), obj.get("upto"), read_before, key, obj.get("note"))


class Recorded(NamedTuple):
    """An incremental copy's position as the store holds it (``ChunkMark.to_json``); see ``IncrementalCopy``."""

    after: int | None
    mark: ChunkMark
    where: str | None
    upto: int | None
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
    key: str
    table_key: ChunkKey
    """The table's key when the copy began (``table_key``); a chunk that finds another starts the copy again."""
    after: int | None
    """The last key copied; ``None`` before the first chunk."""
    rows: int
    """Rows copied so far, over every run."""
    mark: ChunkMark
    """The mark of the last chunk written (or about to be)."""
    barrier: frozenset[int] | None
    """The transactions (64-bit ids) running when this run took the copy on, of those not seen ended since; the first
    chunk waits until they have ended."""
    streamed: set[int] = field(default_factory=set)
    """Transactions the stream delivered since the last chunk read (``misses``)."""
    where: str | None = None
    """A backfill's predicate (``etl resync --where``): its chunks hold the rows it picks, upserted into a table
    that holds every row already, so none of the stream's changes is left out."""
    estimate: int | None = None
    """Rows the copy is expected to take, as recorded when it began (for ``etl status``)."""
    started_at: datetime | None = None
    """When the copy began, over every run; ``None``: now."""
    upto: int | None = None
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

    def will_write(self, last: int | None) -> None:
        """Before a chunk whose last key is ``last`` (``None``: an empty one) is written and recorded as written:
        ``upto`` at least that key."""
        if last is not None:
            self.upto = last if self.upto is None else max(self.upto, last)

    def chunk_after(self, rows: pa.Table) -> int | None:
        """The last key of a chunk's rows (they are in key order); ``after`` for an empty chunk."""
        return int(rows.column(self.key)[-1].as_py()) if rows.num_rows else self.after

    # -- the stream's changes ----------------------------------------------------------------------------------
    def filtered(self, batch: EventBatch) -> EventBatch:
        """``batch`` without the changes to keys not copied yet (updates from a copied key to one not yet copied
        become deletes of the copied key), in its Arrow changes and its events alike; a backfill's all of it."""
        segments = batch.changes.get(self.table_id)
        if not segments:
            return batch
        changes = dict(batch.changes)
        changes[self.table_id] = [self._filtered_segment(s) for s in segments]
        source = batch.events
        first = self._key_index(segments[0].schema)

        def events() -> Iterator[Event]:
            index = first
            for event in source():
                if isinstance(event, RelationEvent) and event.schema.id == self.table_id:
                    index = self._key_index(event.schema)  # the key's place in the rows that follow
                kept = self._filtered_event(event, index)
                if kept is not None:
                    yield kept

        return replace(batch, changes=changes, _events=events)

    def _key_index(self, schema: TableSchema) -> int:
        """The key column's place in ``schema``; a ``TableError`` when a schema change took it away (renamed or
        dropped): the copy cannot tell copied keys from others any more, and starts again."""
        names = schema.column_names
        if self.key not in names:
            raise TableError(
                f"{schema.name}: its key column {self.key} was renamed or dropped during its incremental copy",
                hint="the table is copied again from its first row",
                table_id=self.table_id,
                transient=True,
            )
        return names.index(self.key)

    def _filtered_segment(self, segment: TableChanges) -> TableChanges:
        table = segment.table
        self._key_index(segment.schema)
        keys, old_keys = table.column(self.key), pc.struct_field(table.column(OLD_COLUMN), self.key)
        no_old = pc.is_null(old_keys).to_numpy(zero_copy_only=False)
        new = self._at_most(keys, self.after)
        old = np.where(no_old, self._at_most(keys, self._upto), self._at_most(old_keys, self._upto))
        # A change to a key not copied yet whose old key is copied, or may be in the destination, is a delete there.
        as_deletes = ~new & old
        op = table.column(OP_COLUMN)
        keep = pc.equal(op, "T").to_numpy(zero_copy_only=False) | new | as_deletes
        if as_deletes.any():
            table = _as_deletes(table, pa.array(as_deletes))
        seen = pc.less(table.column(COMMIT_LSN_COLUMN), int(self.read_before)).to_numpy(zero_copy_only=False)
        upserts = seen & pc.equal(table.column(OP_COLUMN), "I").to_numpy(zero_copy_only=False) & keep
        if upserts.any():  # the insert of a row a chunk may hold
            table = table.set_column(
                table.column_names.index(OP_COLUMN),
                OP_COLUMN,
                pc.if_else(pa.array(upserts), "U", table.column(OP_COLUMN)),
            )
        return TableChanges(segment.schema, table.filter(pa.array(keep)))

    @property
    def _upto(self) -> int | None:
        """The last key that may be in the destination: ``upto`` until the chunks pass it, then ``after``."""
        known = [key for key in (self.after, self.upto) if key is not None]
        return max(known) if known else None

    def _at_most(self, keys: pa.ChunkedArray | pa.Array, last: int | None) -> np.ndarray:
        """Which of ``keys`` are at most ``last`` (``None``: none are; a null key, as in a truncate's row: no); of a
        backfill's, or a finished copy's, every key."""
        if self.where is not None or self.finished:
            every: np.ndarray = pc.is_valid(keys).to_numpy(zero_copy_only=False)
            return every
        if last is None:
            return np.zeros(len(keys), np.bool_)
        at_most: np.ndarray = pc.fill_null(pc.less_equal(keys, last), False).to_numpy(zero_copy_only=False)
        return at_most

    def _filtered_event(self, event: Event, index: int) -> Event | None:
        if not isinstance(event, InsertEvent | UpdateEvent | DeleteEvent) or event.table_id != self.table_id:
            return event
        row = event.old_row if isinstance(event, DeleteEvent) else event.row
        if self._is_at_most(row[index], self.after):
            if isinstance(event, InsertEvent) and event.commit_lsn < self.read_before:  # as in _filtered_segment
                return UpdateEvent(event.start_lsn, event.commit_lsn, event.tx_ordinal, self.table_id, row, None, False)
            return event
        old, old_is_key = row, True  # a row's own key identifies it; its other values may be MISSING
        if isinstance(event, UpdateEvent) and event.old_row is not None:
            old, old_is_key = event.old_row, event.old_is_key
        elif isinstance(event, DeleteEvent):
            old_is_key = event.old_is_key
        if not self._is_at_most(old[index], self._upto):
            return None
        return DeleteEvent(event.start_lsn, event.commit_lsn, event.tx_ordinal, self.table_id, old, old_is_key)

    def _is_at_most(self, key: object, last: int | None) -> bool:
        if self.where is not None or self.finished:
            return isinstance(key, int)
        return last is not None and isinstance(key, int) and key <= last

    # -- a chunk as a batch ------------------------------------------------------------------------------------
    def chunk_batch(self, schema: TableSchema, rows: pa.Table, mark: ChunkMark, now: datetime) -> EventBatch:
        """A chunk's rows as inserts (destinations apply them as upserts) at ``mark``, after every change of the
        stream before it; those of keys up to ``upto``, which a run that died may have written, as updates (a
        destination may take an insert's key for new). Built before ``will_write``. The batch commits nothing:
        it moves no progress."""
        n = rows.num_rows
        position, first = mark.position, mark.ordinal - n + 1
        written = self._at_most(rows.column(self.key), self._upto)  # of a backfill's: all
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
