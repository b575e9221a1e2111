"""Streaming: the engine into the null destination vs ``pg_recvlogical`` draining an identical slot.

For each workload shape (``--shapes small,large``), with the same number of row changes (default 1M:
70% inserts, 20% updates, 10% deletes on a table of mixed types):

- ``small``: transactions of 10 changes each (7 inserts, 2 updates, 1 delete);
- ``large``: one transaction holding every change (streamed in chunks by pgoutput protocol 2).

Per shape: create the limit's slot, start the engine (SQLite store) and wait until its table is
Ready, stop it, generate the workload, then let each consumer drain the same WAL from its slot:

1. limit: ``pg_recvlogical --start --endpos <WAL end after the workload> -o proto_version=2
   -o publication_names=... -o streaming=on -o messages=true -f - > /dev/null``, timed;
2. engine: the same pipeline restarted (its table is Ready in the store, so it streams, it does not
   copy), timed from ``Pipeline.start()`` until the null destination counted every change.

Both read a backlog, so neither waits for the workload generator, and both start from a cold
walsender. The CPU seconds of each side's walsender are sampled from ``/proc``; the engine's own CPU
seconds and peak RSS (``VmHWM``) come from its child process.

    .tox/tests/bin/python bench/bench_streaming.py [--rows 1000000] [--shapes small,large] [--major 18]
        [--metrics off|on|both]

``--metrics on`` serves ``[metrics]`` and scrapes ``/metrics`` every second while the engine runs (the
engine records its series in every run; this adds the sampler, the listener and the scrapes).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import benchlib
from benchlib import PUBLICATION, TABLE, CpuSampler, Engine, Line

LIMIT_SLOT = "bench_limit"
CHANGES_PER_SMALL_TRANSACTION = 10

SMALL_TRANSACTIONS = f"""
CREATE OR REPLACE PROCEDURE bench_small(transactions int) LANGUAGE plpgsql AS $$
DECLARE base bigint;
BEGIN
    FOR i IN 0 .. transactions - 1 LOOP
        base := i::bigint * 7;
        INSERT INTO {TABLE} SELECT {benchlib.row_values("g")} FROM generate_series(base + 1, base + 7) g;
        UPDATE {TABLE} SET score = score + 1, name = 'updated ' || id WHERE id IN (base + 1, base + 2);
        DELETE FROM {TABLE} WHERE id = base + 3;
        COMMIT;
    END LOOP;
