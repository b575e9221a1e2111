"""The sans-IO parts of an incremental copy: what a chunk's snapshot saw, which of the stream's changes a copy
leaves out (in a batch's Arrow changes and its events alike), and where chunk rows sit among the changes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etl.destination.memory import MemoryDestination
from etl.errors import TableError
from etl.events import (
    OLD_IS_KEY_COLUMN,
    OP_COLUMN,
    TX_ORDINAL_COLUMN,
    DeleteEvent,
    EventBatch,
    InsertEvent,
    UpdateEvent,
)
from etl.key_chunk import KeyChunk
from etl.key_sql import integer_key
from etl.lsn import Lsn
from etl.postgres.xid_snapshot import XidSnapshot, running_xids
from etl.replication.incremental import (
    CHUNK_ORDINAL_BASE,
    NO_MARK,
    ChunkMark,
    IncrementalCopy,
    IntegerKeyOrder,
    Recorded,
    incremental_key,
    table_key,
)
from etl.schema import ColumnSchema, TableName, TableSchema
from etl.testing.batches import BatchBuilder

BIG = TableSchema(7, TableName("public", "big"), (ColumnSchema("id", 20, primary_key=True), ColumnSchema("v", 25)))
KEY = table_key(BIG)
OTHER = TableSchema(8, TableName("public", "other"), (ColumnSchema("id", 23, primary_key=True),))
ORDER = IntegerKeyOrder()


def test_a_snapshot_tells_transactions_it_saw_running() -> None:
    snapshot = XidSnapshot.parse("4294967300:4294967310:4294967301,4294967305")
    assert snapshot.saw_running(5) and snapshot.saw_running(9)  # the stream's 32-bit ids of 2^32 + 5 and + 9
    assert not snapshot.saw_running(4) and not snapshot.saw_running(6)
    with pytest.raises(ValueError, match="not a pg_snapshot"):
        XidSnapshot.parse("10:x:")


def test_a_transaction_at_or_above_xmax_is_not_completed_across_wraparound() -> None:
    """A commit in the WAL but not yet visible (a synchronous standby's acknowledgement pending) that is the newest
    transaction is at ``xmax``, in no ``xip``: ``731:731:``. The stream's 32-bit ids match the snapshot's 64-bit
    ones around a wraparound of the low 32 bits, on either side of it."""
    newest = XidSnapshot.parse("731:731:")
    assert newest.saw_running(731) and newest.saw_running(735) and not newest.saw_running(730)
    epoch = 3 << 32
    wrapped = XidSnapshot.parse(f"{epoch - 5}:{epoch + 2}:{epoch - 5},{epoch - 1}")
    assert wrapped.full(2**32 - 1) == epoch - 1 and wrapped.full(1) == epoch + 1 and wrapped.full(5) == epoch + 5
    assert wrapped.saw_running(2**32 - 5) and wrapped.saw_running(2**32 - 1)  # in xip, before the wrap
    assert wrapped.saw_running(2) and wrapped.saw_running(3)  # at and above xmax, after it
    assert not wrapped.saw_running(2**32 - 3) and not wrapped.saw_running(1)  # completed, on both sides


def test_the_take_on_barrier_holds_until_every_transaction_running_at_it_has_ended() -> None:
    """The barrier: ``xip``, and the running transactions (``pg_stat_activity``) at or above ``xmax``, which the
    snapshot cannot list; a later snapshot at whose ``xmax`` such a transaction still runs has not seen it end."""
    taken = XidSnapshot.parse(f"{2**32 + 729}:{2**32 + 731}:{2**32 + 729}")
    barrier = running_xids(taken, [729, 731, 700])  # 700: not running, whatever a later look says
    assert barrier == {2**32 + 729, 2**32 + 731}
    assert XidSnapshot.parse(f"{2**32 + 731}:{2**32 + 731}:").still_running(barrier) == {2**32 + 731}
    assert XidSnapshot.parse(f"{2**32 + 731}:{2**32 + 740}:{2**32 + 731}").still_running(barrier) == {2**32 + 731}
    assert not XidSnapshot.parse(f"{2**32 + 732}:{2**32 + 740}:{2**32 + 735}").still_running(barrier)


def test_any_key_orders_a_copy_and_only_a_one_column_integer_one_orders_in_arrow() -> None:
    assert incremental_key(BIG, partitioned=False) == ("id",) and integer_key(BIG)
    assert incremental_key(BIG, partitioned=True) is None
    text_key = TableSchema(9, BIG.name, (ColumnSchema("k", 25, primary_key=True),))
    two = TableSchema(9, BIG.name, (ColumnSchema("a", 23, primary_key=True), ColumnSchema("b", 23, primary_key=True)))
    keyless = TableSchema(9, BIG.name, (ColumnSchema("a", 23),))
    assert incremental_key(text_key, partitioned=False) == ("k",) and not integer_key(text_key)
    assert incremental_key(two, partitioned=False) == ("a", "b") and not integer_key(two)
    assert incremental_key(keyless, partitioned=False) is None


def batch() -> EventBatch:
    b = BatchBuilder().commit()
    b.insert(BIG, {"id": 5, "v": "copied"}).insert(BIG, {"id": 50, "v": "not yet"})
    b.update(BIG, {"id": 6, "v": "copied"}).update(BIG, {"id": 60, "v": "not yet"})
    b.update(BIG, {"id": 70, "v": "moved out"}, old={"id": 7})  # from a copied key to one not yet copied
    b.update(BIG, {"id": 8, "v": "moved in"}, old={"id": 80})  # from a key not yet copied to a copied one
    b.delete(BIG, {"id": 9}).delete(BIG, {"id": 90}).truncate(BIG)
    return b.insert(OTHER, {"id": 500}).commit().build()


def summary(b: EventBatch, table: int) -> tuple[list[Any], list[Any]]:
    """The table's changes as (op, id) from the Arrow changes and from the events."""
    arrow = [
        (op, row_id)
        for segment in b.changes[table]
        for op, row_id in zip(
            segment.table.column(OP_COLUMN).to_pylist(), segment.table.column(0).to_pylist(), strict=True
        )
    ]
    events: list[Any] = []
    for event in b.events():
        if isinstance(event, InsertEvent) and event.table_id == table:
            events.append(("I", event.row[0]))
        elif isinstance(event, UpdateEvent) and event.table_id == table:
            events.append(("U", event.row[0]))
        elif isinstance(event, DeleteEvent) and event.table_id == table:
            events.append(("D", event.old_row[0]))
    return arrow, events


def test_changes_to_keys_not_copied_yet_are_left_out_alike_in_arrow_and_events() -> None:
    copy = IncrementalCopy(BIG.id, ("id",), KEY, after=("10",), rows=10, mark=NO_MARK, barrier=None, order=ORDER)
    arrow, events = summary(copy.filtered(batch()), BIG.id)
    kept = [("I", 5), ("U", 6), ("D", 7), ("U", 8), ("D", 9)]
    assert arrow == [*kept, ("T", None)]
    assert events == kept
    assert summary(copy.filtered(batch()), OTHER.id) == ([("I", 500)], [("I", 500)])  # other tables untouched
    before_any = IncrementalCopy(BIG.id, ("id",), KEY, after=None, rows=0, mark=NO_MARK, barrier=None, order=ORDER)
    assert summary(before_any.filtered(batch()), BIG.id) == ([("T", None)], [])


def test_changes_to_keys_a_chunk_may_have_written_are_deletes_until_the_chunks_reach_them() -> None:
    """Keys after the last one copied up to the last one a chunk may have written (``upto``: a run died between
    the chunk's write and its record): the destination may hold them, stale, so every change to them is a delete
    of its key there, alike in Arrow and events; a chunk read later brings back the rows the source still holds."""
    copy = IncrementalCopy(
        BIG.id, ("id",), KEY, after=("10",), rows=10, mark=NO_MARK, barrier=None, order=ORDER, upto=("60",)
    )
    arrow, events = summary(copy.filtered(batch()), BIG.id)
    kept = [("I", 5), ("D", 50), ("U", 6), ("D", 60), ("D", 7), ("U", 8), ("D", 9)]  # 70, 80 and 90: past upto
    assert arrow == [*kept, ("T", None)]
    assert events == kept
    table = copy.filtered(batch()).changes[BIG.id][0].table
    deleted = table.filter(pc.equal(table.column(OP_COLUMN), "D")).select(["id", OLD_IS_KEY_COLUMN])
    assert deleted.to_pylist() == [
        {"id": 50, OLD_IS_KEY_COLUMN: True},  # an insert's own key
        {"id": 60, OLD_IS_KEY_COLUMN: True},  # an update that kept its key
        {"id": 7, OLD_IS_KEY_COLUMN: True},  # the old key of an update that moved the row out
        {"id": 9, OLD_IS_KEY_COLUMN: True},
    ]
    rows = pa.table({"id": pa.array([11, 40, 60, 61], pa.int64()), "v": pa.array(["a", "b", "c", "d"])})
    chunk = copy.chunk_batch(BIG, rows, NO_MARK.next(Lsn(0x501), rows=4), datetime(2026, 1, 1, tzinfo=UTC))
    assert summary(chunk, BIG.id) == ([("U", 11), ("U", 40), ("U", 60), ("I", 61)],) * 2  # up to upto: upserts
    copy.will_write(("40",))
    assert copy.upto == ("60",)  # a chunk before upto leaves it
    copy.after = ("70",)
    assert summary(copy.filtered(batch()), BIG.id) == summary(
        IncrementalCopy(BIG.id, ("id",), KEY, after=("70",), rows=0, mark=NO_MARK, barrier=None, order=ORDER).filtered(
            batch()
        ),
        BIG.id,
    )  # the chunks passed it: the copy is an ordinary one again


def test_inserts_committed_before_the_last_chunks_read_are_upserts_until_the_copy_ends() -> None:
    """A transaction the last chunk's snapshot saw committed may reach the stream after the chunk: its inserts of
    copied keys are of rows the chunk holds, so they come as updates (a destination may take an insert's key for
    new); those committed after the read stay inserts. A finished copy has copied every key, and keeps this until
    the stream is past the read; a backfill alike."""
    b = BatchBuilder().commit()  # at 0x1100
    b.insert(BIG, {"id": 5, "v": "before"}).insert(BIG, {"id": 50, "v": "before, not copied"})
    b.commit().insert(BIG, {"id": 6, "v": "after"})  # at 0x1200
    batch = b.commit().build()
    copy = IncrementalCopy(
        BIG.id, ("id",), KEY, after=("10",), rows=10, mark=NO_MARK, barrier=None, order=ORDER, read_before=Lsn(0x1180)
    )
    assert summary(copy.filtered(batch), BIG.id) == ([("U", 5), ("I", 6)],) * 2
    copy.finished = True  # every key copied: 50 too
    assert summary(copy.filtered(batch), BIG.id) == ([("U", 5), ("U", 50), ("I", 6)],) * 2
    backfill = IncrementalCopy(
        BIG.id, ("id",), KEY, after=("10",), rows=10, mark=NO_MARK, barrier=None, order=ORDER, where="id > 0"
    )
    backfill.read_before = Lsn(0x1180)
    assert summary(backfill.filtered(batch), BIG.id) == ([("U", 5), ("U", 50), ("I", 6)],) * 2
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array(["a", "b"])})
    chunk = backfill.chunk_batch(BIG, rows, NO_MARK.next(Lsn(0x501), rows=2), datetime(2026, 1, 1, tzinfo=UTC))
    assert summary(chunk, BIG.id) == ([("U", 1), ("U", 2)],) * 2  # a backfill's rows replace the table's


