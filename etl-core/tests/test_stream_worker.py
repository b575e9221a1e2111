"""The read loop (StreamWorker) against a real Postgres: bursts of received messages and where they end."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from etl.config import BatchSection
from etl.destination.base import WriteResult
from etl.destination.memory import MemoryDestination
from etl.errors import TableError
from etl.events import EventBatch
from etl.lsn import Lsn
from etl.postgres.frames import XLogData
from etl.postgres.replication import ReplicationConnection, choose_protocol
from etl.replication.schemas import SchemaTracker
from etl.replication.stream import StreamSettings, StreamWorker
from etl.replication.writer import BatchWriter
from etl.schema import TableId
from etl.store.memory import MemoryStore
from etl.testing.pipelines import wait_until
from etl.testing.pytest_plugin import TestDatabase


class CountingDestination(MemoryDestination):
    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.ends_in_transaction: list[bool] = []

    def write_events(self, batch: EventBatch) -> WriteResult:
        self.batches += 1
        self.ends_in_transaction.append(batch.ends_in_transaction)
        return super().write_events(batch)


class FirstTransactions(StreamWorker):
    """Applies every table and is finished after ``transactions`` commits (like a catch-up at its target)."""

    worker_key = "test"

    def __init__(
        self,
        conn: ReplicationConnection,
        protocol: int,
        transactions: int,
        batch: BatchSection,
        destination: CountingDestination | None = None,
    ) -> None:
        store = MemoryStore(1)
        self.destination = destination or CountingDestination()
        self.writer = BatchWriter(self.destination, store, self.worker_key, self._table_error)
        super().__init__(StreamSettings(protocol, batch, SchemaTracker(store), threading.Event()), conn, self.writer)
        self.transactions = transactions
        self.commits = 0

    def applies(self, table_id: TableId, final_lsn: Lsn) -> bool:
        return True

    def after_commit(self, end_lsn: Lsn) -> None:
        if end_lsn > self.idle_lsn:  # a commit; an idle keepalive comes with idle_lsn at its position
            self.commits += 1

    def finished(self) -> bool:
        return self.commits >= self.transactions

    def _table_error(self, table_id: TableId, error: TableError) -> None:
        raise error


def streaming(db: TestDatabase, statements: list[str]) -> tuple[ReplicationConnection, int]:
    """A replication connection whose slot saw ``statements`` (one transaction each) before streaming."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t")
    conn = ReplicationConnection.connect(db.connection())
    slot = conn.create_slot("s1")
    for statement in statements:
        db.execute(statement)
    protocol, streaming_on = choose_protocol(conn.server_version)
    conn.start_replication("s1", slot.consistent_point, ["pub"], protocol, streaming_on)
    return conn, protocol


def next_data(conn: ReplicationConnection, timeout: float = 10.0) -> XLogData:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = conn.read(0.5)
        if isinstance(message, XLogData):
            return message
    raise AssertionError("no XLogData in time")


@pytest.mark.alone  # times each poll
def test_poll_returns_received_messages_without_waiting(pg_database: TestDatabase) -> None:
    conn, _ = streaming(pg_database, ["INSERT INTO t VALUES (1, 'a')"])
    with conn:
        assert next_data(conn).payload[:1] == b"B"
        tags: list[bytes] = []
        deadline = time.monotonic() + 10
        while b"C" not in tags and time.monotonic() < deadline:
            started = time.monotonic()
            message = conn.poll()
            assert time.monotonic() - started < 0.5  # never waits for the server
            if message is None:
                time.sleep(0.01)
            elif isinstance(message, XLogData):
                tags.append(message.payload[:1])
        assert tags == [b"R", b"I", b"C"]
        while (message := conn.poll()) is not None:  # keepalives at most: no more data was sent
            assert not isinstance(message, XLogData)


def test_a_burst_stops_at_the_commit_that_finishes_the_worker(pg_database: TestDatabase) -> None:
    inserts = [f"INSERT INTO t VALUES ({i}, 'v{i}')" for i in range(1, 6)]
    conn, protocol = streaming(pg_database, inserts)
    with conn:
        worker = FirstTransactions(conn, protocol, 2, BatchSection())
        worker.run()
        assert sorted(r["id"] for r in worker.destination.rows("public.t")) == [1, 2]
        rest = next_data(conn)  # the third transaction is still to be read
        assert rest.payload[:1] == b"B"


def test_a_burst_ends_when_the_batch_is_full(pg_database: TestDatabase) -> None:
    conn, protocol = streaming(pg_database, ["INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 50) g"])
    with conn:
        # busy_max_bytes too: else the batch after the first grows while the first is written
        worker = FirstTransactions(conn, protocol, 1, BatchSection(max_bytes=2000, busy_max_bytes=2000))
        worker.run()
        rows = worker.destination.rows("public.t")
        assert sorted(r["id"] for r in rows) == list(range(1, 51))
        assert worker.destination.batches > 5  # a batch of about 2000 bytes at a time, not one for the burst
        # each batch but the last ends inside the transaction, and says so
        assert worker.destination.ends_in_transaction == [True] * (worker.destination.batches - 1) + [False]


class BrokenDestination(CountingDestination):
    def write_events(self, batch: EventBatch) -> WriteResult:
        raise RuntimeError("the destination broke")


