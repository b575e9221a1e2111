"""The first batch after a start into a lake of a large table is not slower than the batches after it (issue 48):
what the writer warms (the Spark session, Python workers, the key lookups of the table's files) is warmed before
or while streaming begins, not inside the first write."""

from __future__ import annotations

import statistics
import urllib.request
from pathlib import Path

import duckdb
import pytest
from prometheus_client.parser import text_string_to_metric_families

from etl.errors import DestinationError
from etl.testing import free_port
from etl.testing.pipelines import pipeline_config
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config
from etl_spark.ducklake.reader import open_lake

pytestmark = [pytest.mark.slow, pytest.mark.first_major, pytest.mark.alone]  # a ratio of times

ROWS, UPDATED = 1_000_000, 100_000
NOT_YET = (DestinationError, duckdb.Error)
"""No catalog yet, no table yet."""


def update_old_rows(db: TestDatabase, seed: int) -> None:
    """One transaction updating ``UPDATED`` rows spread over the whole table (a TPC-B-like touch of old rows)."""
    db.execute(f"UPDATE accounts SET balance = balance + 1 WHERE id % {ROWS // UPDATED} = {seed}")


def write_seconds(port: int) -> float:
    """The time ``etl run`` spent writing streamed batches so far (``etl_batch_write_seconds``' sum)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "etl_batch_write_seconds_sum" and sample.labels.get("destination") == "ducklake":
                return float(sample.value)
    return 0.0


def test_the_first_batch_after_a_start_costs_what_the_next_one_does(pg_database: TestDatabase, tmp_path: Path) -> None:
    db = pg_database
    db.execute(
        f"""
        CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, filler text);
        INSERT INTO accounts SELECT g, 0, repeat('x', 40) FROM generate_series(1, {ROWS}) g;
        CREATE PUBLICATION pub FOR TABLE accounts;
        """
    )
    catalog, port = f"sqlite:///{tmp_path}/catalog.sqlite", free_port()
    config = pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={
            "type": "ducklake",
            "catalog": catalog,
            "data_path": f"{tmp_path}/data/",
            "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        },
        batch={"max_fill_ms": 1000},
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    run = PipelineProcess(write_config(tmp_path / "pipeline.toml", config))

    def lake_total() -> object:
        con = open_lake(catalog)
        try:
            return con.execute("SELECT count(*), sum(balance) FROM lake.public.accounts").fetchone()
        finally:
            con.close()

    def source_total() -> object:
        return tuple(db.execute("SELECT count(*), sum(balance) FROM accounts")[0])

    seconds = []  # each batch's write, as the run's metrics count it (other batches carry no change: a few ms)
    try:
        run.start()
        run.wait_equal(source_total, lake_total, not_yet=NOT_YET, timeout=300)  # copied
        run.stop(timeout=120)
        update_old_rows(db, 1)  # the backlog the next start's first batch holds
        run.start()
        for seed in (2, 3, 4, 5):  # then the same shape, once the run is under way
            run.wait_equal(source_total, lake_total, timeout=300)
            seconds.append(write_seconds(port))
            update_old_rows(db, seed)
        run.wait_equal(source_total, lake_total, timeout=300)
        seconds.append(write_seconds(port))
    finally:
        run.stop(timeout=120)
    first, *steady = [b - a for a, b in zip([0.0, *seconds], seconds, strict=False)]
    assert first <= 2 * statistics.median(steady), f"the first batch after the start took {first} s, then {steady}"