def test_a_backfill_leaves_none_of_the_stream_out() -> None:
    """A backfill's table holds every row already: its changes all apply, whichever keys its chunks reached."""
    backfill = IncrementalCopy(
        BIG.id, ("id",), KEY, after=("10",), rows=10, mark=NO_MARK, barrier=None, order=ORDER, where="id < 100"
    )
    assert summary(backfill.filtered(batch()), BIG.id) == summary(batch(), BIG.id)
    assert len(summary(batch(), BIG.id)[0]) == 9  # the nine changes of the batch, none left out


def test_a_backfill_chunk_reads_the_rows_its_predicate_picks_after_the_last_key() -> None:
    chunk = KeyChunk(("id",), ("41",), 500, where="v LIKE 'a%' -- the owner's note")
    assert chunk.predicate() == "\"id\" OPERATOR(pg_catalog.>) '41' AND (\nv LIKE 'a%' -- the owner's note\n)"
    assert KeyChunk(("id",), None, 500, where="n = 1").predicate() == "(\nn = 1\n)"
    assert KeyChunk(("id",), None, 500).predicate() is None
    two = KeyChunk(("tenant", "id"), ("it's", "7"), 500, upto=("z", "1"))
    assert two.predicate() == (
        "ROW(\"tenant\", \"id\") OPERATOR(pg_catalog.>) ROW('it''s', '7')"
        " AND ROW(\"tenant\", \"id\") OPERATOR(pg_catalog.<=) ROW('z', '1')"
    )


