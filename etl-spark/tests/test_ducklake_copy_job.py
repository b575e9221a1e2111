"""A table's copy as a Spark job (``DuckLakeDestination.copy_table``) from a real Postgres, read back by DuckDB.

The ranges are copied by Spark tasks, one per core, into data files written by pyarrow; the driver
only registers them. Checked here: DuckDB reads arrays as lists, uuid as UUID and time as TIME from those files,
row for row equal to the source; no copied row reaches the driver's code; a stopped copy leaves
nothing behind.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from etl.copy_plan import CopyPlan, CopyRange, CopyStopped
from etl.key_chunk import KeyChunk
from etl.lsn import Lsn
from etl.postgres.connection import connect
from etl.postgres.copy import plan_chunk
from etl.replication.tablesync import empty_table
from etl.schema import TableName
from etl.testing.copies import published_plan, stop_while_tasks_wait
from etl.testing.pytest_plugin import TestDatabase
from etl_spark import copy_tasks as copy_job_tasks
from etl_spark.copy_tasks import TaskRanges, copy_tasks
from etl_spark.ducklake.table_state import read_states
from etl_spark.testing import comparable_source_rows, duckdb_rows

TYPED = """
    CREATE TABLE typed (id int PRIMARY KEY, tags text[], nums int[], grid int[][], uid uuid, at time,
                        span interval, doc jsonb, uids uuid[], amount numeric(10,2));
    INSERT INTO typed
        SELECT g,
               CASE WHEN g % 5 = 0 THEN NULL ELSE ARRAY['t' || g, NULL, 'x,"y"'] END,
               CASE WHEN g % 7 = 0 THEN '{}' ELSE ARRAY[g, g + 1] END,
               CASE WHEN g % 3 = 0 THEN ARRAY[[g, 2], [3, NULL]] END,
               CASE WHEN g % 4 = 0 THEN NULL ELSE md5(g::text)::uuid END,
               CASE WHEN g = 1 THEN '23:59:59.999999'::time ELSE time '00:00' + g * interval '1.000001 s' END,
               g * interval '1 day 2 hours 3.000004 s',
               jsonb_build_object('g', g),
               ARRAY[md5(g::text)::uuid, NULL],
               g / 8.0
          FROM generate_series(1, 3000) g;
    CREATE PUBLICATION pub FOR TABLE typed;
"""


def typed_plan(db: TestDatabase, parts: int) -> CopyPlan:
    return published_plan(db, TYPED, parts)


def lake_typed(lake: Any) -> list[dict[str, Any]]:
    """The lake's rows, ``span`` left out (psycopg and DuckDB give intervals in other Python types)."""
    con = lake.duckdb()
    try:
        assert con.execute(
            "SELECT count(*) FROM lake.public.typed WHERE span <> id * INTERVAL '1 day 2 hours 3.000004 seconds'"
        ).fetchone() == (0,)
        return duckdb_rows(con, "SELECT * EXCLUDE (span) FROM lake.public.typed")
    finally:
        con.close()


def source_typed(db: TestDatabase) -> list[dict[str, Any]]:
    with connect(db.connection()) as conn:
        return [{k: v for k, v in row.items() if k != "span"} for row in comparable_source_rows(conn, "public.typed")]


def test_copy_job_writes_native_lists_uuids_and_times(pg_database: TestDatabase, lake: Any, kit: Any) -> None:
    plan = typed_plan(pg_database, parts=4)
    assert len(plan.ranges) > 1
    destination = kit.make_destination(lake)
    assert destination.copy_table(plan, threading.Event()) == 3000

    types = dict(lake.query("SELECT column_name, column_type FROM (DESCRIBE lake.public.typed)"))
    assert types == {
        "id": "INTEGER",
        "tags": "VARCHAR[]",
        "nums": "INTEGER[]",
        "grid": "INTEGER[][]",
        "uid": "UUID",
        "at": "TIME",
        "span": "INTERVAL",
        "doc": "JSON",
        "uids": "UUID[]",
        "amount": "DECIMAL(10,2)",
    }
    assert lake_typed(lake) == source_typed(pg_database)
    # One snapshot (after the lake's first, which made it) registers every file of the copy.
    assert lake.query("SELECT max(snapshot_id) FROM ducklake_snapshots('lake')") == [(1,)]
    assert lake.query("SELECT count(*) FROM ducklake_list_files('lake', 'typed', schema => 'public')")[0][0] > 1
    assert lake.query("SELECT tags FROM lake.public.typed WHERE id = 1") == [(["t1", None, 'x,"y"'],)]
    assert lake.query("SELECT count(*) FROM lake.public.typed WHERE list_contains(nums, 11)") == [(2,)]


