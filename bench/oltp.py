"""OLTP: a pgbench backlog (TPC-B-like small transactions on old rows), drained by the engine into ``null`` and by
``pg_recvlogical``.

Postgres's own ``pgbench`` builds the schema (``-i -s SCALE``: ``SCALE`` x 100,000 accounts) and runs its TPC-B-like
script (``-T SECONDS -c CLIENTS``): each transaction updates one random account, one teller and one branch and
inserts a history row, four changes. ``pgbench_history`` has no key, so it is published with ``REPLICA IDENTITY
FULL``. The engine's pipeline copies the tables first (SQLite store) and stops; the limit's slot is created; the
workload runs; then each consumer drains the same backlog from its own slot:

1. limit: ``pg_recvlogical`` (protocol 2, streaming on, messages on) to ``/dev/null``, timed;
2. engine: the pipeline restarted into the null destination, timed from ``Pipeline.start()`` until it counted
   every change (four per transaction pgbench reports).

    .venv/bin/python bench/oltp.py [--scale 20] [--clients 4] [--seconds 60] [--major 18] [--profile DIR]
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from bench_streaming import LIMIT_SLOT, engine, limit, ready

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


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--scale", type=int, default=20, help="pgbench scale: 100,000 accounts each (default 20)")
    parser.add_argument("--clients", type=int, default=4, help="pgbench clients (default 4)")
    parser.add_argument("--seconds", type=int, default=60, help="how long pgbench runs (default 60)")
    args = parser.parse_args()
    with benchlib.source(args) as src, tempfile.TemporaryDirectory(prefix="etl-bench-") as workdir:
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        build(src, args.scale)
        store = Path(workdir) / "store.sqlite"
        ready(src, 1, store, publication=PUBLICATION)
        src.execute(f"SELECT pg_create_logical_replication_slot('{LIMIT_SLOT}', 'pgoutput')")
        transactions, seconds = workload(src, args.clients, args.seconds)
        changes = transactions * CHANGES_PER_TRANSACTION
        end_lsn = src.scalar("SELECT pg_logical_emit_message(false, 'bench', 'end of the workload')")
        print(f"  pgbench: {transactions:,} transactions ({changes:,} changes) in {seconds:.1f} s", flush=True)
        limit_line = limit(src, changes, end_lsn, publication=PUBLICATION)
        engine_line = engine(src, "oltp", changes, 1, store, metrics=False, publication=PUBLICATION)
        src.drop_slots()
        benchlib.report(
            f"pgbench backlog, scale {args.scale}: {changes:,} changes in transactions of 4",
            engine_line,
            limit_line,
            0.9,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
