"""Many tables per batch: changes spread over hundreds of tables, streamed live into DuckLake beside the workload.

A publication of ``--tables`` tables (``t_1`` ...; a bigint key, an int, a text) of ``--rows`` rows each. A DuckLake
pipeline (SQLite store and catalog, Spark ``local[2]``, engine defaults) copies them all and becomes ready, timed for
each ``--methods`` ([copy] method) into null and into DuckLake, against ``psql`` reading every table with ``COPY`` in
one session (issue 49's target: 200 tables ready in under 30 s). Then, while the pipeline streams, pgbench commits
``--rate`` transactions a second for ``--seconds`` over 4 connections, each updating a random row of three random tables
and inserting a row into a fourth (pgbench's own variables name the tables). Reported as by ``oltp.py --live``: the most
WAL the pipeline was behind, how long after pgbench stopped every transaction was durable in the lake,
``etl_commit_to_durable_seconds`` over the run (p50, p99) against issue 48's p99 < 5 s, the lake's data files (in all,
and at most in one table), and the longest writes. DuckDB then reads every table's row count back.

    .tox/tests/bin/python bench/many_tables.py [--tables 200] [--rows 1000] [--rate 200] [--seconds 60] [--major 18]
        [--methods snapshot incremental] [--ready-only]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import benchlib
from ducklake_copy import lake, lake_count, pipeline_config, start_spark
from oltp import Load, lake_store, live

from etl.api import Destination, Store
from etl.config import PipelineConfig
from etl.destination.null import NullDestination
from etl.pipeline import Pipeline
from etl.store.memory import MemoryStore
from etl.testing.pipelines import all_ready, wait_until
from etl_spark.ducklake.destination import DuckLakeDestination
from etl_spark.session import SparkSettings

PUBLICATION = "many_pub"
CHANGES_PER_TRANSACTION = 4


def build(src: benchlib.Source, tables: int, rows: int) -> tuple[str, ...]:
    """The tables, published, and their names."""
    names = tuple(f"t_{i}" for i in range(1, tables + 1))
    columns = "id bigserial PRIMARY KEY, n int NOT NULL DEFAULT 0, note text"
    src.execute(
        f"DO $$ BEGIN FOR i IN 1 .. {tables} LOOP"
        f" EXECUTE format('CREATE TABLE public.t_%s ({columns})', i);"
        f" EXECUTE format('INSERT INTO public.t_%s (note) SELECT ''row '' || g FROM generate_series(1, {rows}) g', i);"
        " END LOOP; END $$"
    )
    src.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(names)}")
    src.execute("VACUUM ANALYZE")
    return names


def script(path: Path, tables: int, rows: int) -> Path:
    """pgbench's script: three updates of random rows of random tables, an insert into a fourth."""
    path.write_text(
        "".join(f"\\set t{k} random(1, {tables})\n" for k in range(4))
        + f"\\set id random(1, {rows})\n"
        + "BEGIN;\n"
        + "".join(f"UPDATE t_:t{k} SET n = n + 1 WHERE id = :id;\n" for k in range(3))
        + "INSERT INTO t_:t3 (note) VALUES ('inserted');\n"
        + "END;\n"
    )
    return path


def ready_time(config: PipelineConfig, destination: Destination, store: Store, tables: int) -> float:
    """Seconds from the pipeline's start until all ``tables`` are ready (copied, caught up, streaming)."""
    pipeline = Pipeline(config, store, destination)
    started = time.perf_counter()
    pipeline.start()
    try:
        wait_until(lambda: all_ready(pipeline, tables), "every table ready", pipeline, timeout=1800)
        return time.perf_counter() - started
    finally:
        pipeline.shutdown(timeout=120)


def copy_all(src: benchlib.Source, tables: tuple[str, ...]) -> float:
    """The limit: ``psql`` reading every table with ``COPY ... TO STDOUT`` in one session, one after another."""
    commands = [arg for table in tables for arg in ("-c", f"COPY {table} TO STDOUT")]
    return benchlib.timed(src.client("psql", "-q", "-d", benchlib.DATABASE, *commands))


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--tables", type=int, default=200, help="published tables (default 200)")
    parser.add_argument("--rows", type=int, default=1000, help="rows in each table before the workload (default 1000)")
    parser.add_argument("--rate", type=int, default=200, help="transactions a second (default 200)")
    parser.add_argument("--seconds", type=int, default=60, help="how long pgbench runs (default 60)")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["snapshot", "incremental"],
        choices=["snapshot", "incremental"],
        help="[copy] methods whose ready time is measured, each into null and DuckLake (default both)",
    )
    parser.add_argument("--ready-only", action="store_true", help="measure the ready times only, not the live run")
    args = parser.parse_args()
    with benchlib.source(args) as src, tempfile.TemporaryDirectory(prefix="etl-bench-") as workdir:
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        tables = build(src, args.tables, args.rows)
        limit = copy_all(src, tables)
        print(f"  psql COPY of the {args.tables} tables in one session: {limit:.1f} s", flush=True)
        settings = SparkSettings(master="local[2]")
        print(f"  spark local[2]: started and warmed in {start_spark(settings):.1f} s", flush=True)
        pipeline_id = 0
        for method in args.methods:
            pipeline_id += 1
            copy = {"method": method}
            config = pipeline_config(src, pipeline_id, copy, publication=PUBLICATION)
            null = ready_time(config, NullDestination(), MemoryStore(pipeline_id), args.tables)
            src.drop_slots()
            pipeline_id += 1
            with lake(src, "sqlite", f"many_lake_{pipeline_id}", spark=settings) as lake_config:
                config = pipeline_config(src, pipeline_id, copy, publication=PUBLICATION)
                destination = DuckLakeDestination(lake_config, pipeline_id)
                ducklake = ready_time(config, destination, lake_store(workdir, pipeline_id), args.tables)
                print(
                    f"  {args.tables} tables of {args.rows:,} rows ready, {method}: null {null:.1f} s, DuckLake"
                    f" {ducklake:.1f} s (psql COPY {limit:.1f} s)",
                    flush=True,
                )
                if method != args.methods[-1] or args.ready_only:
                    src.drop_slots()
                    continue
                workload = script(Path(workdir) / "many.sql", args.tables, args.rows)
                options = ("-c", "4", "-j", "2", "-R", str(args.rate), "-f", str(workload))
                title = f"{args.rate} transactions a second for {args.seconds} s over {args.tables} tables"
                load = Load(title, args.seconds, options, tables, CHANGES_PER_TRANSACTION)
                live(src, config, lake_config, workdir, load)
                counted = sum(lake_count(lake_config, table)[0] for table in tables)
                total = sum(int(src.scalar(f"SELECT count(*) FROM {table}")) for table in tables)
                if counted != total:
                    raise RuntimeError(f"DuckDB reads {counted:,} rows in the lake, the tables have {total:,}")
                print(f"  DuckDB reads {counted:,} rows back, as the tables hold")
            src.drop_slots()
    return 0


if __name__ == "__main__":
    sys.exit(main())
