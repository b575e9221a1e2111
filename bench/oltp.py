"""OLTP: a pgbench backlog (TPC-B-like small transactions on old rows), drained by ``pg_recvlogical``, by the engine
into ``null``, and into DuckLake.

Postgres's own ``pgbench`` builds the schema (``-i -s SCALE``: ``SCALE`` x 100,000 accounts) and runs its TPC-B-like
script (``-T SECONDS -c CLIENTS``): each transaction updates one random account, one teller and one branch and
inserts a history row, four changes. ``pgbench_history`` has no key, so it is published with ``REPLICA IDENTITY
FULL``. The engine's pipeline copies the tables first (SQLite store) and stops; the limit's slot is created; the
workload runs; then each consumer drains the same backlog from its own slot:

1. limit: ``pg_recvlogical`` (protocol 2, streaming on, messages on) to ``/dev/null``, timed;
2. engine: the pipeline restarted into the null destination, timed from ``Pipeline.start()`` until it counted
   every change (four per transaction pgbench reports);
3. DuckLake, once per Spark master of ``--masters`` (SQLite catalog, engine defaults): a pipeline copied the tables
   into its own lake before the workload; restarted, timed from ``Pipeline.start()`` until its destination wrote
   every change (the Spark session started and warmed before, as a running pipeline's is). Its first write after
   the start is reported apart from the steady ones. DuckDB then reads every lake table's row count back.

    .tox/tests/bin/python bench/oltp.py [--scale 20] [--clients 4] [--seconds 60] [--major 18] [--profile DIR]
        [--masters 'local[2]' 'local-cluster[2,1,1024]']
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from bench_streaming import LIMIT_SLOT, engine, limit, ready
from benchlib import Line
from ducklake_copy import WriteStats, lake, lake_count, pipeline_config, run_ducklake, show, start_spark

from etl.config import PipelineConfig
from etl_spark.ducklake.config import DuckLakeConfig
from etl_spark.session import SparkSettings
from etl_store_sqlite.store import SqliteStore

PUBLICATION = "oltp_pub"
TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")
CHANGES_PER_TRANSACTION = 4


def build(src: benchlib.Source, scale: int) -> None:
    """pgbench's schema at ``scale``, published (its history table with REPLICA IDENTITY FULL)."""
    subprocess.run(
        src.client("pgbench", "-i", "-q", "-s", str(scale), benchlib.DATABASE), check=True, capture_output=True
    )
    src.execute(
        "ALTER TABLE pgbench_history REPLICA IDENTITY FULL;"
        f" CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}"
    )
    src.execute("VACUUM ANALYZE")


def workload(src: benchlib.Source, clients: int, seconds: int) -> tuple[int, float]:
    """Run pgbench's TPC-B-like script; the transactions it committed and the seconds it ran."""
    started = time.perf_counter()
    result = subprocess.run(
        src.client("pgbench", "-n", "-c", str(clients), "-j", str(clients), "-T", str(seconds), benchlib.DATABASE),
        check=True,
        capture_output=True,
        text=True,
    )
    match = re.search(r"number of transactions actually processed: (\d+)", result.stdout)
    if match is None:
        raise RuntimeError(f"pgbench printed no transaction count:\n{result.stdout}\n{result.stderr}")
    return int(match.group(1)), time.perf_counter() - started


def ducklake_line(master: str, seconds: float, stats: WriteStats) -> Line:
    """The drain into a lake, its first write after the start set apart from the steady ones."""
    (first_changes, first_seconds), steady = stats.each[0], stats.each[1:]
    note = f"first write {first_changes:,} changes in {first_seconds:.2f} s"
    if steady:
        changes, spent = sum(c for c, _ in steady), sum(s for _, s in steady)
        each = first_changes * spent / max(changes, 1)
        note += f" (a steady write of as many: {each:.2f} s); then {len(steady)} writes"
        note += f", {changes / spent:,.0f} changes/s"
    return Line(f"engine -> DuckLake, {master}", stats.changed_rows, seconds, note=note)


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--scale", type=int, default=20, help="pgbench scale: 100,000 accounts each (default 20)")
    parser.add_argument("--clients", type=int, default=4, help="pgbench clients (default 4)")
    parser.add_argument("--seconds", type=int, default=60, help="how long pgbench runs (default 60)")
    masters = ["local[2]", "local-cluster[2,1,1024]"]
    parser.add_argument("--masters", nargs="*", default=masters, help="Spark masters of the DuckLake runs")
    args = parser.parse_args()
    with (
        benchlib.source(args) as src,
        tempfile.TemporaryDirectory(prefix="etl-bench-") as workdir,
        contextlib.ExitStack() as lakes,
    ):
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        build(src, args.scale)
        store = Path(workdir) / "store.sqlite"
        ready(src, 1, store, publication=PUBLICATION)
        pipelines: list[tuple[str, PipelineConfig, DuckLakeConfig]] = []
        for pipeline_id, master in enumerate(args.masters, start=2):
            settings = SparkSettings(master=master)
            print(f"  spark {master}: started and warmed in {start_spark(settings):.1f} s", flush=True)
            lake_config = lakes.enter_context(lake(src, "sqlite", f"oltp_lake_{pipeline_id}", spark=settings))
            config = pipeline_config(src, pipeline_id, publication=PUBLICATION)
            started = time.perf_counter()
            run_ducklake(config, lake_config, 0, lake_store(workdir, pipeline_id), "copied")
            print(f"  DuckLake, {master}: copied and ready in {time.perf_counter() - started:.1f} s", flush=True)
            pipelines.append((master, config, lake_config))
        src.execute(f"SELECT pg_create_logical_replication_slot('{LIMIT_SLOT}', 'pgoutput')")
        transactions, seconds = workload(src, args.clients, args.seconds)
        changes = transactions * CHANGES_PER_TRANSACTION
        end_lsn = src.scalar("SELECT pg_logical_emit_message(false, 'bench', 'end of the workload')")
        print(f"  pgbench: {transactions:,} transactions ({changes:,} changes) in {seconds:.1f} s", flush=True)
        limit_line = limit(src, changes, end_lsn, publication=PUBLICATION)
        engine_line = engine(src, "oltp", changes, 1, store, metrics=False, publication=PUBLICATION)
        title = f"pgbench backlog, scale {args.scale}: {changes:,} changes in transactions of 4"
        benchlib.report(title, engine_line, limit_line, 0.9)
        expected = [src.scalar(f"SELECT count(*) FROM {table}") for table in TABLES]
        lines = []
        for master, config, lake_config in pipelines:
            print(f"  spark {master}: started and warmed in {start_spark(lake_config.spark):.1f} s", flush=True)
            progress = lake_store(workdir, config.pipeline.id)
            seconds, stats = run_ducklake(config, lake_config, changes, progress, "changed")
            counted = [lake_count(lake_config, table)[0] for table in TABLES]
            if counted != expected:
                raise RuntimeError(f"DuckDB reads {counted} rows in the lake ({master}), the tables have {expected}")
            lines.append(ducklake_line(master, seconds, stats))
        src.drop_slots()
        if lines:
            show(title + ", into DuckLake (ratios to null)", engine_line, *lines)
    return 0


def lake_store(workdir: str, pipeline_id: int) -> SqliteStore:
    return SqliteStore(Path(workdir) / f"store-{pipeline_id}.sqlite", pipeline_id)


if __name__ == "__main__":
    sys.exit(main())