def test_a_chunk_misses_a_transaction_streamed_that_its_snapshot_saw_running() -> None:
    copy = IncrementalCopy(BIG.id, ("id",), KEY, after=None, rows=0, mark=NO_MARK, barrier=None, order=ORDER)
    copy.streamed |= {100, 101}
    assert copy.misses(XidSnapshot.parse("99:110:101"))
    assert copy.streamed == {101}  # 100 ended: every later snapshot sees it
    assert not copy.misses(XidSnapshot.parse("102:110:"))
    assert copy.streamed == set()


def test_chunks_sit_after_the_changes_before_them_and_after_one_another() -> None:
    first = NO_MARK.next(Lsn(0x501), rows=3)  # the stream at 0x501: the last transaction ended there
    assert first == ChunkMark(Lsn(0x500), CHUNK_ORDINAL_BASE + 2)
    idle = first.next(Lsn(0x501), rows=2)  # no transaction came in between
    assert idle == ChunkMark(Lsn(0x500), CHUNK_ORDINAL_BASE + 4)
    assert idle.next(Lsn(0x401), rows=1) == ChunkMark(Lsn(0x500), CHUNK_ORDINAL_BASE + 5)  # a run that resumed behind
    assert ChunkMark.from_json(idle.to_json(after=("42",))) == Recorded(("42",), idle, None, None, Lsn.ZERO)
    backfill = idle.to_json(after=("42",), where="v LIKE '%\"'")
    assert ChunkMark.from_json(backfill) == Recorded(("42",), idle, "v LIKE '%\"'", None, Lsn.ZERO)
    recorded = idle.to_json(after=("a", "42"), upto=("b", "-7"), read_before=Lsn(0x900), key=KEY, note="waits")
    expected = Recorded(("a", "42"), idle, None, ("b", "-7"), Lsn(0x900), (("id", 20),), "waits")
    assert ChunkMark.from_json(recorded) == expected
    # an earlier release's, of an integer key
    earlier = json.dumps({"after": 42, "position": "0/500", "ordinal": idle.ordinal, "upto": 50})
    assert ChunkMark.from_json(earlier) == Recorded(("42",), idle, None, ("50",), Lsn.ZERO)
    copy = IncrementalCopy(BIG.id, ("id",), KEY, after=None, rows=0, mark=idle, barrier=None, order=ORDER)
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array(["a", "b"])})
    chunk = copy.chunk_batch(BIG, rows, idle, datetime(2026, 1, 1, tzinfo=UTC))
    ordinals = chunk.changes[BIG.id][0].table.column(TX_ORDINAL_COLUMN).to_pylist()
    assert ordinals == [CHUNK_ORDINAL_BASE + 3, CHUNK_ORDINAL_BASE + 4]
    assert [(e.commit_lsn, e.tx_ordinal, e.row) for e in chunk.events() if isinstance(e, InsertEvent)] == [
        (Lsn(0x500), CHUNK_ORDINAL_BASE + 3, (1, "a")),
        (Lsn(0x500), CHUNK_ORDINAL_BASE + 4, (2, "b")),
    ]
    assert chunk.last_commit_lsn == Lsn.ZERO  # no progress moves with a chunk


