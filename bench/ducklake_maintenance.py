"""Long streaming into DuckLake with 1 s batches and maintenance on: does the lake's file count stay bounded?

The workload table starts with ``--base`` rows. One pipeline (memory store, in this process) copies it
into a DuckLake lake (SQLite catalog, Spark ``local[2]``) with 1 s batches and ``[destination.maintenance]``
on, then a steady ``--rate`` of transactions of 10 changes (7 inserts, 2 updates, 1 delete) runs for
``--minutes``. Once a minute the script prints the files under the lake's data path (what storage
holds), the active data and delete files, the files scheduled for deletion and the snapshots, all read
from the catalog. At the end it stops the workload, waits until the lake holds every change, and has
DuckDB 1.5.5 read the table: its rows (id, score, name) must equal the source's, row for row.

    .tox/tests/bin/python bench/ducklake_maintenance.py [--minutes 30] [--rate 50] [--base 100000]
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import benchlib
from benchlib import TABLE
from ducklake_copy import lake, pipeline_config, start_spark

from etl.pipeline import Pipeline
from etl.store.memory import MemoryStore
from etl_spark.ducklake.config import DuckLakeConfig
from etl_spark.ducklake.destination import DuckLakeDestination
from etl_spark.ducklake.maintenance import MaintenanceConfig
from etl_spark.ducklake.reader import open_lake

MAINTENANCE = {
    "every_seconds": 30,
    "merge_min_files": 8,
    "snapshot_retention_seconds": 300,
    "cleanup_after_seconds": 60,
}
"""Maintenance for the run: defaults but for a round every 30 s, merges from 8 small files, 5 minutes of time
travel, and cleanup a minute after a file is scheduled for deletion."""
INLINE_FLUSH_SECONDS = 60
"""Inlined rows are flushed to a file each minute (not 5): more files for maintenance to merge."""


def transactions(src: benchlib.Source, rate: float, base: int, stop: threading.Event, done: list[int]) -> None:
    """Transactions of 10 changes at ``rate`` a second until ``stop``; their count in ``done``."""
    interval, count, next_id = 1 / rate, 0, 10 * base
    with src.connect() as conn:
        conn.autocommit = False
        started = time.monotonic()
        while not stop.is_set():
            b = next_id + count * 7
            first, kept = 1 + (2 * count) % base, 2 + (2 * count) % base
            conn.execute(f"INSERT INTO {TABLE} SELECT {benchlib.row_values('g')} FROM generate_series({b}, {b + 6}) g")
            conn.execute(f"UPDATE {TABLE} SET score = score + 1, name = 'updated ' || id WHERE id IN ({b}, {first})")
            conn.execute(f"DELETE FROM {TABLE} WHERE id = {kept}")
            conn.commit()
            count += 1
            time.sleep(max(0.0, started + count * interval - time.monotonic()))
    done.append(count)


def census(config: DuckLakeConfig) -> dict[str, int]:
    """Files on storage, and what the catalog holds (read from a copy taken with SQLite's backup)."""
    path = config.catalog.get_secret_value().removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as live, closing(sqlite3.connect(":memory:")) as db:
        live.backup(db)

        def count(sql: str) -> int:
            return int(db.execute(sql).fetchone()[0])

        return {
            "files on storage": sum(1 for p in Path(config.data_path).rglob("*") if p.is_file()),
            "data files": count("SELECT count(*) FROM ducklake_data_file WHERE end_snapshot IS NULL"),
            "delete files": count("SELECT count(*) FROM ducklake_delete_file WHERE end_snapshot IS NULL"),
            "ended files": count(
                "SELECT (SELECT count(*) FROM ducklake_data_file WHERE end_snapshot IS NOT NULL)"
                " + (SELECT count(*) FROM ducklake_delete_file WHERE end_snapshot IS NOT NULL)"
            ),
            "scheduled": count("SELECT count(*) FROM ducklake_files_scheduled_for_deletion"),
            "snapshots": count("SELECT count(*) FROM ducklake_snapshot"),
        }


def rows_of_source(src: benchlib.Source) -> list[tuple[Any, ...]]:
    with src.connect() as conn:
        return conn.execute(f"SELECT id, score, name FROM {TABLE} ORDER BY id").fetchall()


def rows_of_lake(config: DuckLakeConfig) -> list[tuple[Any, ...]]:
    con = open_lake(config.catalog.get_secret_value())
    try:
        return con.execute(f"SELECT id, score, name FROM lake.public.{TABLE} ORDER BY id").fetchall()
    finally:
        con.close()


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--minutes", type=float, default=30, help="how long the workload runs")
    parser.add_argument("--rate", type=float, default=50, help="transactions of 10 changes a second")
    parser.add_argument("--base", type=int, default=100_000, help="rows in the table before the workload")
    args = parser.parse_args()
    with benchlib.source(args) as src:
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        src.execute(f"INSERT INTO {TABLE} SELECT {benchlib.row_values('g')} FROM generate_series(1, {args.base}) g")
        print(f"spark:   started in {start_spark():.1f} s")
        with lake(src, "sqlite", "bench_soak") as plain:
            config = plain.model_copy(
                update={
                    "maintenance": MaintenanceConfig.model_validate(MAINTENANCE),
                    "inline_flush_seconds": INLINE_FLUSH_SECONDS,
                }
            )
            print(f"maintenance: {config.maintenance}; inline_flush_seconds={config.inline_flush_seconds}")
            destination = DuckLakeDestination(config, 1)
            pipeline = Pipeline(pipeline_config(src, 1, max_fill_ms=1000, max_bytes=2**40), MemoryStore(1), destination)
            pipeline.start()
            stop, done = threading.Event(), []
            worker = threading.Thread(target=transactions, args=(src, args.rate, args.base, stop, done), daemon=True)
            started = time.monotonic()
            worker.start()
            peak: dict[str, int] = {}
            try:
                while time.monotonic() - started < args.minutes * 60:
                    if pipeline.wait(timeout=60):
                        raise RuntimeError("the pipeline stopped")
                    if not worker.is_alive():
                        raise RuntimeError("the workload stopped")
                    elapsed = time.monotonic() - started
                    figures = census(config)
                    peak = {k: max(v, peak.get(k, 0)) for k, v in figures.items()}
                    print(f"{elapsed / 60:5.1f} min  " + "  ".join(f"{k}: {v}" for k, v in figures.items()), flush=True)
                stop.set()
                worker.join()
                expected = rows_of_source(src)
                deadline = time.monotonic() + 300
                while (found := rows_of_lake(config)) != expected:
                    if time.monotonic() > deadline or pipeline.wait(timeout=2):
                        raise RuntimeError(f"the lake holds {len(found):,} rows, the source {len(expected):,}")
            finally:
                pipeline.shutdown(timeout=120)
            print(f"workload: {done[0]:,} transactions ({done[0] * 10:,} changes) in {args.minutes:g} min")
            print("peak:     " + "  ".join(f"{k}: {v}" for k, v in peak.items()))
            print("end:      " + "  ".join(f"{k}: {v}" for k, v in census(config).items()))
            print(f"DuckDB reads {len(found):,} rows, equal to the source's, row for row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
