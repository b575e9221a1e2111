"""SIGKILL ``etl run`` into BigQuery in the middle of a batch, during the copy and during streaming; restart it.

"In the middle of a batch" is observed, not guessed: the kill comes while a batch's Parquet files sit in
the staging bucket (the emulator's local directory), that is after Spark began writing them and before the
load job finished, so before the MERGE and its watermark. After each restart BigQuery (a local
``local-bigquery`` server, read with google-cloud-bigquery) must return every table equal to the source,
with no duplicate key. The store is SQLite, so the pipeline's own state survives the kill too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.api_core import exceptions

from etl.schema import TableName
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.bigquery.emulator import PROJECT, BigQueryEmulator
from etl_spark.bigquery.names import table_id
from etl_spark.testing import comparable_source_rows, sorted_rows

TABLES = ("public.items", "public.ledger")


@dataclass
class Setup:
    db: TestDatabase
    emulator: BigQueryEmulator
    dataset: str
    config: Path
    staging: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "etl.cli", "--log-level", "warning", "run", "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill_mid_batch(self, timeout: float = 240) -> None:
        """SIGKILL the pipeline as soon as a batch is being staged (before its load job ends and its MERGE).

        Each staged batch gets a new directory ``<staging>/<table id>/<uuid>``, removed once its load job is done.
        """
        deadline = time.monotonic() + timeout
        earlier = self._staged()
        while not self._staged() - earlier:
            assert self.alive(), "etl run exited"
            assert time.monotonic() < deadline, "no batch was staged"
            time.sleep(0.01)
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        assert self._staged() - earlier, "the batch was loaded before the kill landed"

    def _staged(self) -> set[Path]:
        return set(self.staging.glob("*/*"))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                assert self.process.wait(timeout=120) == 0
            finally:
                self.process.kill()

    def query(self, sql: str) -> list[dict[str, object]]:
        client = self.emulator.client()
        try:
            return [dict(r.items()) for r in client.query_and_wait(sql)]
        finally:
            client.close()  # type: ignore[no-untyped-call]

    def ref(self, table: str) -> str:
        return f"`{PROJECT}.{self.dataset}.{table_id(TableName.parse(table))}`"

    def wait_equal(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                with self.db.connect() as conn:
                    expected = {t: comparable_source_rows(conn, t) for t in TABLES}
                last = {t: sorted_rows(self.query(f"SELECT * FROM {self.ref(t)}")) for t in TABLES}
                if last == expected:
                    return
            except (exceptions.NotFound, exceptions.BadRequest) as exc:  # not created yet (the emulator answers 400)
                last = exc
            assert self.alive(), "etl run exited"
            assert time.monotonic() < deadline, f"BigQuery never returned the source's rows; last: {str(last)[:2000]}"
            time.sleep(0.5)

    def duplicates(self) -> int:
        return sum(
            int(self.query(f"SELECT count(*) - count(DISTINCT id) AS n FROM {self.ref(t)}")[0]["n"])  # type: ignore[call-overload]
            for t in TABLES
        )


@pytest.fixture
def setup(pg_database: TestDatabase, bigquery_emulator: BigQueryEmulator, tmp_path: Path) -> Iterator[Setup]:
    db = pg_database
    db.execute(
        """
        CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int, updated timestamptz);
        INSERT INTO items SELECT g, 'item ' || g, g % 100, timestamptz '2026-01-01 00:00+00' + g * interval '1 s'
            FROM generate_series(1, 3000) g;
        CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item bigint, delta int);
        INSERT INTO ledger (item, delta) SELECT g % 1000, g % 7 - 3 FROM generate_series(1, 1000) g;
        CREATE PUBLICATION pub FOR TABLE items, ledger;
        """
    )
    dataset = f"crash_pg{db.major}"
    bucket = bigquery_emulator.bucket_dir("staging")
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f"""
[pipeline]
id = 9
publication = "pub"
[source]
host = "127.0.0.1"
port = {db.cluster.port}
database = "{db.name}"
user = "postgres"
sslmode = "disable"
[batch]
max_fill_ms = 300
[store]
type = "sqlite"
path = "{tmp_path / "state.sqlite"}"
[destination]
type = "bigquery"
project = "{PROJECT}"
dataset = "{dataset}"
staging_uri = "gs://staging/{dataset}"
staging_local_dir = "{bucket}"
endpoint = "{bigquery_emulator.endpoint}"
[destination.spark]
master = "local[2]"
conf = {{ "spark.sql.shuffle.partitions" = "2" }}
"""
    )
    setup = Setup(db, bigquery_emulator, dataset, config, bucket / dataset)
    try:
        yield setup
    finally:
        setup.stop()


def test_sigkill_mid_batch_during_copy_and_streaming(setup: Setup) -> None:
    db = setup.db
    # During the copy: a copied table is being staged.
    setup.start()
    setup.kill_mid_batch()
    db.execute("UPDATE items SET qty = -1 WHERE id % 100 = 0; DELETE FROM ledger WHERE id % 10 = 0")
    setup.start()
    setup.wait_equal()

    # During streaming: a batch of changes is being staged while the workload runs on.
    done = threading.Event()

    def workload() -> None:
        with db.connect() as conn:
            for i in range(200):
                with conn.transaction():
                    conn.execute("INSERT INTO ledger (item, delta) VALUES (%s, 1)", (i,))
                    conn.execute("UPDATE items SET qty = qty + 1, name = name || '+' WHERE id = %s", (i % 50 + 1,))
                    conn.execute("UPDATE items SET id = id + 100000 WHERE id = %s", (i + 1000,))
                    conn.execute("DELETE FROM ledger WHERE id = %s", (i * 3 + 1,))
                time.sleep(0.01)
        done.set()

    writer = threading.Thread(target=workload)
    writer.start()
    try:
        time.sleep(0.5)
        setup.kill_mid_batch()
        setup.start()
    finally:
        writer.join(timeout=300)
    assert done.is_set()
    db.execute("TRUNCATE ledger")
    db.execute("INSERT INTO ledger (item, delta) VALUES (1, 1)")
    setup.wait_equal()
    assert setup.duplicates() == 0