def test_the_next_transaction_after_a_chunk_is_applied_though_it_commits_where_the_last_one_ended() -> None:
    """A destination that skips what it applied before (by commit position and ordinal) takes the change of the
    transaction whose commit record starts right where the one before the chunk ended."""
    destination = MemoryDestination()
    destination.write_table_rows(BIG, pa.table({"id": pa.array([], pa.int64()), "v": pa.array([], pa.string())}))
    ended = Lsn(0x1101)  # the end of the last transaction received
    copy = IncrementalCopy(
        BIG.id, ("id",), KEY, after=None, rows=0, mark=NO_MARK.next(ended, rows=1), barrier=None, order=ORDER
    )
    rows = pa.table({"id": pa.array([1], pa.int64()), "v": pa.array(["copied"])})
    destination.write_events(copy.chunk_batch(BIG, rows, copy.mark, datetime(2026, 1, 1, tzinfo=UTC)))
    b = BatchBuilder(lsn=int(ended) - 0x100)  # its next transaction commits at exactly 0x1101
    destination.write_events(b.commit().update(BIG, {"id": 1, "v": "changed after"}).commit().build())
    assert destination.rows("public.big") == [{"id": 1, "v": "changed after"}]


def test_a_key_column_renamed_during_the_copy_starts_it_again() -> None:
    """A batch whose table lost a key column (renamed, say): the copy cannot tell copied keys from others, and the
    table errors with a transient error, to be copied again from its first row."""
    renamed = TableSchema(BIG.id, BIG.name, (ColumnSchema("ident", 20, primary_key=True), ColumnSchema("v", 25)))
    b = BatchBuilder().commit().insert(renamed, {"ident": 5, "v": "renamed"}).commit().build()
    copy = IncrementalCopy(BIG.id, ("id",), KEY, after=("10",), rows=10, mark=NO_MARK, barrier=None, order=ORDER)
    with pytest.raises(TableError, match="its key column id was renamed or dropped") as raised:
        copy.filtered(b)
    assert raised.value.transient and raised.value.table_id == BIG.id
    assert "copied again from its first row" in (raised.value.hint or "")
