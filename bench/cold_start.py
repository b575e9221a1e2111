"""Cold start: ``etl run`` of a new pipeline until its small table is copied, into DuckLake and into memory.

A table of ``--rows`` rows (20 by default), a new pipeline each run (SQLite store), and ``etl run`` started
as a new process: timed from its spawn until the store says the table's copy is durable in the destination
(``finished_copy`` or later; the store records it only after the destination's write). The memory destination's
time is the limit: the engine's own start (Python, the source connection, the slot, the copy) with no Spark
to wait for. DuckLake is measured three ways:

- with the default settings and no class archive yet (the first run on a machine; it builds one meanwhile);
- with the default settings and the class archive built (every run after the first);
- copying every table with Spark (``driver_copy_max_bytes = 0``), the archive built: what a small table cost
  before copies of small tables skipped Spark.

Each lake is read back with DuckDB: it must hold the table's rows. The target (issue 33): under 10 s.

    .tox/tests/bin/python bench/cold_start.py [--rows 20] [--major 18]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import PUBLICATION, TABLE

from etl.config import PipelineConfig, load_config
from etl.factory import build_store
from etl.testing.runner import write_config
from etl_spark.ducklake.reader import open_lake

TARGET_S = 10.0


def config(src: benchlib.Source, workdir: Path, pipeline_id: int, destination: dict[str, Any]) -> Path:
    raw = {
        "pipeline": {"id": pipeline_id, "publication": PUBLICATION},
        "source": src.connection().model_dump(),
        "store": {"type": "sqlite", "path": str(workdir / f"state-{pipeline_id}.sqlite")},
        "destination": destination,
    }
    return write_config(workdir / f"pipeline-{pipeline_id}.toml", PipelineConfig.model_validate(raw))


def copied(path: Path) -> bool:
    store = build_store(load_config(path), str(path))
    try:
        return any(state.kind.copied for state in store.get_table_states().values())
    finally:
        store.close()


def run(path: Path, env: dict[str, str]) -> float:
    """Seconds from spawning ``etl run`` until its table is copied; then stop it as an operator would."""
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "etl.cli", "--log-level", "warning", "run", "-c", str(path)], env=env
    )
    try:
        while True:
            if child.poll() is not None:
                raise SystemExit(f"etl run exited with {child.returncode}")
            if Path(load_config(path).store.options()["path"]).exists() and copied(path):
                return time.perf_counter() - started
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=120)


def lake_rows(catalog: str) -> int:
    con = open_lake(catalog)
    try:
        row = con.execute(f"SELECT count(*) FROM lake.public.{TABLE}").fetchone()
        return int(row[0]) if row else 0
    finally:
        con.close()


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args()
    with benchlib.source(args) as src, tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        src.execute(f"INSERT INTO {TABLE} SELECT {benchlib.row_values('g')} FROM generate_series(1, {args.rows}) g")
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()}")
        print(f"table:   {args.rows:,} rows\n")
        env = {**os.environ, "XDG_CACHE_HOME": str(workdir / "cache")}  # no class archive to start with

        def ducklake(pipeline_id: int, **options: Any) -> tuple[float, int]:
            catalog = f"sqlite:///{workdir}/catalog-{pipeline_id}.sqlite"
            destination = {"type": "ducklake", "catalog": catalog, "data_path": f"{workdir}/lake-{pipeline_id}/"}
            destination |= {"spark": {"master": "local[2]"}} | options
            seconds = run(config(src, workdir, pipeline_id, destination), env)
            src.drop_slots()
            return seconds, lake_rows(catalog)

        limit = run(config(src, workdir, 1, {"type": "memory"}), env)
        src.drop_slots()
        first, first_rows = ducklake(2)
        archives = workdir / "cache" / "etl-spark"
        deadline = time.monotonic() + 300
        while not any(archives.glob("*.jsa")):  # the first run's builder, still at work after it stopped
            if time.monotonic() > deadline:
                raise SystemExit("no class archive was built")
            time.sleep(0.5)
        warm, warm_rows = ducklake(3)
        spark, spark_rows = ducklake(4, driver_copy_max_bytes=0)

        print(f"  {'':<52} {'seconds':>8} {'lake rows':>10}")
        print(f"  {'memory destination (the limit)':<52} {limit:>8.2f} {'-':>10}")
        for name, seconds, rows in (
            ("ducklake, first run (no class archive yet)", first, first_rows),
            ("ducklake, class archive built", warm, warm_rows),
            ("ducklake, copied with Spark (driver_copy_max_bytes=0)", spark, spark_rows),
        ):
            print(f"  {name:<52} {seconds:>8.2f} {rows:>10,}")
        good = warm < TARGET_S and first < TARGET_S and {first_rows, warm_rows, spark_rows} == {args.rows}
        verdict = "meets" if good else "MISSES"
        print(f"  {verdict} the target: each DuckLake run under {TARGET_S:.0f} s, every lake holding {args.rows} rows")
        print(f"  load average now {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
