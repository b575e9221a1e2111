"""SIGKILL ``etl run`` into DuckLake in the middle of a batch, during the copy and during streaming; restart it.

"In the middle of a batch" is observed, not guessed: the kill comes while data files of a copy or a
batch are in the lake but not yet registered in the catalog, and such a file is still unregistered
after the kill; a kill during a flush of inlined rows comes while the flush's file is written and
not yet registered, and a kill during maintenance while a merged or rewritten file is written and
not yet registered. Maintenance runs every second throughout. Streamed rows of the tables without
array columns are inlined into the catalog. After each restart DuckDB must read every table equal to
the source, with no duplicate row. Runs on a SQLite catalog and on a Postgres catalog, with Spark in
one JVM (``local[2]``) and as a standalone cluster of two executor JVMs (``local-cluster[2,1,1024]``);
the store is SQLite, so the pipeline's own state survives the kill too.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from etl.testing.pipelines import pipeline_config, poll
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config
from etl.testing.workload import churn, concurrent_transactions, create_items_and_ledger
from etl_spark.ducklake.catalog import engine_for
from etl_spark.ducklake.reader import open_lake
from etl_spark.testing import comparable_source_rows, lake_rows

pytestmark = pytest.mark.slow  # see docs/testing.md

TABLES = ("public.items", "public.ledger", "public.keyless")


@dataclass
class Setup:
    db: TestDatabase
    run: PipelineProcess
    catalog: str
    data: Path
    last_read: tuple[object, dict[str, list[dict[str, object]]]] | None = None

    def staged(self) -> set[str]:
        """Data files written into the lake that its catalog does not register (yet), nor schedules for deletion
        (the files that merges replaced)."""
        on_disk = {p.name for p in self.data.rglob("ducklake-*.parquet")}
        if not on_disk:
            return set()
        with self.engine.connect() as conn:
            registered = {
                str(path).rsplit("/", 1)[-1]
                for (path,) in conn.exec_driver_sql(
                    "SELECT path FROM ducklake_data_file UNION ALL SELECT path FROM ducklake_delete_file"
                    " UNION ALL SELECT path FROM ducklake_files_scheduled_for_deletion"
                )
            }
        return on_disk - registered

    def files(self) -> set[tuple[str, int]]:
        """The lake's data files on disk with their sizes: what ``staged`` sees change first (a cheap probe)."""
        found = set()
        for path in self.data.rglob("ducklake-*.parquet"):
            try:
                found.add((path.name, path.stat().st_size))
            except FileNotFoundError:  # deleted meanwhile
                continue
        return found

    @functools.cached_property
    def engine(self) -> Engine:
        """One engine for the test's catalog reads: a poll that connects anew is slow enough to miss a write."""
        return engine_for(self.catalog)

    def staged_flushes(self) -> set[str]:
        """Staged files of flushed inlined rows: of the ledger (its rows are inlined), holding row ids."""
        return self._staged_with_row_ids("ledger")

    def staged_compactions(self) -> set[str]:
        """Staged files of a merge or a rewrite: of items (its rows are never inlined), holding row ids."""
        return self._staged_with_row_ids("items")

    def _staged_with_row_ids(self, table: str) -> set[str]:
        found = set()
        for name in self.staged():
            try:
                names = pq.read_schema(next(self.data.rglob(f"{table}/{name}"))).names
            except (OSError, StopIteration, pa.ArrowInvalid):  # still being written, or registered and gone
                continue
            if "_ducklake_internal_row_id" in names:
                found.add(name)
        return found

    def source(self) -> dict[str, list[dict[str, object]]]:
        with self.db.connect() as conn:
            return {t: comparable_source_rows(conn, t) for t in TABLES}

    def lake(self) -> dict[str, list[dict[str, object]]]:
        """Every table as DuckDB reads the lake; read again only once the catalog has a newer snapshot (each
        change of the lake's rows makes one), as the polls of ``wait_equal`` run long after it last changed."""
        with self.engine.connect() as conn:
            latest = conn.exec_driver_sql("SELECT max(snapshot_id) FROM ducklake_snapshot").scalar()
        if self.last_read is not None and self.last_read[0] == latest:
            return self.last_read[1]
        con = open_lake(self.catalog)
        try:
            rows = {t: lake_rows(con, t) for t in TABLES}
        finally:
            con.close()
        self.last_read = (latest, rows)
        return rows

    def wait_equal(self) -> None:
        # not created yet: duckdb.Error (no table), DBAPIError (no catalog)
        self.run.wait_equal(self.source, self.lake, not_yet=(duckdb.Error, DBAPIError))

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


