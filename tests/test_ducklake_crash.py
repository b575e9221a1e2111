"""SIGKILL ``etl run`` into DuckLake in the middle of a batch, during the copy and during streaming; restart it.

"In the middle of a batch" is observed, not guessed: the kill comes while Spark is writing the batch's
data files into the lake's staging directory, before the catalog commit. After each restart DuckDB
must read every table equal to the source, with no duplicate row. Runs on a SQLite catalog and on a
Postgres catalog; the store is SQLite, so the pipeline's own state survives the kill too.
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

import duckdb
import pytest

from etl.testing.pytest_plugin import TestDatabase
from etl_spark.ducklake.files import STAGING
from etl_spark.ducklake.reader import open_lake
from etl_spark.testing import comparable_source_rows, lake_rows

TABLES = ("public.items", "public.ledger", "public.keyless")


@dataclass
class Setup:
    db: TestDatabase
    config: Path
    catalog: str
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
        """SIGKILL the pipeline as soon as Spark writes a batch's files (before their catalog commit).

        Spark writes each batch into a new directory under the staging directory; killed writes leave theirs.
        """
        deadline = time.monotonic() + timeout
        earlier = self._staged()
        while not self._staged() - earlier:
            assert self.alive(), "etl run exited"
            assert time.monotonic() < deadline, "no batch was written"
            time.sleep(0.01)
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        # A finished write removes its staging directory: this one is still there, so the kill was mid-write.
        assert self._staged() - earlier, "the batch was written before the kill landed"

    def _staged(self) -> set[str]:
        return {p.name for p in self.staging.iterdir()} if self.staging.is_dir() else set()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                assert self.process.wait(timeout=120) == 0
            finally:
                self.process.kill()

    def wait_equal(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                with self.db.connect() as conn:
                    expected = {t: comparable_source_rows(conn, t) for t in TABLES}
                con = open_lake(self.catalog)
                try:
                    last = {t: lake_rows(con, t) for t in TABLES}
                finally:
                    con.close()
                if last == expected:
                    return
            except duckdb.Error as exc:  # not created yet
                last = exc
            assert self.alive(), "etl run exited"
            assert time.monotonic() < deadline, f"DuckDB never read the source's rows; last read: {str(last)[:2000]}"
            time.sleep(0.5)

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
    db.execute(
        """
        CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int, updated timestamptz);
        INSERT INTO items SELECT g, 'item ' || g, g % 100, timestamptz '2026-01-01 00:00+00' + g * interval '1 s'
            FROM generate_series(1, 20000) g;
        CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item bigint, delta int);
        INSERT INTO ledger (item, delta) SELECT g % 1000, g % 7 - 3 FROM generate_series(1, 5000) g;
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
type = "ducklake"
catalog = "{catalog}"
data_path = "{data}/"
[destination.spark]
master = "local[2]"
conf = {{ "spark.sql.shuffle.partitions" = "2" }}
"""
    )
    setup = Setup(db, config, catalog, data / STAGING)
    try:
        yield setup
    finally:
        setup.stop()
        if request.param == "postgres":
            db.cluster.drop_database(lake_db)


def test_sigkill_mid_batch_during_copy_and_streaming(setup: Setup) -> None:
    db = setup.db
    # During the copy: Spark is writing a copied chunk.
    setup.start()
    setup.kill_mid_batch()
    db.execute("UPDATE items SET qty = -1 WHERE id % 1000 = 0; DELETE FROM ledger WHERE id % 10 = 0")
    setup.start()
    setup.wait_equal()

    # During streaming: Spark is writing the files of a batch of changes while the workload runs on.
    done = threading.Event()

    def workload() -> None:
        with db.connect() as conn:
            for i in range(300):
                with conn.transaction():
                    conn.execute("INSERT INTO ledger (item, delta) VALUES (%s, 1)", (i,))
                    conn.execute("UPDATE items SET qty = qty + 1, name = name || '+' WHERE id = %s", (i % 50 + 1,))
                    conn.execute("UPDATE items SET id = id + 100000 WHERE id = %s", (i + 1000,))
                    conn.execute("DELETE FROM ledger WHERE id = %s", (i * 7 + 1,))
                    conn.execute("INSERT INTO keyless VALUES (%s, 'dup')", (i % 3,))
                    conn.execute(
                        "DELETE FROM keyless WHERE ctid IN (SELECT ctid FROM keyless WHERE a = %s LIMIT 1)", (i % 5,)
                    )
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
