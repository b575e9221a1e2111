"""Metrics and health checks of a running pipeline, scraped over HTTP as Prometheus would."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from etl.destination.base import WriteResult
from etl.destination.memory import MemoryDestination
from etl.events import EventBatch
from etl.pipeline import Pipeline
from etl.store.memory import MemoryStore
from etl.testing import free_port
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase

SERIES = {
    "etl_table_states": "gauge",
    "etl_copied_rows_total": "counter",
    "etl_copy_table_rows_estimate": "gauge",
    "etl_events_total": "counter",
    "etl_batch_write_seconds": "histogram",
    "etl_batch_rows": "histogram",
    "etl_replication_lag_bytes": "gauge",
    "etl_slot_retained_wal_bytes": "gauge",
    "etl_commit_to_durable_seconds": "histogram",
    "etl_errors_total": "counter",
    "etl_table_errors": "gauge",
    "etl_reconnects_total": "counter",
}


class HeldDestination(MemoryDestination):
    """The memory destination, whose streamed writes wait while ``held`` is set (stands in for a slow destination)."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()
        self.released.set()

    def write_events(self, batch: EventBatch) -> WriteResult:
        self.released.wait(120)
        return super().write_events(batch)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(base: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of ``/metrics``: sample name -> labels -> value (parsed with prometheus_client's parser)."""
    status, text = get(f"{base}/metrics")
    assert status == 200
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(base: str, name: str, **labels: str) -> float:
    return scrape(base).get(name, {}).get(tuple(sorted(labels.items())), 0.0)


@pytest.fixture
def served(pg_database: TestDatabase) -> Iterator[tuple[Pipeline, HeldDestination, str]]:
    db = pg_database
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'x' FROM generate_series(1, 50) g")
    db.execute("ANALYZE t; CREATE PUBLICATION pub FOR TABLE t")
    port = free_port()
    config = pipeline_config(db, metrics={"listen": f"127.0.0.1:{port}", "sample_interval_s": 1, "stuck_after_s": 2})
    destination = HeldDestination()
    pipeline = Pipeline(config, MemoryStore(1), destination)
    pipeline.start()
    try:
        yield pipeline, destination, f"http://127.0.0.1:{port}"
    finally:
        destination.released.set()
        pipeline.shutdown()


def test_a_running_pipeline_serves_its_series_and_health(
    pg_database: TestDatabase, served: tuple[Pipeline, HeldDestination, str]
) -> None:
    db = pg_database
    pipeline, destination, base = served
    wait_until(lambda: all_ready(pipeline, 1), "ready", pipeline)
    wait_until(lambda: get(f"{base}/readyz")[0] == 200, "ready to serve", pipeline)
    assert get(f"{base}/healthz") == (200, "running\n")

    db.execute("INSERT INTO t SELECT g, 'new' FROM generate_series(51, 80) g")
    db.execute("UPDATE t SET v = 'changed' WHERE id <= 5")
    db.execute("DELETE FROM t WHERE id = 80")
    wait_until(lambda: destination_matches(db, destination, "public.t"), "streamed", pipeline)
    wait_until(lambda: value(base, "etl_events_total", kind="delete") == 1, "the delete counted", pipeline)
    samples = scrape(base)
    families = {family.name: family.type for family in text_string_to_metric_families(get(f"{base}/metrics")[1])}
    for name, kind in SERIES.items():
        family = name.removesuffix("_total") if kind == "counter" else name
        assert families.get(family) == kind, f"{name} ({kind}) is not exported"
    assert samples["etl_events_total"][(("kind", "insert"),)] == 30
    assert samples["etl_events_total"][(("kind", "update"),)] == 5
    assert samples["etl_copied_rows_total"][(("table", "public.t"),)] == 50
    assert samples["etl_copy_table_rows_estimate"][(("table", "public.t"),)] == 50
    assert samples["etl_table_states"][(("state", "ready"),)] == 1
    assert samples["etl_table_errors"][()] == 0
    assert samples["etl_commit_to_durable_seconds_count"][()] >= 1
    assert samples["etl_batch_write_seconds_count"][(("destination", "memory"),)] >= 1
    wait_until(
        lambda: ("slot", "etl_apply_1") in {k[0] for k in scrape(base).get("etl_slot_retained_wal_bytes", {})}, "slot"
    )

    # A held destination: the lag grows, the read loop stops turning, /readyz says so; released, both recover.
    wait_until(lambda: value(base, "etl_replication_lag_bytes") < 100_000, "caught up", pipeline)
    destination.released.clear()
    before = value(base, "etl_replication_lag_bytes")
    for _ in range(20):
        db.execute("INSERT INTO t SELECT g, repeat('y', 500) FROM generate_series(1000, 1500) g ON CONFLICT DO NOTHING")
        db.execute("DELETE FROM t WHERE id >= 1000")
    wait_until(lambda: value(base, "etl_replication_lag_bytes") > before + 1_000_000, "the lag grows", pipeline)
    wait_until(lambda: get(f"{base}/readyz")[0] == 503, "unready while the apply worker is stuck", pipeline)
    assert "made no progress" in get(f"{base}/readyz")[1]
    destination.released.set()
    wait_until(lambda: get(f"{base}/readyz")[0] == 200, "ready again", pipeline)
    wait_until(lambda: value(base, "etl_replication_lag_bytes") < 100_000, "the lag falls back", pipeline)
    wait_until(lambda: destination_matches(db, destination, "public.t"), "every change", pipeline)

    pipeline.request_stop()
    wait_until(lambda: get(f"{base}/healthz")[0] == 503, "unhealthy once stopped")
    assert get(f"{base}/readyz")[0] == 503
