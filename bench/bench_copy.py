"""Initial copy: the engine into the null destination vs ``psql -c "COPY t TO STDOUT" > /dev/null``.

Fills a table of mixed types (default 2M rows), then alternates the limit and the engine ``--repeat``
times and keeps the best run of each. The engine run is a fresh pipeline each time (memory store, default
copy settings: the snapshot method, 2 COPY connections per table), timed from ``Pipeline.start()`` until the
null destination counted every row; its peak RSS is the child process's ``VmHWM``. ``--incremental`` also runs
the incremental method each time (``--chunk-rows``) and reports it beside the snapshot copy.

    .tox/tests/bin/python bench/bench_copy.py [--rows 2000000] [--major 18] [--repeat 2] [--incremental]
"""

from __future__ import annotations

import sys
import time

import benchlib
from benchlib import TABLE, Engine, Line


def fill(src: benchlib.Source, rows: int) -> float:
    started = time.perf_counter()
    src.execute(f"INSERT INTO {TABLE} SELECT {benchlib.row_values('g')} FROM generate_series(1, {rows}) g")
    src.execute(f"VACUUM (FREEZE, ANALYZE) {TABLE}")  # set hint bits now, not in whichever reader comes first
    src.execute("CHECKPOINT")
    return time.perf_counter() - started


def limit(src: benchlib.Source, rows: int) -> Line:
    command = src.client("psql", "-d", benchlib.DATABASE, "-X", "-q", "-c", f"COPY {TABLE} TO STDOUT")
    return Line("psql COPY TO STDOUT > /dev/null", rows, benchlib.timed(command))


def engine(src: benchlib.Source, rows: int, pipeline_id: int, *method: str) -> Line:
    child = Engine(
        src, "copy", "--rows", str(rows), "--pipeline-id", str(pipeline_id), *method, profile=f"copy-{pipeline_id}"
    )
    try:
        done = child.expect("done")
        child.wait()
    finally:
        child.kill()
    src.drop_slots()
    name = "engine (incremental) -> null destination" if method else "engine -> null destination"
    return Line(name, done["rows"], done["seconds"], done["peak_rss_mb"], done["cpu_seconds"])


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each side; the best is reported")
    parser.add_argument("--incremental", action="store_true", help="also the incremental method, each run")
    parser.add_argument("--chunk-rows", type=int, default=50_000, help="the incremental method's chunk_rows")
    args = parser.parse_args()
    with benchlib.source(args) as src:
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        seconds = fill(src, args.rows)
        size = src.scalar(f"SELECT pg_size_pretty(pg_table_size('{TABLE}'))")
        print(f"table:   {args.rows:,} rows, 9 columns of mixed types, {size} (filled in {seconds:.1f} s)")
        limit(src, args.rows)  # warm the cache
        limits, engines, chunked = [], [], []
        incremental = ("--method", "incremental", "--chunk-rows", str(args.chunk_rows))
        for run in range(args.repeat):
            limits.append(limit(src, args.rows))
            engines.append(engine(src, args.rows, run + 1))
            if args.incremental:
                chunked.append(engine(src, args.rows, 100 + run, *incremental))
            also = f", incremental {chunked[-1].seconds:.2f} s" if chunked else ""
            print(
                f"  run {run + 1}: limit {limits[-1].seconds:.2f} s, engine {engines[-1].seconds:.2f} s{also}",
                flush=True,
            )
        best_limit = min(limits, key=lambda line: line.seconds)
        best = min(engines, key=lambda line: line.seconds)
        best.peak_rss_mb = max(line.peak_rss_mb or 0 for line in engines)
        benchlib.report(f"copy of {args.rows:,} rows (best of {args.repeat})", best, best_limit, target=0.8)
        print(f"  engine peak RSS {best.peak_rss_mb:.0f} MB (target < 400 MB)")
        if chunked:
            fastest = min(chunked, key=lambda line: line.seconds)
            benchlib.report(f"incremental copy, chunks of {args.chunk_rows:,} rows", fastest, best, target=0.7)
    return 0


if __name__ == "__main__":
    sys.exit(main())