def test_ranges_are_spread_over_a_task_per_core(pg_database: TestDatabase, lake: Any, kit: Any) -> None:
    """Eight ranges on two cores: two tasks of four ranges each, each task writing one file for all of them."""
    plan = typed_plan(pg_database, parts=8)
    assert len(plan.ranges) == 8
    destination = kit.make_destination(lake)
    assert destination.lake.spark.sparkContext.defaultParallelism == 2
    assert destination.copy_table(plan, threading.Event()) == 3000
    assert lake_typed(lake) == source_typed(pg_database)
    assert lake.query("SELECT count(*) FROM ducklake_list_files('lake', 'typed', schema => 'public')") == [(2,)]


def test_a_copy_runs_a_task_per_core_and_at_least_one_per_copy_connection() -> None:
    def ranges(sources: int, each: int) -> list[CopyRange]:
        return [CopyRange(TableName("public", f"leaf_{s}"), None) for s in range(sources) for _ in range(each)]

    assert copy_tasks(ranges(1, 8), 2) == 2  # copy_connections = 2 on two cores
    assert copy_tasks(ranges(1, 8), 64) == 8  # never more tasks than ranges
    assert copy_tasks(ranges(1, 128), 2) == 32  # copy_connections = 32 while the cluster's executors still register
    assert copy_tasks(ranges(100, 16), 16) == 16  # 100 leaves, copy_connections = 4: the cores, not 400 tasks
    assert copy_tasks(ranges(3, 1), 2) == 2  # three leaves copied whole (copy_connections = 1), on two cores
    assert copy_tasks([], 2) == 0


