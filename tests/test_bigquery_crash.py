"""SIGKILL ``etl run`` into BigQuery in the middle of a batch, during the copy and during streaming; restart it.

"In the middle of a batch" is observed, not guessed: the kill comes while a batch's Parquet files sit in
the staging bucket (the emulator's local directory), that is after Spark began writing them and before the
load job finished, so before the apply transaction and its watermark. After each restart BigQuery (a local
``local-bigquery`` server, read with google-cloud-bigquery) must return every table equal to the source,
with no duplicate key. The store is SQLite, so the pipeline's own state survives the kill too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.api_core import exceptions

from etl.schema import TableName
from etl.testing.pipelines import pipeline_config
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config
from etl.testing.workload import churn, concurrent_transactions, create_items_and_ledger
from etl_spark.bigquery.names import table_id
from etl_spark.testing import comparable_source_rows, sorted_rows
from etl_spark.testing.bigquery_emulator import PROJECT, BigQueryEmulator

pytestmark = pytest.mark.slow  # see docs/testing.md

TABLES = ("public.items", "public.ledger")


@dataclass
class Setup:
    db: TestDatabase
    run: PipelineProcess
    emulator: BigQueryEmulator
    dataset: str
    staging: Path

    def staged(self) -> set[Path]:
        """Each staged write gets a new directory ``<staging>/<staging table>``, removed once it is loaded."""
        return set(self.staging.glob("*"))

    def query(self, sql: str) -> list[dict[str, object]]:
        client = self.emulator.client()
        try:
            return [dict(r.items()) for r in client.query_and_wait(sql)]
        finally:
            client.close()  # type: ignore[no-untyped-call]

    def ref(self, table: str) -> str:
        return f"`{PROJECT}.{self.dataset}.{table_id(TableName.parse(table))}`"

    def source(self) -> dict[str, list[dict[str, object]]]:
        with self.db.connect() as conn:
            return {t: comparable_source_rows(conn, t) for t in TABLES}

    def bigquery(self) -> dict[str, list[dict[str, object]]]:
        return {t: sorted_rows(self.query(f"SELECT * FROM {self.ref(t)}")) for t in TABLES}

    def wait_equal(self) -> None:
        # not created yet: NotFound, or BadRequest from the emulator
        self.run.wait_equal(self.source, self.bigquery, not_yet=(exceptions.NotFound, exceptions.BadRequest))

    def duplicates(self) -> int:
        return sum(
            int(self.query(f"SELECT count(*) - count(DISTINCT id) AS n FROM {self.ref(t)}")[0]["n"])  # type: ignore[call-overload]
            for t in TABLES
        )


@pytest.fixture
def setup(pg_database: TestDatabase, bigquery_emulator: BigQueryEmulator, tmp_path: Path) -> Iterator[Setup]:
    db = pg_database
    create_items_and_ledger(db, items=3000, ledger=1000)
    db.execute("CREATE PUBLICATION pub FOR TABLE items, ledger")
    dataset = f"crash_pg{db.major}"
    bucket = bigquery_emulator.bucket_dir("staging")
    config = pipeline_config(
        db,
        pipeline_id=9,
        batch={"max_fill_ms": 300},
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={
            "type": "bigquery",
            "project": PROJECT,
            "dataset": dataset,
            "staging_uri": f"gs://staging/{dataset}",
            "staging_local_dir": str(bucket),
            "endpoint": bigquery_emulator.endpoint,
            "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        },
    )
    run = PipelineProcess(write_config(tmp_path / "pipeline.toml", config))
    try:
        yield Setup(db, run, bigquery_emulator, dataset, bucket / dataset)
    finally:
        run.stop(timeout=120)


@pytest.mark.first_major
def test_sigkill_mid_batch_during_copy_and_streaming(setup: Setup) -> None:
    db = setup.db
    # During the copy: a copied table is being staged.
    setup.run.start()
    setup.run.kill_mid_write(setup.staged)
    db.execute("UPDATE items SET qty = -1 WHERE id % 100 = 0; DELETE FROM ledger WHERE id % 10 = 0")
    setup.run.start()
    setup.wait_equal()

    # During streaming: a batch of changes is being staged while the workload runs on.
    with concurrent_transactions(db, lambda conn, i: churn(conn, i, key_updates=True), count=200):
        time.sleep(0.5)
        setup.run.kill_mid_write(setup.staged)
        setup.run.start()
    db.execute("TRUNCATE ledger")
    db.execute("INSERT INTO ledger (item, delta) VALUES (1, 1)")
    setup.wait_equal()
    assert setup.duplicates() == 0