END $$;
"""


def generate(src: benchlib.Source, shape: str, rows: int) -> float:
    """Run the workload of ``rows`` changes; the seconds it took."""
    started = time.perf_counter()
    with src.connect() as conn:
        if shape == "small":
            conn.execute(SMALL_TRANSACTIONS)
            conn.execute(f"CALL bench_small({rows // CHANGES_PER_SMALL_TRANSACTION})")
        else:
            inserts = rows * 7 // 10
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO {TABLE} SELECT {benchlib.row_values('g')} FROM generate_series(1, {inserts}) g"
                )
                conn.execute(f"UPDATE {TABLE} SET score = score + 1, name = 'updated ' || id WHERE id % 7 IN (1, 2)")
                conn.execute(f"DELETE FROM {TABLE} WHERE id % 7 = 3")
    return time.perf_counter() - started


def limit(src: benchlib.Source, rows: int, end_lsn: str, publication: str = PUBLICATION) -> Line:
    options = ["proto_version=2", f"publication_names={publication}", "streaming=on", "messages=true"]
    command = src.client(
        "pg_recvlogical",
        "-d",
        benchlib.DATABASE,
        f"--slot={LIMIT_SLOT}",
        "--start",
        f"--endpos={end_lsn}",
        "--no-loop",
        "-f",
        "-",
        *[arg for option in options for arg in ("-o", option)],
    )
    sampler = CpuSampler(src, LIMIT_SLOT)
    seconds = benchlib.timed(command)
    walsender = sampler.stop()
    return Line("pg_recvlogical > /dev/null", rows, seconds, note=f"walsender CPU {walsender:.1f} s")


def engine(
    src: benchlib.Source,
    shape: str,
    rows: int,
    pipeline_id: int,
    store: Path,
    *,
    metrics: bool,
    publication: str = PUBLICATION,
) -> Line:
    common = ["--pipeline-id", str(pipeline_id), "--store", str(store), "--publication", publication]
    common += ["--metrics"] if metrics else []
    child = Engine(src, "stream", "--rows", str(rows), *common, profile=f"streaming-{shape}")
    sampler = CpuSampler(src, f"etl_apply_{pipeline_id}")
    try:
        done = child.expect("done")
        child.wait()
    finally:
        child.kill()
    walsender = sampler.stop()
    return Line(
        "engine -> null destination" + (", [metrics] served and scraped every 1 s" if metrics else ""),
        done["rows"],
        done["seconds"],
        done["peak_rss_mb"],
        done["cpu_seconds"],
        note=f"walsender CPU {walsender:.1f} s, {done['batches']} batches",
    )


def ready(src: benchlib.Source, pipeline_id: int, store: Path, publication: str = PUBLICATION) -> None:
    """Start the pipeline, wait until its tables are Ready, stop it: its slot now waits for the workload."""
    child = Engine(src, "ready", "--pipeline-id", str(pipeline_id), "--store", str(store), "--publication", publication)
    try:
        child.expect("done")
        child.wait()
    finally:
        child.kill()


def run_shape(src: benchlib.Source, shape: str, rows: int, pipeline_id: int, workdir: Path, *, metrics: bool) -> bool:
    src.execute(f"TRUNCATE {TABLE}")
    src.drop_slots()
    src.execute(f"SELECT pg_create_logical_replication_slot('{LIMIT_SLOT}', 'pgoutput')")
    store = workdir / f"store-{pipeline_id}.sqlite"
    ready(src, pipeline_id, store)
    seconds = generate(src, shape, rows)
    # pg_recvlogical stops at the first message at or past --endpos. A logical message written after the
    # workload is such a position that no keepalive passes before the workload's changes went out.
    end_lsn = src.scalar("SELECT pg_logical_emit_message(false, 'bench', 'end of the workload')")
    wal = src.scalar(
        f"SELECT pg_size_pretty(pg_current_wal_insert_lsn() - confirmed_flush_lsn) FROM pg_replication_slots"
        f" WHERE slot_name = '{LIMIT_SLOT}'"
    )
    print(f"  {shape}: workload of {rows:,} changes generated in {seconds:.1f} s ({wal} of WAL)", flush=True)
    limit_line = limit(src, rows, end_lsn)
    engine_line = engine(src, shape, rows, pipeline_id, store, metrics=metrics)
    src.drop_slots()
    what = "transactions of 10 changes" if shape == "small" else "one transaction"
    ok = benchlib.report(f"streaming {rows:,} changes, {what}", engine_line, limit_line, target=0.9)
    print(f"  engine peak RSS {engine_line.peak_rss_mb:.0f} MB (target < 400 MB)")
    return ok


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--rows", type=int, default=1_000_000, help="row changes per shape (a multiple of 10)")
    parser.add_argument("--shapes", default="small,large", help="comma-separated: small, large")
    parser.add_argument(
        "--metrics",
        choices=["off", "on", "both"],
        default="off",
        help="serve [metrics] and scrape it every second during the engine's run (both: one run each, in turn)",
    )
    args = parser.parse_args()
    if args.rows % 10:
        parser.error("--rows must be a multiple of 10")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not shapes or set(shapes) - {"small", "large"}:
        parser.error("--shapes takes small, large or both")
    with benchlib.source(args) as src, tempfile.TemporaryDirectory(prefix="etl-bench-") as workdir:
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        modes = {"off": [False], "on": [True], "both": [False, True]}[args.metrics]
        runs = [(shape, metrics) for shape in shapes for metrics in modes]
        for pipeline_id, (shape, metrics) in enumerate(runs, start=1):
            run_shape(src, shape, args.rows, pipeline_id, Path(workdir), metrics=metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
