"""The initial copy against a frozen server (every server process SIGSTOPped): a stop request and the read
timeout end it promptly, instead of waiting for the server to come back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from etl.copy_plan import CopyPlan, CopyRange, CopyStopped
from etl.errors import TransientError
from etl.postgres.catalog import PublishedTable, publication_tables, table_schema
from etl.postgres.connection import connect
from etl.postgres.copy import copy_table, read_ranges
from etl.postgres.copy_session import Unblock
from etl.schema import TableSchema
from etl.testing.pytest_plugin import TestDatabase

ROWS = 300_000  # ~45 MB of CSV: more than the socket buffers hold, so a frozen server stalls the copy


@pytest.fixture
def big(pg_database: TestDatabase) -> tuple[PublishedTable, TableSchema]:
    pg_database.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
    pg_database.execute(f"INSERT INTO big SELECT i, repeat('x', 140) FROM generate_series(1, {ROWS}) i")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE big")
    with connect(pg_database.connection()) as conn:
        (table,) = publication_tables(conn, "pub")
        return table, table_schema(conn, table.id, table.column_list)


def copy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("copy-")]


def drain(batches: Iterator[object]) -> None:
    for _ in batches:
        pass


@pytest.mark.parametrize("connections", [1, 3])
def test_stop_ends_a_copy_stalled_on_a_frozen_server(
    pg_database: TestDatabase, big: tuple[PublishedTable, TableSchema], connections: int
) -> None:
    table, schema = big
    stop = threading.Event()
    batches = copy_table(pg_database.connection(), schema, table, None, connections, batch_rows=1000, stop=stop)
    next(batches)  # the copy runs
    with pg_database.cluster.frozen():
        stop.set()
        asked = time.monotonic()
        with pytest.raises(CopyStopped):
            drain(batches)  # what the socket buffers still hold, then the stop
        assert time.monotonic() - asked < 10, "the copy waited for the frozen server instead of stopping"
        assert not copy_threads()


def test_a_silent_server_is_a_lost_connection(
    pg_database: TestDatabase, big: tuple[PublishedTable, TableSchema]
) -> None:
    table, schema = big
    whole = CopyPlan(pg_database.connection(), None, schema, (CopyRange(table.name, None),), None)
    batches = read_ranges(whole, [0], batch_rows=1000, read_timeout=2)
    next(batches)
    with pg_database.cluster.frozen():
        frozen_at = time.monotonic()
        with pytest.raises(TransientError) as info:
            drain(batches)
        waited = time.monotonic() - frozen_at
    assert not isinstance(info.value, CopyStopped)
    assert "got nothing from the server for 2s" in info.value.message and info.value.hint
    assert waited < 15, f"the read timeout of 2s took {waited:.0f}s"
    assert not copy_threads()


def test_stop_while_connecting_to_a_frozen_server(
    pg_database: TestDatabase, big: tuple[PublishedTable, TableSchema]
) -> None:
    table, schema = big
    config = pg_database.connection().model_copy(update={"connect_timeout": 60})
    stop = threading.Event()
    outcome: list[BaseException] = []

    def copy() -> None:
        try:
            drain(read_ranges(CopyPlan(config, None, schema, (CopyRange(table.name, None),), None), [0], stop=stop))
        except BaseException as exc:
            outcome.append(exc)

    with pg_database.cluster.frozen():
        thread = threading.Thread(target=copy)
        thread.start()
        stop.set()
        asked = time.monotonic()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the copy kept waiting for the frozen server to answer its connection"
        assert time.monotonic() - asked < 10
    assert len(outcome) == 1 and isinstance(outcome[0], CopyStopped), outcome


@pytest.mark.parametrize("stopped", [False, True])
def test_a_query_through_psycopg_is_unblocked_too(pg_database: TestDatabase, stopped: bool) -> None:
    """The copy plans its ranges through psycopg, whose waits cannot watch the stop event: a watchdog ends them."""
    config = pg_database.connection()
    stop = threading.Event()
    with connect(config) as conn, pg_database.cluster.frozen():
        if stopped:
            threading.Timer(0.5, stop.set).start()
        began = time.monotonic()
        with pytest.raises(TransientError) as info, Unblock(conn, config, stop, 2 if not stopped else 60, "plan"):
            conn.execute("SELECT 1")
        assert time.monotonic() - began < 10
    assert isinstance(info.value, CopyStopped) is stopped


def test_a_read_in_an_imported_snapshot_gives_way_to_a_lock_request_queued_behind_its_exporter(
    pg_database: TestDatabase,
) -> None:
    """An ``ALTER TABLE`` waits for the share lock of the session that exported a copy's snapshot; a range read in
    that snapshot would queue behind it, a cycle Postgres cannot see, and stall the table for everyone until the read
    timeout. The read gives way at once instead: a ``TransientError`` naming the lock, and the ``ALTER`` goes on
    once the exporter ends."""
    db = pg_database
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'one')")
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    with connect(db.connection()) as conn:
        (table,) = publication_tables(conn, "pub")
        schema = table_schema(conn, table.id, table.column_list)
    with db.connect() as exporter, db.connect() as other:
        exporter.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        row = exporter.execute("SELECT pg_catalog.pg_export_snapshot()").fetchone()
        assert row is not None
        exporter.execute("SELECT count(*) FROM t")  # the exporter's share lock, as a chunk's planning holds it
        altering = threading.Thread(target=other.execute, args=("ALTER TABLE t ADD COLUMN n int",))
        altering.start()
        try:
            waiting = "SELECT count(*) FROM pg_catalog.pg_locks WHERE NOT granted AND relation = 't'::regclass"
            deadline = time.monotonic() + 30
            while db.execute(waiting) != [(1,)]:
                assert time.monotonic() < deadline, "the ALTER TABLE never waited"
                time.sleep(0.05)
            plan = CopyPlan(db.connection(), row[0], schema, (CopyRange(table.name, None),), None)
            began = time.monotonic()
            with pytest.raises(TransientError) as info:
                drain(read_ranges(plan, [0], read_timeout=20))
            waited = time.monotonic() - began
        finally:
            exporter.execute("COMMIT")
            altering.join(timeout=30)
        assert "asks for a lock on the table" in info.value.message and info.value.hint, info.value.message
        assert waited < 10, f"the read gave way after {waited:.0f}s"
        assert not altering.is_alive()
    added = "SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = 't'::regclass AND attname = 'n'"
    assert db.execute(added) == [(1,)]
