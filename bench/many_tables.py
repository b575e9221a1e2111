"""Many tables per batch: changes spread over hundreds of tables, streamed live into DuckLake beside the workload.

A publication of ``--tables`` tables (``t_1`` ...; a bigint key, an int, a text) of ``--rows`` rows each. A DuckLake
pipeline (SQLite store and catalog, Spark ``local[2]``, engine defaults) copies them all and becomes ready, timed
(every table's copy: its slot's creation, hand-over and drop). Then, while the pipeline streams, pgbench commits
``--rate`` transactions a second for ``--seconds`` over 4 connections, each updating a random row of three random
tables and inserting a row into a fourth (pgbench's own variables name the tables). Reported as by ``oltp.py
--live``: the most WAL the pipeline was behind, how long after pgbench stopped every transaction was durable in the
lake, ``etl_commit_to_durable_seconds`` over the run (p50, p99) against issue 48's p99 < 5 s, the lake's data files
(in all, and at most in one table), and the longest writes. DuckDB then reads every table's row count back.

    .tox/tests/bin/python bench/many_tables.py [--tables 200] [--rows 1000] [--rate 200] [--seconds 60] [--major 18]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import benchlib
from ducklake_copy import lake, lake_count, pipeline_config, run_ducklake, start_spark
from oltp import Load, lake_store, live

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


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--tables", type=int, default=200, help="published tables (default 200)")
    parser.add_argument("--rows", type=int, default=1000, help="rows in each table before the workload (default 1000)")
    parser.add_argument("--rate", type=int, default=200, help="transactions a second (default 200)")
    parser.add_argument("--seconds", type=int, default=60, help="how long pgbench runs (default 60)")
    args = parser.parse_args()
    with benchlib.source(args) as src, tempfile.TemporaryDirectory(prefix="etl-bench-") as workdir:
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        tables = build(src, args.tables, args.rows)
        settings = SparkSettings(master="local[2]")
        print(f"  spark local[2]: started and warmed in {start_spark(settings):.1f} s", flush=True)
        with lake(src, "sqlite", "many_lake", spark=settings) as lake_config:
            config = pipeline_config(src, 1, publication=PUBLICATION)
            started = time.perf_counter()
            run_ducklake(config, lake_config, 0, lake_store(workdir, 1), "copied")
            seconds = time.perf_counter() - started
            print(f"  {args.tables} tables of {args.rows:,} rows: copied and ready in {seconds:.1f} s", flush=True)
            workload = script(Path(workdir) / "many.sql", args.tables, args.rows)
            options = ("-c", "4", "-j", "2", "-R", str(args.rate), "-f", str(workload))
            title = f"{args.rate} transactions a second for {args.seconds} s over {args.tables} tables"
            live(src, config, lake_config, workdir, Load(title, args.seconds, options, tables, CHANGES_PER_TRANSACTION))
            counted = sum(lake_count(lake_config, table)[0] for table in tables)
            total = sum(int(src.scalar(f"SELECT count(*) FROM {table}")) for table in tables)
            if counted != total:
                raise RuntimeError(f"DuckDB reads {counted:,} rows in the lake, the tables have {total:,}")
            print(f"  DuckDB reads {counted:,} rows back, as the tables hold")
        src.drop_slots()
    return 0


if __name__ == "__main__":
    sys.exit(main())
