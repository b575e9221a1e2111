"""SIGKILL the pipeline process during the copy and during streaming, restart it: nothing lost, nothing doubled.

The destination is the plugin template's durable SQLite mirror (a real, watermarked destination); the
store is SQLite or Postgres, so state has to survive the process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etl_plugin_example.mirror_reader import mirrored_rows

from etl.testing.compare import source_rows
from etl.testing.pipelines import pipeline_config, poll
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config
from etl.testing.workload import churn, concurrent_transactions, create_items_and_ledger

TABLES = ("public.items", "public.ledger")


def store_section(store: str, db: TestDatabase, tmp_path: Path) -> dict[str, Any]:
    if store == "sqlite":
        return {"type": "sqlite", "path": str(tmp_path / "state.sqlite")}
    return {"type": "postgres", **db.connection().model_dump(exclude_none=True)}


def wait_equal(db: TestDatabase, mirror: Path, runner: PipelineProcess) -> None:
    with db.connect() as conn:
        runner.wait_equal(
            lambda: [source_rows(conn, t) for t in TABLES],
            lambda: [mirrored_rows(mirror, t) for t in TABLES],
            timeout=120,
            interval=0.3,
        )


@pytest.fixture(params=["sqlite", "postgres"])
def setup(
    request: pytest.FixtureRequest, pg_database: TestDatabase, tmp_path: Path
) -> Iterator[tuple[PipelineProcess, Path]]:
    db = pg_database
    create_items_and_ledger(db, items=200000, ledger=50000)
    db.execute("CREATE PUBLICATION pub FOR TABLE items, ledger")
    mirror = tmp_path / "mirror.sqlite"
    config = pipeline_config(
        db,
        pipeline_id=9,
        copy={"connections": 2},
        batch={"max_fill_ms": 200, "max_bytes": 65536, "busy_max_bytes": 262144},
        store=store_section(request.param, db, tmp_path),
        destination={"type": "sqlite_mirror", "path": str(mirror)},
    )
    with PipelineProcess(write_config(tmp_path / "pipeline.toml", config)) as runner:
        yield runner, mirror


def test_sigkill_during_copy_then_restart(pg_database: TestDatabase, setup: tuple[PipelineProcess, Path]) -> None:
    runner, mirror = setup
    runner.start()

    def copied() -> list[dict[str, Any]]:
        runner.ensure_alive()
        return mirrored_rows(mirror, "public.items") or []

    rows = poll(copied, "some rows copied", timeout=60, least=0.02)  # the copy not finished
    assert len(rows) < 200000, "the copy finished before the kill; make the table bigger"
    runner.kill()
    pg_database.execute("UPDATE items SET qty = -1 WHERE id % 1000 = 0; DELETE FROM ledger WHERE id % 10 = 0")
    runner.start()
    wait_equal(pg_database, mirror, runner)


@pytest.mark.slow
def test_sigkill_during_streaming_then_restart(pg_database: TestDatabase, setup: tuple[PipelineProcess, Path]) -> None:
    runner, mirror = setup
    runner.start()
    wait_equal(pg_database, mirror, runner)

    with concurrent_transactions(pg_database, churn, count=400, pause=0.005, timeout=120):
        time.sleep(0.8)  # some of the workload streamed, some not yet
        runner.kill()
        time.sleep(0.5)
        runner.start()
    pg_database.execute("TRUNCATE ledger")
    pg_database.execute("INSERT INTO ledger (item, delta) VALUES (1, 1)")
    wait_equal(pg_database, mirror, runner)
