"""The destinations' own Prometheus series (``register_metrics``), checked against what they really wrote.

DuckLake and BigQuery run in real pipelines (the engine calls ``register_metrics`` with its registry at
start); the counters are compared with the lake's catalog (files and their sizes, snapshots) and with
the load jobs the local BigQuery server ran.
"""

from __future__ import annotations

import contextlib
import sqlite3
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
import pytest
from prometheus_client import CollectorRegistry

from etl.destination.memory import MemoryDestination
from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.schema import ColumnSchema, TableName, TableSchema
from etl.testing.pipelines import all_ready, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.bigquery.names import table_id
from etl_spark.ducklake import batch_commits
from etl_spark.ducklake.plan import plan_changes
from etl_spark.ducklake.reader import open_lake
from etl_spark.testing import comparable_source_rows, lake_rows
from etl_spark.testing.bigquery_emulator import PROJECT, BigQueryEmulator

SPARK = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def start(config: Any) -> Pipeline:
    store = build_store(config, "test")
    pipeline = Pipeline(config, store, build_destination(config, store, "test"))
    pipeline.start()
    return pipeline


def lake_equals_source(db: TestDatabase, catalog: str, table: str) -> bool:
    with db.connect() as conn:
        expected = comparable_source_rows(conn, table)
    try:
        con = open_lake(catalog)
    except duckdb.Error:
        return False
    try:
        return lake_rows(con, table) == expected
    except duckdb.Error:  # not created yet
        return False
    finally:
        con.close()


@pytest.mark.slow
def test_ducklake_series_count_the_files_and_snapshots_a_pipeline_wrote(
    pg_database: TestDatabase, tmp_path: Path, spark: Any
) -> None:
    db = pg_database
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g"
    )
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    catalog = f"sqlite:///{tmp_path}/catalog.sqlite"
    config = pipeline_config(
        db, destination={"type": "ducklake", "catalog": catalog, "data_path": f"{tmp_path}/data/", "spark": SPARK}
    )
    pipeline = start(config)
    registry = pipeline.metrics.registry
    try:
        wait_until(lambda: all_ready(pipeline, 1), "copied", pipeline, timeout=240)
        assert value(registry, "etl_ducklake_files_written_total", kind="data") >= 1
        assert value(registry, "etl_ducklake_commit_seconds_count") >= 1
        # One transaction: its updates and delete find their rows in the copied file -> a delete file; the
        # 11 new row images are inlined into the catalog.
        with db.connect() as conn, conn.transaction():
            conn.execute("UPDATE t SET v = 'changed' WHERE id <= 10")
            conn.execute("DELETE FROM t WHERE id = 100")
            conn.execute("INSERT INTO t VALUES (101, 'new')")
        wait_until(lambda: lake_equals_source(db, catalog, "public.t"), "streamed", pipeline, timeout=240)
    finally:
        pipeline.shutdown()

    with contextlib.closing(sqlite3.connect(f"{tmp_path}/catalog.sqlite")) as cat:
        data_files, data_bytes = cat.execute("SELECT count(*), sum(file_size_bytes) FROM ducklake_data_file").fetchone()
        delete_bytes = cat.execute("SELECT coalesce(sum(file_size_bytes), 0) FROM ducklake_delete_file").fetchone()[0]
        snapshots = cat.execute("SELECT count(*) FROM ducklake_snapshot WHERE snapshot_id > 0").fetchone()[0]
    assert value(registry, "etl_ducklake_files_written_total", kind="data") == data_files >= 1  # the copy
    assert value(registry, "etl_ducklake_inlined_rows_total") == 11
    assert value(registry, "etl_ducklake_bytes_written_total", kind="data") == data_bytes
    assert value(registry, "etl_ducklake_files_written_total", kind="delete") >= 1
    assert value(registry, "etl_ducklake_bytes_written_total", kind="delete") >= delete_bytes > 0
    assert value(registry, "etl_ducklake_commit_seconds_count") == snapshots  # one catalog transaction each
    assert value(registry, "etl_ducklake_commit_seconds_sum") > 0
    assert value(registry, "etl_ducklake_commit_conflicts_total") == 0


ITEMS = TableSchema(
    16700,
    TableName("main", "items"),
    (ColumnSchema("id", 23, nullable=False, primary_key=True), ColumnSchema("label", 25)),
)


