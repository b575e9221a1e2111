"""The progress of a copy that the destination runs itself, read from the source's running COPY commands."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pyarrow as pa

from etl.config import PostgresConnection
from etl.copy_plan import CopyPlan
from etl.destination.base import TableCopier
from etl.destination.memory import MemoryDestination
from etl.pipeline import Pipeline
from etl.postgres.copy import read_ranges
from etl.replication.copy_watch import CopyWatch, copy_application_name
from etl.store.memory import MemoryStore
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase

ROWS = 100_000


def test_a_look_hands_on_the_growth_of_every_copy_seen() -> None:
    handed: list[int] = []
    watch = CopyWatch(PostgresConnection(database="db"), "etl copy 1/2", handed.append)
    backend, first, second, third = (datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in range(4))
    watch.look([(10, backend, first, 100)])
    watch.look([(10, backend, first, 250), (11, backend, first, 50)])
    watch.look([(11, backend, first, 60)])  # 10's COPY ended: its 250 rows stay counted
    watch.look([(10, backend, second, 5)])  # the same backend copies its next range
    watch.look([(10, backend, third, 0)])
    watch.look([])
    assert handed == [100, 200, 10, 5]
    assert watch.seen == 315


def test_a_closed_watch_hands_nothing_on() -> None:
    handed: list[int] = []
    with CopyWatch(PostgresConnection(database="db", port=1), "etl copy 1/2", handed.append, interval=3600) as watch:
        pass
    watch.look([(10, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC), 100)])
    assert handed == []


def test_the_copy_name_is_printable_ascii_within_63_bytes() -> None:
    def named(application_name: str) -> str:
        return copy_application_name(PostgresConnection(database="db", application_name=application_name), 7, 16384)

    assert named("etl") == "etl copy 7/16384"
    assert named("etl-äö-prod") == "etl--prod copy 7/16384"  # the server would turn ä into ? or \xc3\xa4
    assert named("x" * 80) == "x" * 50 + " copy 7/16384"
    assert len(named("x" * 80)) == 63


class SlowCopier(MemoryDestination):
    """A memory destination that copies tables itself, and waits after its first batch until told to go on (as a
    cluster copying a large table would take its time)."""

    def __init__(self) -> None:
        super().__init__()
        self.go_on = threading.Event()
        self.returned = threading.Event()
        self.application_names: set[str] = set()

    def copy_table(self, plan: CopyPlan, stop: threading.Event) -> int:
        self.application_names.add(plan.connection.application_name)
        copied = 0
        for batch in read_ranges(plan, range(len(plan.ranges)), batch_rows=2000, stop=stop):
            self.write_table_rows(plan.schema, pa.Table.from_batches([batch]))
            copied += batch.num_rows
            self.go_on.wait(60)
        self.returned.set()
        return copied


def test_a_destinations_own_copy_shows_progress_before_it_returns(pg_database: TestDatabase) -> None:
    """30 MB in one range: while the copier waits, the source's COPY waits on full buffers, its rows so far shown."""
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
    config = pipeline_config(pg_database, copy={"connections": 1})
    pipeline = Pipeline(config, store, destination)

    def counted() -> float:
        return pipeline.metrics.registry.get_sample_value("etl_copied_rows_total", {"table": "public.wide"}) or 0

    pipeline.start()
    try:
        wait_until(lambda: counted() > 0, "the copy's rows counted while it runs", pipeline)
        assert not destination.returned.is_set()
        assert 0 < counted() < ROWS
        destination.go_on.set()
        wait_until(lambda: all_ready(pipeline, 1), "the table ready", pipeline)
        done = store.get_copy_progress(table_id)
        assert done is not None and done.finished and done.rows == ROWS
        assert counted() == ROWS
        assert destination.application_names == {copy_application_name(config.source, 1, table_id)}
        assert destination_matches(pg_database, destination, "public.wide")
    finally:
        destination.go_on.set()
        pipeline.shutdown()