@pytest.fixture(params=["local[2]", "local-cluster[2,1,1024]"])
def spark_master(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sqlite", "postgres"], ids=["sqlite-catalog", "postgres-catalog"])
def setup(
    request: pytest.FixtureRequest, pg_database: TestDatabase, tmp_path: Path, spark_master: str
) -> Iterator[Setup]:
    db = pg_database
    create_items_and_ledger(db, items=20000, ledger=5000)
    db.execute(
        """
        ALTER TABLE items ADD COLUMN tags text[], ADD COLUMN uid uuid;
        UPDATE items SET tags = ARRAY[name, NULL], uid = md5(id::text)::uuid WHERE id % 3 <> 0;
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
        # Batches cut at 8 MiB even while a write runs: the flush and maintenance phases below need a batch or so
        # per transaction, where batches grown meanwhile would carry all of a phase's transactions in one or two.
        batch={"max_fill_ms": 300, "busy_max_bytes": 8 * 1024 * 1024},
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={
            "type": "ducklake",
            "catalog": catalog,
            "data_path": f"{data}/",
            "spark": {"master": spark_master, "conf": {"spark.sql.shuffle.partitions": "2"}},
            "driver_copy_max_bytes": 0,  # the tables are small; their copies are killed in the middle of Spark jobs
            "inline_flush_rows": 20_000,
            # Flushes by Spark tasks, whose files stay staged long enough to be killed in; one on the driver writes
            # its file as a batch's upserts are, which the streaming phase kills in the middle of.
            "driver_flush_max_rows": 0,
            "maintenance": {
                "every_seconds": 1,
                "merge_min_files": 4,
                "snapshot_retention_seconds": 30,
                # Deleted files go soon, yet not while a DuckDB read of this test (a few seconds at most) may
                # still reach them: a cleanup with no delay fails the readers of the snapshot before it.
                "cleanup_after_seconds": 10,
                "orphan_after_seconds": 60,
            },
        },
    )
    run = PipelineProcess(write_config(tmp_path / "pipeline.toml", config), log_level="info")
    setup = Setup(db, run, catalog, data)
    try:
        yield setup
    finally:
        run.stop(timeout=120)
        setup.engine.dispose()  # before the catalog database is dropped
        if request.param == "postgres":
            db.cluster.drop_database(lake_db)


@pytest.mark.first_major
def test_sigkill_mid_batch_during_copy_and_streaming(setup: Setup) -> None:
    db = setup.db
    # During the copy: Spark tasks are writing the tables' data files.
    setup.run.start()
    setup.run.kill_mid_write(setup.staged, probe=setup.files)
    db.execute("UPDATE items SET qty = -1 WHERE id % 1000 = 0; DELETE FROM ledger WHERE id % 10 = 0")
    setup.run.start()
    setup.wait_equal()

    # During streaming: a batch's files are written, not yet committed, while the workload runs on.
    def transaction(conn: psycopg.Connection[Any], i: int) -> None:
        churn(conn, i, key_updates=True)
        conn.execute("INSERT INTO keyless VALUES (%s, 'dup')", (i % 3,))
        conn.execute("DELETE FROM keyless WHERE ctid IN (SELECT ctid FROM keyless WHERE a = %s LIMIT 1)", (i % 5,))

    with concurrent_transactions(db, transaction, count=300):
        time.sleep(0.5)
        setup.run.kill_mid_write(setup.staged, probe=setup.files)
        setup.run.start()

    # During a flush of inlined rows: their file is written, the catalog still holds them inlined. Each
    # transaction updates the whole ledger: its thousands of row images are inlined, and once the ledger's
    # inlined data holds 20,000 rows (ended ones count) they are flushed into one file. The workload goes on until
    # a flush is caught (a pipeline slowed by a busy machine flushes later, and a flush may end between two polls).
    def whole_ledger(conn: psycopg.Connection[Any], i: int) -> None:
        conn.execute("UPDATE ledger SET delta = delta + 1")

    with concurrent_transactions(db, whole_ledger, count=400, pause=0.2) as workload:
        setup.run.kill_mid_write(setup.staged_flushes, timeout=120, probe=setup.files)
        workload.finish(after=3)  # a few changes while the pipeline is down; the rest would only add time
    setup.run.start()
    db.execute("TRUNCATE ledger")
    db.execute("INSERT INTO ledger (item, delta) SELECT g, g FROM generate_series(1, 3000) g")
    setup.wait_equal()

    # During the flush that comes before a change of columns: the ledger's rows are inlined, and the batch
    # that adds a column flushes them first (their file written, the catalog still holding them inlined).
    # A few rows streamed just before are inlined for certain: the rows above may have reached the flush
    # threshold, and a flush of their own would leave nothing for this one to write.
    db.execute("INSERT INTO ledger (item, delta) SELECT g, 1 FROM generate_series(1, 10) g")
    setup.wait_equal()
    db.execute("ALTER TABLE ledger ADD COLUMN note text; UPDATE ledger SET note = 'n' || id WHERE id % 2 = 0")
    setup.run.kill_mid_write(setup.staged_flushes, timeout=120, probe=setup.files)
    setup.run.start()
    setup.wait_equal()

    # During maintenance: each batch writes a file of items, and once there are four they are merged
    # (the files with many deletes rewritten first); the merged file is written, the old ones still
    # registered.
    with concurrent_transactions(db, transaction, count=600, pause=0.1) as workload:
        setup.run.kill_mid_write(setup.staged_compactions, timeout=120, probe=setup.files)
        workload.finish(after=20)
    setup.run.start()
    setup.wait_equal()
    assert setup.duplicates() == 0


def executor_jvms(root: int) -> list[int]:
    """PIDs of Spark executor JVMs among the descendants of ``root`` (local-cluster: workers start them)."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            stack.append(child)
            if "CoarseGrainedExecutorBackend" in commands.get(child, ""):
                found.append(child)
    return found


@pytest.mark.first_major  # Spark's task retry and the lake's cleanup: the source is only read
def test_an_executor_killed_mid_copy_is_replaced_and_the_lake_ends_equal(
    pg_database: TestDatabase, tmp_path: Path
) -> None:
    """SIGKILL one executor JVM while the copy's tasks write: Spark runs its tasks again elsewhere, the
    lake ends equal to the source, and no file of the killed attempts is left in the lake."""
    db = pg_database
    create_items_and_ledger(db, items=400_000, ledger=10)
    db.execute("CREATE PUBLICATION pub FOR TABLE items, ledger")
    catalog = f"sqlite:///{tmp_path}/catalog.sqlite"
    data = tmp_path / "lake-data"
    config = pipeline_config(
        db,
        pipeline_id=9,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={
            "type": "ducklake",
            "catalog": catalog,
            "data_path": f"{data}/",
            "spark": {"master": "local-cluster[2,1,1024]", "conf": {"spark.sql.shuffle.partitions": "2"}},
            "driver_copy_max_bytes": 0,
        },
    )
    run = PipelineProcess(write_config(tmp_path / "pipeline.toml", config), log_level="info")
    setup = Setup(db, run, catalog, data)
    try:
        run.start()

        def executors() -> list[int]:
            run.ensure_alive()
            return executor_jvms(run.process.pid if run.process else 0)

        victim = poll(
            lambda: (setup.staged(), executors()),
            "the copy's tasks to start writing (staged files, executors)",
            until=lambda seen: bool(seen[0]) and len(seen[1]) == 2,
            timeout=240,
        )[1][0]
        os.kill(victim, signal.SIGKILL)
        with db.connect() as conn:
            expected = {t: comparable_source_rows(conn, t) for t in ("public.items", "public.ledger")}

        def lake() -> dict[str, list[dict[str, object]]]:
            con = open_lake(catalog)
            try:
                return {t: lake_rows(con, t) for t in expected}
            finally:
                con.close()

        run.wait_equal(lambda: expected, lake, not_yet=(duckdb.Error,))
        assert setup.staged() == set(), "files of the killed attempts were left in the lake"
        # The standalone worker started a new executor in place of the killed one.
        poll(executors, "an executor in its place", until=lambda jvms: len(jvms) >= 2, timeout=240, least=0.1)
    finally:
        run.stop(timeout=120)
