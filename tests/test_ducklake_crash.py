"""SIGKILL ``etl run`` into DuckLake in the middle of a batch, during the copy and during streaming; restart it.

"In the middle of a batch" is observed, not guessed: the kill comes while Spark is writing the batch's
data files into the lake's staging directory, before the catalog commit. After each restart DuckDB
must read every table equal to the source, with no duplicate row. Runs on a SQLite catalog and on a
Postgres catalog; the store is SQLite, so the pipeline's own state survives the kill too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from etl.testing.pipelines import pipeline_config
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config
from etl.testing.workload import churn, concurrent_transactions, create_items_and_ledger
from etl_spark.ducklake.files import STAGING
from etl_spark.ducklake.reader import open_lake
from etl_spark.testing import comparable_source_rows, lake_rows

TABLES = ("public.items", "public.ledger", "public.keyless")


@dataclass
class Setup:
    db: TestDatabase
    run: PipelineProcess
    catalog: str
    staging: Path

    def staged(self) -> set[str]:
        """Spark writes each batch into a new directory under the staging directory, removed after the commit."""
        return {p.name for p in self.staging.iterdir()} if self.staging.is_dir() else set()

    def source(self) -> dict[str, list[dict[str, object]]]:
        with self.db.connect() as conn:
            return {t: comparable_source_rows(conn, t) for t in TABLES}

    def lake(self) -> dict[str, list[dict[str, object]]]:
        con = open_lake(self.catalog)
        try:
            return {t: lake_rows(con, t) for t in TABLES}
        finally:
            con.close()

    def wait_equal(self) -> None:
        self.run.wait_equal(self.source, self.lake, not_yet=(duckdb.Error,))  # duckdb.Error: not created yet

    def duplicates(self) -> int:
        con = open_lake(self.catalog)
        try:
            found = 0
            for table in ("items", "ledger"):
                row = con.execute(f"SELECT count(*) - count(DISTINCT id) FROM lake.public.{table}").fetchone()
                found += int(row[0]) if row else 0
            return found
        finally:
            con.close()


@pytest.fixture(params=["sqlite", "postgres"], ids=["sqlite-catalog", "postgres-catalog"])
def setup(request: pytest.FixtureRequest, pg_database: TestDatabase, tmp_path: Path) -> Iterator[Setup]:
    db = pg_database
    create_items_and_ledger(db, items=20000, ledger=5000)
    db.execute(
        """
        CREATE TABLE keyless (a int, b text);
        ALTER TABLE keyless REPLICA IDENTITY FULL;
        INSERT INTO keyless SELECT g % 5, 'dup' FROM generate_series(1, 20) g;
        CREATE PUBLICATION pub FOR TABLE items, ledger, keyless;
        """
    )
    lake_db = f"{db.name}_lake"
    if request.param == "sqlite":
        catalog = f"sqlite:///{tmp_path}/catalog.sqlite"
    else:
        db.cluster.create_database(lake_db)
        catalog = f"postgresql://postgres@127.0.0.1:{db.cluster.port}/{lake_db}"
    data = tmp_path / "lake-data"
    config = pipeline_config(
        db,
        pipeline_id=9,
        batch={"max_fill_ms": 300},
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={
            "type": "ducklake",
            "catalog": catalog,
            "data_path": f"{data}/",
            "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        },
    )
    run = PipelineProcess(write_config(tmp_path / "pipeline.toml", config), log_level="info")
    try:
        yield Setup(db, run, catalog, data / STAGING)
    finally:
        run.stop(timeout=120)
        if request.param == "postgres":
            db.cluster.drop_database(lake_db)


def test_sigkill_mid_batch_during_copy_and_streaming(setup: Setup) -> None:
    db = setup.db
    # During the copy: Spark is writing a copied chunk.
    setup.run.start()
    setup.run.kill_mid_write(setup.staged)
    db.execute("UPDATE items SET qty = -1 WHERE id % 1000 = 0; DELETE FROM ledger WHERE id % 10 = 0")
    setup.run.start()
    setup.wait_equal()

    # During streaming: Spark is writing the files of a batch of changes while the workload runs on.
    def transaction(conn: psycopg.Connection[Any], i: int) -> None:
        churn(conn, i, key_updates=True)
        conn.execute("INSERT INTO keyless VALUES (%s, 'dup')", (i % 3,))
        conn.execute("DELETE FROM keyless WHERE ctid IN (SELECT ctid FROM keyless WHERE a = %s LIMIT 1)", (i % 5,))

    with concurrent_transactions(db, transaction, count=300):
        time.sleep(0.5)
        setup.run.kill_mid_write(setup.staged)
        setup.run.start()
    db.execute("TRUNCATE ledger")
    db.execute("INSERT INTO ledger (item, delta) VALUES (1, 1)")
    setup.wait_equal()
    assert setup.duplicates() == 0
