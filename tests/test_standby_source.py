"""A hot standby as the source: from Postgres 16 on its slots decode what it replays, so a pipeline copies and
streams from it, follows schema changes made on the primary, and its metrics and ``etl status`` read the standby's
WAL position. Before 16, ``etl check`` and the pipeline say that it takes a primary.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from etl_plugin_example.mirror_reader import MirrorReader, mirrored_rows
from prometheus_client.parser import text_string_to_metric_families

from etl.checks import run_checks
from etl.postgres.ddl import install_ddl_trigger
from etl.testing import TemporaryCluster, find_install, free_port
from etl.testing.compare import source_rows
from etl.testing.pipelines import pipeline_config, poll
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config

DATABASE = "app"


@pytest.fixture
def clusters(pg_major: int) -> Iterator[tuple[TestDatabase, TestDatabase]]:
    """A primary with a published table and the schema change trigger, and a hot standby of it."""
    primary = TemporaryCluster(find_install(pg_major or None)).start()
    try:
        primary.create_database(DATABASE)
        source = TestDatabase(primary, DATABASE)
        source.execute("CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, note text)")
        source.execute("INSERT INTO items SELECT g, g % 7, 'n' || g FROM generate_series(1, 2000) g")
        source.execute("CREATE PUBLICATION pub FOR TABLE items")
        with source.connect() as conn:
            assert install_ddl_trigger(conn)
        standby = primary.start_standby()
        try:
            yield source, TestDatabase(standby, DATABASE)
        finally:
            standby.stop()
    finally:
        primary.stop()


def metrics(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_a_standby_as_the_source(clusters: tuple[TestDatabase, TestDatabase], tmp_path: Path) -> None:
    primary, standby = clusters
    port = free_port()
    mirror = tmp_path / "mirror.sqlite"
    config = pipeline_config(
        standby,
        batch={"max_fill_ms": 200},
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={"type": "sqlite_mirror", "path": str(mirror)},
        metrics={"listen": f"127.0.0.1:{port}", "sample_interval_s": 1},
    )
    checks = {check.name: check for check in run_checks(config)}
    config_path = write_config(tmp_path / "pipeline.toml", config)

    if standby.major < 16:
        assert checks["standby"].failed and "needs Postgres 16 or later" in checks["standby"].detail
        with PipelineProcess(config_path) as runner:
            runner.start()
            assert runner.process is not None and runner.process.wait(timeout=60) != 0
            assert "logical decoding on a standby needs Postgres 16 or later" in runner.output()
        return

    assert not any(check.failed for check in checks.values()), [c.line() for c in checks.values() if c.failed]
    assert checks["standby"].ok and checks["hot_standby_feedback"].ok and checks["schema change trigger"].ok
    # A slot made on a standby waits for the primary to log its running transactions (every 15 s, when busy).
    stop = threading.Event()

    def log_snapshots() -> None:
        while not stop.wait(0.3):
            primary.execute("SELECT pg_log_standby_snapshot()")

    kicker = threading.Thread(target=log_snapshots, daemon=True)
    kicker.start()
    try:
        with PipelineProcess(config_path) as runner, primary.connect() as conn:
            runner.start()
            runner.wait_equal(
                lambda: source_rows(conn, "public.items"), lambda: mirrored_rows(mirror, "public.items"), timeout=120
            )

            conn.execute("UPDATE items SET qty = qty + 100 WHERE id % 10 = 0")
            conn.execute("DELETE FROM items WHERE id % 13 = 0")
            conn.execute("ALTER TABLE items ADD COLUMN shelf varchar(8)")
            conn.execute("INSERT INTO items VALUES (5000, 1, 'after the change', 'b2')")
            runner.wait_equal(
                lambda: source_rows(conn, "public.items"), lambda: mirrored_rows(mirror, "public.items"), timeout=120
            )
            with MirrorReader(mirror) as reader:
                shelf = next(c for c in reader.schema("public.items").columns if c.name == "shelf")
            # RELATION messages carry no type names: the trigger's message, recorded on the primary, did.
            assert shelf.type_name == "character varying(8)"

            poll(
                lambda: metrics(port),
                "a WAL position sampled from the standby",
                until=lambda names: {"etl_replication_lag_bytes", "etl_slot_retained_wal_bytes"} <= names,
                timeout=30,
                least=0.5,
            )
            status = subprocess.run(
                [sys.executable, "-m", "etl.cli", "status", "-c", str(config_path), "--format", "json"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert status.returncode == 0, status.stdout + status.stderr
            [slot] = json.loads(status.stdout)["slots"]
            assert slot["name"] == "etl_apply_1" and slot["active"] and slot["lag_bytes"] >= 0
    finally:
        stop.set()
        kicker.join()
