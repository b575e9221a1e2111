"""An invalidated replication slot: stop with instructions, or recreate it and copy every table again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from etl.destination.memory import MemoryDestination
from etl.errors import SourceError
from etl.pipeline import Pipeline
from etl.postgres.slot_state import slot_state
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_store_sqlite.store import SqliteStore


def invalidate_slot(db: TestDatabase, slot: str) -> None:
    """Make the source drop WAL the slot still needs (max_slot_wal_keep_size), as a long outage would."""
    with db.connect() as sql:
        sql.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        try:
            sql.execute("SELECT pg_reload_conf()")
            time.sleep(0.5)
            deadline = time.monotonic() + 60
            while not slot_state(sql, slot).invalidated:
                assert time.monotonic() < deadline, "the slot was never invalidated"
                sql.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g")
                sql.execute("SELECT pg_switch_wal()")
                sql.execute("CHECKPOINT")
        finally:
            sql.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            sql.execute("SELECT pg_reload_conf()")


def test_invalidated_slot_stops_or_recreates(pg_database: TestDatabase, tmp_path: Path) -> None:
    db = pg_database
    db.execute("CREATE TABLE t (id int, pad text); ALTER TABLE t REPLICA IDENTITY FULL")
    db.execute("INSERT INTO t VALUES (1, 'before')")
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    destination = MemoryDestination()

    def pipeline(choice: str) -> Pipeline:
        config = pipeline_config(db, pipeline={"invalidated_slot": choice})
        return Pipeline(config, SqliteStore(tmp_path / "state.sqlite", 1), destination)

    first = pipeline("stop")
    first.start()
    wait_until(lambda: all_ready(first, 1), "ready", first)
    first.shutdown()

    invalidate_slot(db, "etl_apply_1")

    stopped = pipeline("stop")
    stopped.start()
    with pytest.raises(SourceError) as error:
        stopped.wait(timeout=60)
    stopped.shutdown()
    assert "invalidated" in str(error.value) and 'invalidated_slot = "recreate"' in str(error.value)

    recreated = pipeline("recreate")
    recreated.start()
    try:
        wait_until(lambda: all_ready(recreated, 1), "ready again after a full resync", recreated)
        wait_until(lambda: destination_matches(db, destination, "public.t"), "every row, also those of the outage")
        db.execute("INSERT INTO t VALUES (2, 'after')")
        wait_until(lambda: destination_matches(db, destination, "public.t"), "streaming again", recreated)
    finally:
        recreated.shutdown()
    with db.connect() as sql:
        assert not slot_state(sql, "etl_apply_1").invalidated
