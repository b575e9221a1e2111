"""The tables' activity a running pipeline records for ``etl status``: counts since the start, per table and kind,
and the last durable write; recorded at most once per interval, and once more when a writer closes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from etl.errors import TransientError
from etl.replication.activity import ActivityRecorder
from etl.schema import TableId
from etl.store.base import TableActivity
from etl.store.memory import MemoryStore


class Clock:
    """A stand-in for ``time.monotonic`` that the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def kinds(inserts: int = 0, updates: int = 0, deletes: int = 0, truncates: int = 0) -> dict[str, int]:
    return {"insert": inserts, "update": updates, "delete": deletes, "truncate": truncates}


T1, T2 = TableId(16384), TableId(16385)
AT = datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)


def test_counts_grow_from_the_start_and_reach_the_store_once_per_interval() -> None:
    store, clock = MemoryStore(1), Clock()
    recorder = ActivityRecorder(store, every_s=10, clock=clock)
    recorder.written({}, AT)  # a batch without changes (a schema change alone) starts no interval
    recorder.flush()  # nor does a writer closing with nothing to record
    recorder.written({T1: kinds(inserts=3)}, AT)
    first = store.get_table_activity()
    since = first[T1].since
    assert first == {T1: TableActivity(3, 0, 0, 0, since, AT)}
    clock.now += 1
    recorder.written({T1: kinds(updates=2, deletes=1), T2: kinds(truncates=1)}, AT + timedelta(seconds=1))
    assert store.get_table_activity() == first  # within the interval: not yet
    clock.now += 10
    recorder.written({T2: kinds(inserts=5)}, AT + timedelta(seconds=11))
    assert store.get_table_activity() == {
        T1: TableActivity(3, 2, 1, 0, since, AT + timedelta(seconds=1)),
        T2: TableActivity(5, 0, 0, 1, since, AT + timedelta(seconds=11)),
    }
    clock.now += 1
    recorder.written({T1: kinds(inserts=1)}, AT + timedelta(seconds=12))
    recorder.flush()  # a writer closes: what is pending is recorded
    assert store.get_table_activity()[T1] == TableActivity(4, 2, 1, 0, since, AT + timedelta(seconds=12))


class FlakyStore(MemoryStore):
    """A memory store whose next ``record_table_activity`` fails as a lost connection would."""

    fail_next = False

    def record_table_activity(self, activity: dict[TableId, TableActivity]) -> None:  # type: ignore[override]
        if self.fail_next:
            self.fail_next = False
            raise TransientError("connection lost")
        super().record_table_activity(activity)


def test_a_store_unreachable_for_a_moment_costs_one_record_not_the_counts() -> None:
    store, clock = FlakyStore(1), Clock()
    recorder = ActivityRecorder(store, every_s=10, clock=clock)
    store.fail_next = True
    recorder.written({T1: kinds(inserts=2)}, AT)
    assert store.get_table_activity() == {}
    clock.now += 10
    recorder.written({T2: kinds(deletes=1)}, AT)
    assert {t: (a.inserts, a.deletes) for t, a in store.get_table_activity().items()} == {T1: (2, 0), T2: (0, 1)}