@pytest.mark.parametrize("lake", ["sqlite"], indirect=True)
def test_ducklake_counts_a_conflict_and_records_on_a_private_registry_until_registered(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    destination = kit.make_destination(lake, inline_row_limit=0)  # never registered: its own registry
    for part in (range(5), range(5, 10)):
        destination.write_table_rows(ITEMS, kit.rows_table(ITEMS, [{"id": i, "label": f"l{i}"} for i in part]))
    private = destination.metrics.registry
    assert value(private, "etl_ducklake_files_written_total", kind="data") == 2
    assert value(private, "etl_ducklake_commit_seconds_count") == 2

    registry = CollectorRegistry()
    destination.register_metrics(registry)
    real_plan = plan_changes
    plans = []

    def plan_then_compact(dest: Any, segment: Any, inline_limit: int, state: Any) -> Any:
        plan = real_plan(dest, segment, inline_limit, state)
        plans.append(plan)
        if len(plans) == 1:  # DuckDB compacts after the positions were found, before the commit
            con = lake.duckdb()
            con.execute("CALL ducklake_merge_adjacent_files('lake')")
            con.close()
        return plan

    monkeypatch.setattr(batch_commits, "plan_changes", plan_then_compact)
    batch = kit.BatchBuilder().commit().update(ITEMS, {"id": 7, "label": "x"}).delete(ITEMS, {"id": 1}).build()
    destination.write_events(batch)
    reference = MemoryDestination()
    reference.write_table_rows(ITEMS, kit.rows_table(ITEMS, [{"id": i, "label": f"l{i}"} for i in range(10)]))
    reference.write_events(batch)
    assert sorted(lake.query("SELECT id, label FROM lake.main.items")) == sorted(
        (r["id"], r["label"]) for r in reference.rows("main.items")
    )
    assert value(registry, "etl_ducklake_commit_conflicts_total") == 1
    assert value(registry, "etl_ducklake_commit_seconds_count") == 1  # the retry that committed
    assert value(registry, "etl_ducklake_files_written_total", kind="data") == 2  # the upsert file, twice
    assert value(registry, "etl_ducklake_files_written_total", kind="delete") == 1  # written inside the commit
    assert value(private, "etl_ducklake_commit_conflicts_total") == 0  # nothing recorded there any more
    destination.shutdown()


def bigquery_rows(bigquery_emulator: BigQueryEmulator, dataset: str, table: str) -> list[tuple[Any, ...]]:
    client = bigquery_emulator.client()
    try:
        path = f"{PROJECT}.{dataset}.{table_id(TableName.parse(table))}"
        return sorted(tuple(r.values()) for r in client.query_and_wait(f"SELECT id, v FROM `{path}`"))
    except Exception:  # not created yet
        return []
    finally:
        client.close()  # type: ignore[no-untyped-call]


def source_rows(db: TestDatabase, table: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in db.execute(f"SELECT id, v FROM {table}"))


@pytest.mark.slow
def test_bigquery_series_count_load_jobs_per_table_and_the_dml(
    pg_database: TestDatabase, tmp_path: Path, spark: Any, bigquery_emulator: BigQueryEmulator
) -> None:
    db = pg_database
    db.execute(
        "CREATE TABLE a (id int PRIMARY KEY, v text); INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 50) g"
    )
    db.execute("CREATE TABLE b (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE a, b")
    dataset = f"metrics_pg{db.major}"  # the bigquery_emulator serves every Postgres major's run of this module
    destination = {
        "type": "bigquery",
        "project": PROJECT,
        "dataset": dataset,
        "staging_uri": "gs://staging/etl",
        "staging_local_dir": str(bigquery_emulator.bucket_dir("staging")),
        "min_apply_interval_s": 0,
        "endpoint": bigquery_emulator.endpoint,
        "spark": SPARK,
    }
    pipeline = start(pipeline_config(db, destination=destination))
    registry = pipeline.metrics.registry
    try:
        wait_until(lambda: all_ready(pipeline, 2), "copied", pipeline, timeout=240)
        assert value(registry, "etl_bigquery_load_jobs_total", table="public.a") == 1  # one copy batch
        assert value(registry, "etl_bigquery_load_jobs_total", table="public.b") == 0  # empty: nothing loaded
        db.execute("UPDATE a SET v = 'changed' WHERE id <= 5; INSERT INTO b VALUES (1, 'b1'), (2, 'b2')")

        def streamed(table: str) -> bool:
            return bigquery_rows(bigquery_emulator, dataset, f"public.{table}") == source_rows(db, table)

        for table in ("a", "b"):
            wait_until(partial(streamed, table), f"{table} streamed", pipeline, timeout=240)
    finally:
        pipeline.shutdown()

    client = bigquery_emulator.client()
    try:
        loads = sum(
            1
            for job in client.list_jobs(all_users=True)
            if job.job_type == "load" and job.destination.dataset_id == dataset
        )
    finally:
        client.close()  # type: ignore[no-untyped-call]
    batches = value(registry, "etl_bigquery_load_jobs_total", table="*")  # a streamed batch: one load, all tables
    assert batches >= 1
    assert value(registry, "etl_bigquery_load_jobs_total", table="public.a") + batches == loads
    assert value(registry, "etl_bigquery_bytes_loaded_total") > 0
    assert value(registry, "etl_bigquery_dml_seconds_count") >= loads  # each load is applied by DML
    assert value(registry, "etl_bigquery_dml_seconds_sum") > 0