def test_copy_tasks_take_every_range_once_each_in_turn(
    pg_database: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Task ``i`` of ``n`` copies ranges ``i``, ``i + n``, ...: together every range once; pickled as Spark ships it."""
    plan = typed_plan(pg_database, parts=8)
    tasks = pickle.loads(pickle.dumps(TaskRanges(plan, 3)))
    monkeypatch.setattr(
        copy_job_tasks, "read_ranges", lambda plan, indexes: iter(indexes)
    )  # the ranges, not their rows
    assert [list(tasks(task)) for task in range(3)] == [[0, 3, 6], [1, 4, 7], [2, 5]]


def test_no_copied_row_reaches_the_driver(
    pg_database: TestDatabase, lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver neither reads the source's rows nor writes data files, nor hands rows to Spark."""
    plan = typed_plan(pg_database, parts=2)
    destination = kit.make_destination(lake)
    destination.lake.spark  # noqa: B018 - started before the traps below

    def trap(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("copied rows passed through the driver")

    from pyspark.sql import SparkSession

    import etl.postgres.copy_session
    import etl_spark.ducklake.storage

    # Spark tasks run in Python workers of their own, which these patches of the driver do not reach.
    monkeypatch.setattr(SparkSession, "createDataFrame", trap)
    monkeypatch.setattr(etl.postgres.copy_session.CopySession, "copy", trap)
    monkeypatch.setattr(etl_spark.ducklake.storage, "write_data_files", trap)
    assert destination.copy_table(plan, threading.Event()) == 3000
    assert lake_typed(lake) == source_typed(pg_database)


def test_a_stopped_copy_leaves_no_table_and_no_file(pg_database: TestDatabase, lake: Any, kit: Any) -> None:
    setup = (
        "CREATE TABLE big (id int PRIMARY KEY, v text);"
        " INSERT INTO big SELECT g, repeat('v', 200) FROM generate_series(1, 200000) g;"
        " CREATE PUBLICATION pub FOR TABLE big"
    )
    plan = published_plan(pg_database, setup, 8)
    destination = kit.make_destination(lake)
    stop_while_tasks_wait(pg_database, "big", lambda stop: destination.copy_table(plan, stop), tasks=2)  # local[2]
    assert lake.query("SELECT count(*) FROM information_schema.tables WHERE table_name = 'big'") == [(0,)]
    assert list(Path(lake.data_path).rglob("*.parquet")) == []


def test_a_small_table_is_copied_on_the_driver_into_the_same_lake_types(
    pg_database: TestDatabase, lake: Any, kit: Any
) -> None:
    """Under ``driver_copy_max_bytes`` the copy runs in this process, with no Spark job: the same lists, UUIDs and
    times as the Spark copy writes, the rows equal to the source's; the metric says where each table was copied."""
    plan = typed_plan(pg_database, parts=4)
    assert plan.size_bytes is not None and 0 < plan.size_bytes < 4 * 1024 * 1024
    destination = kit.make_destination(lake, driver_copy_max_bytes=plan.size_bytes)
    assert destination.copy_table(plan, threading.Event()) == 3000
    assert lake_typed(lake) == source_typed(pg_database)
    copies = destination.metrics.copies
    assert (copies.labels("driver")._value.get(), copies.labels("spark")._value.get()) == (1, 0)

    destination.shutdown()
    bigger = kit.make_destination(lake, driver_copy_max_bytes=plan.size_bytes - 1)  # the same pipeline, a copy again
    bigger.drop_table_for_copy(plan.schema)
    assert bigger.copy_table(plan, threading.Event()) == 3000
    assert (
        bigger.metrics.copies.labels("driver")._value.get(),
        bigger.metrics.copies.labels("spark")._value.get(),
    ) == (0, 1)


def test_chunks_of_an_incremental_copy_are_copied_on_the_driver_or_by_spark_each_with_its_watermark(
    pg_database: TestDatabase, lake: Any, kit: Any
) -> None:
    """``stage_chunk``: each chunk, planned by key in a snapshot of its own (``plan_chunk``), is written into files
    no snapshot holds, under ``driver_copy_max_bytes`` on the driver, above it by Spark's tasks (the metric says
    which); ``commit_chunk``, after the snapshot is gone, adds them to the table as it is in a snapshot that moves
    the table's watermark to the chunk's place in the stream. A chunk discarded leaves no file."""
    plan = typed_plan(pg_database, parts=1)
    pg_database.execute("ANALYZE typed")  # a chunk's bytes are estimated from the planner's row count
    destination = kit.make_destination(lake)
    destination.write_table_rows(plan.schema, empty_table(plan.schema))  # as an incremental copy takes a table on
    chunks = destination.metrics.chunks
    for n, (after, rows) in enumerate([(None, 2000), (("2000",), 1000)]):
        with plan_chunk(pg_database.connection(), plan.schema, None, KeyChunk(("id",), after, 2000), parts=2) as (
            _,
            _,
            keys,
            chunk_plan,
            _,
        ):
            assert (keys.rows, keys.last) == (rows, ("3000",) if after else ("2000",))
            assert len(chunk_plan.ranges) == 2 and chunk_plan.size_bytes is not None and plan.size_bytes is not None
            assert 0 < chunk_plan.size_bytes < plan.size_bytes  # its share of the table
            threshold = {"driver_copy_max_bytes": chunk_plan.size_bytes - n}  # the first on the driver
            destination.config = destination.config.model_copy(update=threshold)
            files = set(Path(lake.data_path).rglob("*.parquet"))
            discarded = destination.stage_chunk(chunk_plan, (Lsn(0x100 + n), 7), threading.Event())
            destination.discard_chunk(discarded)
            assert set(Path(lake.data_path).rglob("*.parquet")) == files
            staged = destination.stage_chunk(chunk_plan, (Lsn(0x100 + n), 7), threading.Event())
        assert lake.query("SELECT count(*) FROM lake.public.typed") == [(2000 * n,)]  # staged, not visible
        assert destination.commit_chunk(staged) == rows
        watermark = read_states(destination.catalog, [plan.schema])[plan.schema.id].handle.watermark
        assert watermark == (0x100 + n, 7)
    assert (chunks.labels("driver")._value.get(), chunks.labels("spark")._value.get()) == (1, 1)  # committed ones
    assert lake_typed(lake) == source_typed(pg_database)


def test_a_stopped_copy_on_the_driver_leaves_nothing(pg_database: TestDatabase, lake: Any, kit: Any) -> None:
    plan = typed_plan(pg_database, parts=2)
    destination = kit.make_destination(lake, driver_copy_max_bytes=1 << 30)
    stop = threading.Event()
    stop.set()
    with pytest.raises(CopyStopped):
        destination.copy_table(plan, stop)
    assert lake.query("SELECT count(*) FROM information_schema.tables WHERE table_name = 'typed'") == [(0,)]
    assert list(Path(lake.data_path).rglob("*.parquet")) == []


def test_source_errors_in_tasks_reach_the_engine_as_its_own(pg_database: TestDatabase, lake: Any, kit: Any) -> None:
    """A task's copy that fails on the source is the engine's ``TableError``, with the server's message."""
    from etl.errors import TableError

    plan = typed_plan(pg_database, parts=2)
    pg_database.execute("DROP TABLE typed")
    destination = kit.make_destination(lake)
    with pytest.raises(TableError, match="typed"):
        destination.copy_table(plan, threading.Event())


def test_the_modules_a_task_imports_load_no_catalog_database_code() -> None:
    """Spark's Python workers import the copy job and the data-file writer for each task's code: without SQLAlchemy
    and the catalog's reads and commits (a third of a CPU second per worker process)."""
    code = (
        "import sys, etl_spark.ducklake.copy_job, etl_spark.ducklake.storage; "
        "print(sorted(m for m in ('sqlalchemy', 'etl_spark.ducklake.catalog.reads') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]"
