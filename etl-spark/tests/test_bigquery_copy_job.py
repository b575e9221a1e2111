"""A table's copy and an incremental copy's chunks into BigQuery by Spark's tasks (``TableCopier``, ``ChunkCopier``),
from a real Postgres into the local BigQuery server: no copied row on the driver, one load job and one statement
each, counted in the server's job list, the rows equal to the source's."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from etl.copy_plan import CopyPlan
from etl.errors import TableError
from etl.key_chunk import KeyChunk
from etl.lsn import Lsn
from etl.postgres.copy import plan_chunk
from etl.replication.tablesync import empty_table
from etl.testing.copies import published_plan, stop_while_tasks_wait
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.bigquery.destination import WATERMARKS, BigQueryDestination
from etl_spark.bigquery.names import STAGING_PREFIX, table_id
from etl_spark.testing.bigquery_emulator import BigQueryEmulator

ROWS = 3000
ITEMS = f"""
    CREATE TABLE items (id int PRIMARY KEY, note text, amount numeric(10,2), at timestamptz, doc jsonb, tags int[],
                        day date);
    INSERT INTO items
        SELECT g, CASE WHEN g % 9 = 0 THEN NULL ELSE 'n' || g END, g / 8.0,
               timestamptz '2026-01-01 00:00+00' + g * interval '1.000001 s', jsonb_build_object('g', g),
               CASE WHEN g % 5 = 0 THEN NULL ELSE ARRAY[g, g + 1] END, date '2026-01-01' + g
          FROM generate_series(1, {ROWS}) g;
    ANALYZE items;
    CREATE PUBLICATION pub FOR TABLE items;
"""


@pytest.fixture
def destination(
    bigquery_emulator: BigQueryEmulator, spark: Any, kit: Any, request: pytest.FixtureRequest
) -> BigQueryDestination:
    return kit.make_bigquery(bigquery_emulator, f"c_{request.node.name}")


def items_plan(db: TestDatabase, parts: int) -> CopyPlan:
    return published_plan(db, ITEMS, parts)


def stored(destination: BigQueryDestination, plan: CopyPlan) -> list[dict[str, Any]]:
    rows = destination.jobs.query(f"SELECT * FROM {destination.jobs.ref(table_id(plan.schema.name))} ORDER BY id")
    return [dict(r.items()) for r in rows]


def source(db: TestDatabase) -> list[dict[str, Any]]:
    """The source's rows as BigQuery holds them: JSON parsed, a NULL array as ``[]`` (docs/destinations/bigquery.md)."""
    with db.connect() as conn:
        cursor = conn.execute("SELECT id, note, amount, at, doc::text AS doc, tags, day FROM items ORDER BY id")
        names = [c.name for c in cursor.description or []]
        rows = [dict(zip(names, r, strict=True)) for r in cursor]
    return [r | {"doc": json.loads(r["doc"]), "tags": r["tags"] or []} for r in rows]


def jobs_into(destination: BigQueryDestination, plan: CopyPlan) -> tuple[int, int]:
    """(load jobs, query jobs that insert into the plan's table) the server ran for the destination's dataset."""
    target = destination.jobs.ref(table_id(plan.schema.name))
    jobs = list(destination.client.list_jobs(all_users=True))
    loads = [j for j in jobs if j.job_type == "load" and j.destination.dataset_id == destination.config.dataset]
    inserts = [j for j in jobs if j.job_type == "query" and f"INSERT INTO {target}" in j.query]
    return len(loads), len(inserts)


def no_rows_on_the_driver(destination: BigQueryDestination, monkeypatch: pytest.MonkeyPatch) -> None:
    """Traps on the driver for what would read or hand over copied rows there (Spark's tasks run in Python workers
    of their own, which these patches do not reach)."""
    from pyspark.sql import SparkSession

    import etl.postgres.copy_session

    destination.spark  # noqa: B018 - started before the traps

    def trap(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("copied rows passed through the driver")

    monkeypatch.setattr(SparkSession, "createDataFrame", trap)
    monkeypatch.setattr(etl.postgres.copy_session.CopySession, "copy", trap)


def test_a_copy_is_read_by_spark_tasks_loaded_once_and_inserted_once(
    pg_database: TestDatabase, destination: BigQueryDestination, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = items_plan(pg_database, parts=4)
    assert len(plan.ranges) == 4
    no_rows_on_the_driver(destination, monkeypatch)
    assert destination.copy_table(plan, threading.Event()) == ROWS
    assert stored(destination, plan) == source(pg_database)
    assert jobs_into(destination, plan) == (1, 1)
    copied = destination.metrics.copied_rows
    assert (copied.labels("spark")._value.get(), copied.labels("driver")._value.get()) == (ROWS, 0)
    assert not [
        t for t in destination.client.list_tables(destination.config.dataset) if t.table_id.startswith(STAGING_PREFIX)
    ]


def test_chunks_are_copied_by_spark_tasks_each_in_one_transaction_with_its_watermark(
    pg_database: TestDatabase, destination: BigQueryDestination, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = items_plan(pg_database, parts=1)
    destination.write_table_rows(plan.schema, empty_table(plan.schema))  # as an incremental copy takes a table on
    no_rows_on_the_driver(destination, monkeypatch)
    for n, (after, rows) in enumerate([(None, 2000), (("2000",), 1000)]):
        chunk = KeyChunk(("id",), after, 2000)
        with plan_chunk(pg_database.connection(), plan.schema, None, chunk, parts=2) as (_, _, keys, chunk_plan, _):
            assert keys.rows == rows and len(chunk_plan.ranges) == 2
            staged = destination.stage_chunk(chunk_plan, (Lsn(0x100 + n), 7), threading.Event())
        assert len(stored(destination, plan)) == 2000 * n  # staged, not visible
        assert destination.commit_chunk(staged) == rows
        watermark = destination.jobs.query(
            f"SELECT commit_lsn, tx_ordinal FROM {destination.jobs.ref(WATERMARKS)}"
            f" WHERE table_oid = {int(plan.schema.id)}"
        )
        assert [tuple(r.values()) for r in watermark] == [(0x100 + n, 7)]
        assert jobs_into(destination, plan) == (n + 1, n + 1)  # a load and a transaction per chunk
    assert stored(destination, plan) == source(pg_database)


def test_a_stopped_copy_leaves_no_row_no_staged_file_and_no_staging_table(
    pg_database: TestDatabase, destination: BigQueryDestination, bigquery_emulator: BigQueryEmulator
) -> None:
    plan = items_plan(pg_database, parts=4)
    stop_while_tasks_wait(pg_database, "items", lambda stop: destination.copy_table(plan, stop), tasks=2)  # local[2]
    assert stored(destination, plan) == []
    assert jobs_into(destination, plan) == (0, 0)
    assert list(Path(bigquery_emulator.bucket_dir("staging")).rglob("*.parquet")) == []


def test_a_value_bigquery_cannot_hold_fails_the_copy_as_a_table_error(
    pg_database: TestDatabase, destination: BigQueryDestination
) -> None:
    """The staging form is checked in the tasks: a task's error reaches the engine as its own, with its message."""
    plan = items_plan(pg_database, parts=2)
    pg_database.execute("UPDATE items SET at = 'infinity' WHERE id = 77")
    with pytest.raises(TableError, match="infinity"):
        destination.copy_table(plan, threading.Event())
    assert stored(destination, plan) == []
