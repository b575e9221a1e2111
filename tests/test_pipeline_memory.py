"""Copy then stream into the memory destination: equal to the source, row for row, per table."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from etl.destination.base import WriteResult
from etl.destination.memory import MemoryDestination
from etl.events import EventBatch
from etl.pipeline import Pipeline
from etl.replication import apply as apply_module
from etl.schema import TableName
from etl.store.memory import MemoryStore
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase

TABLES = ("public.accounts", "public.events", "public.keyless")


@pytest.fixture
def source(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        """
        CREATE TABLE accounts (id int PRIMARY KEY, name text NOT NULL, balance numeric(12,2), tags text[]);
        CREATE TABLE events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int, at timestamptz,
                             payload jsonb, note text);
        CREATE TABLE keyless (a int, b text);
        ALTER TABLE keyless REPLICA IDENTITY FULL;
        INSERT INTO accounts SELECT g, 'acct ' || g, g * 1.5, ARRAY['t' || g % 3] FROM generate_series(1, 500) g;
        INSERT INTO events (account, at, payload, note)
            SELECT g % 50, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute',
                   jsonb_build_object('n', g), CASE WHEN g % 7 = 0 THEN NULL ELSE 'note ' || g END
            FROM generate_series(1, 3000) g;
        INSERT INTO keyless SELECT g % 5, 'dup' FROM generate_series(1, 20) g;
        CREATE PUBLICATION pub FOR TABLE accounts, events, keyless;
        """
    )
    return pg_database


@pytest.fixture
def running(source: TestDatabase) -> Iterator[tuple[Pipeline, MemoryDestination]]:
    destination = MemoryDestination()
    pipeline = Pipeline(pipeline_config(source), MemoryStore(pipeline_id=1), destination)
    pipeline.start()
    try:
        yield pipeline, destination
    finally:
        pipeline.shutdown()


def test_copy_then_stream_equals_source(source: TestDatabase, running: tuple[Pipeline, MemoryDestination]) -> None:
    pipeline, destination = running
    wait_until(lambda: all_ready(pipeline, 3), "every table ready", pipeline)
    assert destination_matches(source, destination, *TABLES)

    source.execute(
        """
        BEGIN;
        INSERT INTO accounts VALUES (1001, 'new', 10.00, '{}'), (1002, 'new2', NULL, NULL);
        UPDATE accounts SET balance = balance + 1 WHERE id % 10 = 0;
        UPDATE accounts SET id = 2000 WHERE id = 5;
        DELETE FROM accounts WHERE id BETWEEN 100 AND 120;
        COMMIT;
        """
    )
    source.execute("UPDATE events SET note = 'changed' WHERE id % 3 = 0")
    source.execute("DELETE FROM events WHERE id % 11 = 0")
    source.execute("DELETE FROM keyless WHERE ctid IN (SELECT ctid FROM keyless WHERE a = 1 LIMIT 1)")
    source.execute("UPDATE keyless SET b = 'changed' WHERE a = 2")
    source.execute("INSERT INTO keyless VALUES (9, NULL)")
    wait_until(lambda: destination_matches(source, destination, *TABLES), "streamed changes", pipeline)

    source.execute("TRUNCATE events, keyless")
    source.execute("INSERT INTO events (account, note) VALUES (1, 'after truncate')")
    wait_until(lambda: destination_matches(source, destination, *TABLES), "truncate", pipeline)
    assert len(destination.rows("public.events")) == 1


def test_durable_batches_say_what_they_wrote(source: TestDatabase) -> None:
    """The "changes written" info lines of the apply worker add up to the changes streamed (the last of them
    logged when the pipeline stops, at the latest)."""
    destination = MemoryDestination()
    pipeline = Pipeline(pipeline_config(source), MemoryStore(pipeline_id=1), destination)
    pipeline.start()
    try:
        wait_until(lambda: all_ready(pipeline, 3), "every table ready", pipeline)
        with capture_logs() as logs:
            source.execute("INSERT INTO keyless VALUES (7, 'x'), (8, 'y')")
            source.execute("DELETE FROM keyless WHERE a = 0")
            wait_until(lambda: destination_matches(source, destination, *TABLES), "streamed changes", pipeline)
            pipeline.shutdown()
    finally:
        pipeline.shutdown()
    lines = [line for line in logs if line["event"] == "changes written" and line["worker"] == "apply"]
    assert lines, logs
    assert sum(line["inserts"] for line in lines) == 2
    assert sum(line["deletes"] for line in lines) == 4
    assert sum(line["updates"] + line["truncates"] for line in lines) == 0


def test_a_freed_sync_worker_takes_the_next_table_at_once(
    pg_database: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one sync worker, each table's copy starts when the one before it ended, not at the next re-read of the
    publication (which no longer comes here: only the first one starts a worker)."""
    db = pg_database
    tables = [f"public.t{i}" for i in range(4)]
    for name in tables:
        db.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text); INSERT INTO {name} VALUES (1, '{name}')")
    db.execute(f"CREATE PUBLICATION pub FOR TABLE {', '.join(tables)}")
    monkeypatch.setattr(apply_module, "REFRESH_INTERVAL_S", 3600.0)
    destination = MemoryDestination()
    config = pipeline_config(db, pipeline={"table_sync_workers": 1})
    pipeline = Pipeline(config, MemoryStore(pipeline_id=1), destination)
    pipeline.start()
    try:
        wait_until(lambda: all_ready(pipeline, len(tables)), "every table ready, one after the other", pipeline)
        assert destination_matches(db, destination, *tables)
    finally:
        pipeline.shutdown()


class FlagRecordingDestination(MemoryDestination):
    """The memory destination, keeping ``all_tables_ready`` of each batch with changes."""

    def __init__(self) -> None:
        super().__init__()
        self.ready_flags: list[bool] = []

    def write_events(self, batch: EventBatch) -> WriteResult:
        if batch.row_count():
            self.ready_flags.append(batch.all_tables_ready)
        return super().write_events(batch)


@pytest.mark.parametrize("skipped", [False, True], ids=["all-copied", "one-skipped"])
def test_batches_say_when_every_table_is_copied_and_ready(pg_database: TestDatabase, skipped: bool) -> None:
    """Once every table is copied and ready, the apply worker's batches say so; never while a table ``[copy]``
    leaves uncopied is published (its older rows are missing from the destination)."""
    db = pg_database
    db.execute(
        "CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY); INSERT INTO b VALUES (0);"
        " CREATE PUBLICATION pub FOR TABLE a, b"
    )
    destination = FlagRecordingDestination()
    copy = {"skip": ["public.b"]} if skipped else {}
    pipeline = Pipeline(pipeline_config(db, copy=copy), MemoryStore(pipeline_id=1), destination)
    pipeline.start()
    try:
        wait_until(lambda: all_ready(pipeline, 2), "both tables ready", pipeline)
        for i in range(1, 4):
            db.execute(f"INSERT INTO a VALUES ({i}); INSERT INTO b VALUES ({i})")
        wait_until(lambda: len(destination.rows(TableName.parse("public.a"))) == 3, "the inserts", pipeline)
    finally:
        pipeline.shutdown()
    assert destination.ready_flags and all(flag is not skipped for flag in destination.ready_flags)