def test_a_failed_write_stops_the_worker_without_waiting_for_another_batch(pg_database: TestDatabase) -> None:
    conn, protocol = streaming(pg_database, ["INSERT INTO t VALUES (1, 'a')"])
    with conn:
        batch = BatchSection(max_fill_ms=10)
        worker = FirstTransactions(conn, protocol, 2, batch, BrokenDestination())  # a second commit never comes
        failures: list[BaseException] = []

        def run() -> None:
            try:
                worker.run()
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=15)
        stopped_by_itself = not thread.is_alive()
        worker.stop.set()
        thread.join(timeout=15)
        assert stopped_by_itself
        assert [str(f) for f in failures] == ["the destination broke"]


class HeldDestination(CountingDestination):
    """Holds its first write until ``release`` is set; records the ids each write carried."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.written = threading.Event()
        self.ids: list[list[int]] = []

    def write_events(self, batch: EventBatch) -> WriteResult:
        self.ids.append(
            sorted(i for segments in batch.changes.values() for s in segments for i in s.table["id"].to_pylist())
        )
        self.written.set()
        if len(self.ids) == 1:
            assert self.release.wait(30)
        return super().write_events(batch)


def test_batches_due_while_a_write_runs_are_merged_into_the_next_write(pg_database: TestDatabase) -> None:
    conn, protocol = streaming(pg_database, ["INSERT INTO t VALUES (1, 'a')"])
    with conn:
        destination = HeldDestination()
        worker = FirstTransactions(conn, protocol, 6, BatchSection(max_fill_ms=20), destination)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            assert destination.written.wait(15)  # the first batch is being written, and held
            for i in range(2, 7):  # each transaction alone would be a batch, due 20 ms after it
                pg_database.execute(f"INSERT INTO t VALUES ({i}, 'v')")
                time.sleep(0.2)
            time.sleep(0.5)
        finally:
            destination.release.set()
            thread.join(timeout=15)
        assert not thread.is_alive()
        assert destination.ids == [[1], [2, 3, 4, 5, 6]]  # read while the first write ran, handed over as one


@pytest.mark.parametrize("streamed", [False, True], ids=["transaction", "streamed transaction"])
@pytest.mark.parametrize(("busy_max_bytes", "merged"), [(10_000_000, True), (2000, False)])
def test_a_batch_keeps_filling_past_max_bytes_while_a_write_runs(
    pg_database: TestDatabase, busy_max_bytes: int, merged: bool, streamed: bool
) -> None:
    if streamed:  # the server sends the transaction in chunks before its commit (protocol 2), replayed at it
        pg_database.execute(f"ALTER DATABASE {pg_database.name} SET logical_decoding_work_mem = '64kB'")
    conn, protocol = streaming(pg_database, ["INSERT INTO t VALUES (1, 'a')"])
    with conn:
        destination = HeldDestination()
        batch = BatchSection(max_bytes=2000, busy_max_bytes=busy_max_bytes)
        worker = FirstTransactions(conn, protocol, 2, batch, destination)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            assert destination.written.wait(15)  # the first batch is being written, and held
            # About 150 kB of changes (75 times max_bytes), above logical_decoding_work_mem.
            pg_database.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(100, 1599) g")
            if merged:
                wait_until(lambda: worker.commits >= 2, "all of it read while the first write is held", timeout=15)
        finally:
            destination.release.set()
            thread.join(timeout=15)
        assert not thread.is_alive()
        assert destination.ids[0] == [1]
        if merged:  # read while the first write ran, and handed over as one
            assert destination.ids[1:] == [list(range(100, 1600))]
        else:  # cut at max_bytes (checked every 512 inserts of a replay): reading paused until the write ended
            most = 530 if streamed else 25
            assert len(destination.ids) > 3 and max(len(ids) for ids in destination.ids[1:]) <= most
        assert sorted(i for ids in destination.ids for i in ids) == [1, *range(100, 1600)]


class PacedDestination(CountingDestination):
    """Asks for at least ``min_write_interval_s`` between the starts of two writes (``Paced``)."""

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.min_write_interval_s = interval
        self.started: list[float] = []

    def write_events(self, batch: EventBatch) -> WriteResult:
        self.started.append(time.monotonic())
        return super().write_events(batch)


def test_a_paced_destination_gets_merged_batches_at_its_interval_but_full_ones_at_once(
    pg_database: TestDatabase,
) -> None:
    conn, protocol = streaming(pg_database, ["INSERT INTO t VALUES (1, 'a')"])
    with conn:
        destination = PacedDestination(1.0)
        batch = BatchSection(max_fill_ms=20, max_bytes=2000, busy_max_bytes=2000)
        worker = FirstTransactions(conn, protocol, 13, batch, destination)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            for i in range(2, 12):  # ten transactions over two seconds, each due 20 ms after it
                time.sleep(0.2)
                pg_database.execute(f"INSERT INTO t VALUES ({i}, 'v')")
            paced = len(destination.started)
            # One transaction of twice max_bytes: its batches fill up and go without waiting.
            pg_database.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(100, 140) g")
            pg_database.execute("INSERT INTO t VALUES (999, 'last')")
        finally:
            thread.join(timeout=30)
        assert not thread.is_alive()
        gaps = [b - a for a, b in itertools.pairwise(destination.started[:paced])]
        assert 2 <= paced <= 4 and all(gap > 0.95 for gap in gaps)  # not one write per transaction
        full = [b - a for a, b in itertools.pairwise(destination.started[paced:-1])]  # the last: the final flush
        assert full and min(full) < 1.0  # full batches did not wait for the interval
        assert len(worker.destination.rows("public.t")) == 11 + 41 + 1
