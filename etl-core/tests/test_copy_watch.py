"""The progress of a copy that the destination runs itself, read from the source's running COPY commands."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pyarrow as pa

from etl.config import PostgresConnection
from etl.destination.base import TableCopier
from etl.destination.memory import MemoryDestination
from etl.pipeline import Pipeline
from etl.postgres.copy import CopyPlan
from etl.replication.copy_watch import CopyWatch, copy_application_name
from etl.store.base import CopyProgress
from etl.store.memory import MemoryStore
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase

ROWS = 100_000


def test_a_look_hands_on_the_growth_of_every_copy_seen() -> None:
    handed: list[int] = []
    watch = CopyWatch(PostgresConnection(database="db"), "etl copy 1/2", handed.append)
    started = datetime(2026, 1, 1, tzinfo=UTC)
    watch.look([(10, started, "COPY a", 100)])
    watch.look([(10, started, "COPY a", 250), (11, started, "COPY b", 50)])
    watch.look([(11, started, "COPY b", 60)])  # a's COPY ended: its 250 rows stay counted
    watch.look([(10, started, "COPY c", 5)])  # the same backend copies its next range
    watch.look([])
    assert handed == [100, 200, 10, 5]
    assert watch.seen == 315


def test_the_copy_name_keeps_its_suffix_within_63_bytes() -> None:
    long = PostgresConnection(database="db", application_name="ä" * 40)
    name = copy_application_name(long, 7, 16384)
    assert name.endswith(" copy 7/16384")
    assert len(name.encode()) <= 63
    assert copy_application_name(PostgresConnection(database="db"), 1, 2) == "etl copy 1/2"


class SlowCopier(MemoryDestination):
    """A memory destination that copies tables itself, slowly (as a cluster copying a large table would)."""

    def __init__(self) -> None:
        super().__init__()
        self.returned = threading.Event()
        self.application_names: set[str] = set()

    def copy_table(self, plan: CopyPlan, stop: threading.Event) -> int:
        self.application_names.add(plan.connection.application_name)
        copied = 0
        for batch in plan.copy_ranges(range(len(plan.ranges)), batch_rows=2000, stop=stop):
            self.write_table_rows(plan.schema, pa.Table.from_batches([batch]))
            copied += batch.num_rows
            time.sleep(0.1)
        self.returned.set()
        return copied


def test_a_destinations_own_copy_shows_progress_before_it_returns(pg_database: TestDatabase) -> None:
    pg_database.execute(
        f"""
        CREATE TABLE wide (id int PRIMARY KEY, v text);
        INSERT INTO wide SELECT g, repeat('v', 300) FROM generate_series(1, {ROWS}) g;
        CREATE PUBLICATION pub FOR TABLE wide;
        """
    )
    table_id = int(pg_database.execute("SELECT 'wide'::regclass::oid")[0][0])
    destination = SlowCopier()
    assert isinstance(destination, TableCopier)
    store = MemoryStore(pipeline_id=1)
    # One range: a COPY of 30 MB outlasts what the client and the sockets buffer, so it runs while the copier is slow.
    config = pipeline_config(pg_database, pipeline={"copy_connections": 1})
    pipeline = Pipeline(config, store, destination)
    seen: list[CopyProgress] = []

    def mid_copy() -> bool:
        progress = store.get_copy_progress(table_id)
        if progress is not None and progress.rows and not destination.returned.is_set():
            seen.append(progress)
        return bool(seen) or destination.returned.is_set()

    pipeline.start()
    try:
        wait_until(mid_copy, "the copy's first progress", pipeline)
        assert seen, "no progress was recorded before the destination's copy returned"
        assert 0 < seen[0].rows < ROWS
        assert not seen[0].finished
        wait_until(lambda: all_ready(pipeline, 1), "the table ready", pipeline)
        done = store.get_copy_progress(table_id)
        assert done is not None and done.finished and done.rows == ROWS
        assert destination.application_names == {copy_application_name(config.source, 1, table_id)}
        assert destination_matches(pg_database, destination, "public.wide")
    finally:
        pipeline.shutdown()
