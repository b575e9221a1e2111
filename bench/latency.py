"""Commit to durable: how long a committed transaction takes to be durable in the destination, at a steady rate.

``pgbench`` (from the same installation as the server) commits ``--rate`` transactions per second for
``--seconds`` over ``--clients`` connections, each transaction one single-row ``INSERT``; pgbench's
``--rate`` spaces them by a Poisson schedule and reports how far it fell behind it (schedule lag). The
pipeline runs in this process (SQLite store, the ``null`` destination or with ``--destination ducklake``
a DuckLake lake with a SQLite catalog, ``[metrics]`` on so the sampler and the listener run,
``[batch] max_fill_ms = --max-fill-ms``). Reported:

- the achieved rate: transactions pgbench committed / its run time, and its schedule lag;
- ``etl_commit_to_durable_seconds`` read from the pipeline's registry, counting only what was observed
  while the load ran: p50 and p99 interpolated linearly within buckets, as Prometheus's
  ``histogram_quantile`` does, and max as the upper bound of the highest non-empty bucket. The engine
  observes every transaction: from its commit time on the source to the moment its batch is durable;
- the same latency measured exactly: each row holds ``clock_timestamp()`` of its insert (its
  transaction commits right after, in the same round trip), and the pipeline's store stamps the moment
  it records the batch's progress (what makes the batch durable for the engine); p50, p99 and max over
  every transaction;
- the target: p99 < 100 ms into ``null``, p99 < 2 s into DuckLake with 1 s batches.

``--copying ROWS`` measures twice in one run: as above, then while another table of ``ROWS`` rows (the
workload table of ``bench_copy.py``) is copied incrementally (``[copy] method = "incremental"``, ``chunk_rows =
--chunk-rows``) into the same destination; the load starts once the copy has begun, and the rows it copied
meanwhile and the exact latencies of the transactions committed before the table was ready are reported. The
chunks are read and written beside the stream, so the second p99 should stay near the first; the target is the
destination's, for both.

Sessions of the benchmark database commit with ``synchronous_commit = on`` (``--synchronous-commit``):
the throwaway cluster's default ``off`` lets a commit return before its WAL is flushed, and a walsender
sends only flushed WAL, so every change would wait for the WAL writer (up to ``wal_writer_delay``).

    .tox/tests/bin/python bench/latency.py [--rate 1000] [--seconds 30] [--clients 4] [--max-fill-ms 1000]
        [--synchronous-commit on|off] [--destination null|ducklake] [--copying 5000000 [--chunk-rows 500000]]
        [--major 18] [--port N]
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bench_copy
import benchlib
import numpy as np
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry

from etl.config import PipelineConfig
from etl.destination.base import WriteResult
from etl.destination.null import NullDestination
from etl.events import EventBatch
from etl.lsn import Lsn
from etl.pipeline import Pipeline
from etl.store.base import TableStateKind
from etl.testing import free_port
from etl_spark.ducklake.config import DuckLakeConfig
from etl_spark.ducklake.destination import DuckLakeDestination
from etl_store_sqlite.store import SqliteStore

TABLE = "latency_rows"
PUBLICATION = "latency_pub"
COPYING_PUBLICATION = "latency_copying_pub"
"""The latency table and ``benchlib.TABLE``, copied incrementally while the load runs (``--copying``)."""
HISTOGRAM = "etl_commit_to_durable_seconds"
TARGET_P99_S = {"null": 0.100, "ducklake": 2.0}


class Stamping:
    """A destination (any) that keeps the insert time of each row of the batch in flight (microseconds)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.pending: list[np.ndarray] = []

    def write_events(self, batch: EventBatch) -> WriteResult:
        for segments in batch.changes.values():
            for segment in segments:
                if segment.table.num_rows and "at" in segment.table.column_names:  # not a copied chunk's rows
                    at = pc.cast(segment.table.column("at"), "int64").to_numpy(zero_copy_only=False)
                    self.pending.append(at)
        result: WriteResult = self.inner.write_events(batch)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class StampingStore(SqliteStore):
    """The SQLite store; when it records the apply worker's progress, the batch just written is durable."""

    destination: Stamping
    latencies: list[float]
    """Per transaction: from its insert to its batch's progress stored, in seconds."""
    inserted: list[float]
    """Per transaction, in the same order: when it inserted its row (seconds since the epoch)."""
    measuring: bool

    def upsert_progress(self, worker: str, lsn: Lsn) -> Lsn:
        stored = super().upsert_progress(worker, lsn)
        durable_us = time.time_ns() // 1000
        pending, self.destination.pending = self.destination.pending, []  # the writer thread made both calls
        if self.measuring and pending:
            for at in pending:
                self.latencies.extend(((durable_us - at) / 1e6).tolist())
                self.inserted.extend((at / 1e6).tolist())
        return stored


def histogram(registry: CollectorRegistry) -> list[tuple[float, float]]:
    """``(upper bound, cumulative count)`` of each bucket of the commit-to-durable histogram, +Inf last."""
    for family in registry.collect():
        if family.name == HISTOGRAM:
            return [(float(s.labels["le"]), s.value) for s in family.samples if s.name == f"{HISTOGRAM}_bucket"]
    raise RuntimeError(f"{HISTOGRAM} is not in the pipeline's registry")


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's ``histogram_quantile``: find the bucket holding rank ``q * count``, interpolate linearly in it.

    The first bucket starts at 0; a rank in the +Inf bucket gives the highest finite upper bound.
    """
    total = buckets[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    index = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if math.isinf(buckets[index][0]):
        return buckets[-2][0]
    lower, below = (0.0, 0.0) if index == 0 else buckets[index - 1]
    upper, count = buckets[index]
    return lower + (upper - lower) * (rank - below) / (count - below)


def histogram_max(buckets: list[tuple[float, float]]) -> float:
    """The upper bound of the highest bucket that holds an observation (inf when only +Inf does)."""
    previous = [0.0] + [count for _, count in buckets[:-1]]
    filled = [upper for (upper, count), before in zip(buckets, previous, strict=True) if count > before]
    return filled[-1] if filled else math.nan


def pgbench(src: benchlib.Source, args: Any, script: Path) -> subprocess.Popen[str]:
    threads = max(1, min(args.clients, os.cpu_count() or 1))
    command = src.client(
        "pgbench",
        "-n",  # no vacuum of pgbench's own tables (there are none)
        "-M",
        "prepared",
        "-c",
        str(args.clients),
        "-j",
        str(threads),
        "-R",
        str(args.rate),
        "-T",
        str(args.seconds),
        "-f",
        str(script),
        benchlib.DATABASE,
    )
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def parse_pgbench(output: str) -> dict[str, float]:
    def number(pattern: str) -> float:
        match = re.search(pattern, output)
        if match is None:
            raise RuntimeError(f"unexpected pgbench output:\n{output}")
        return float(match.group(1))

    return {
        "transactions": number(r"actually processed: (\d+)"),
        "tps": number(r"tps = ([\d.]+)"),
        "lag_avg_ms": number(r"schedule lag: avg ([\d.]+)"),
        "lag_max_ms": number(r"schedule lag: avg [\d.]+ \(max ([\d.]+)"),
        "latency_avg_ms": number(r"latency average = ([\d.]+) ms"),
    }


def ms(seconds: float) -> str:
    """Seconds as milliseconds for the report (inf: past the histogram's last finite bucket)."""
    if math.isnan(seconds):
        return "n/a"
    return "> 300 s" if math.isinf(seconds) else f"{seconds * 1e3:.1f}"


def prepare(src: benchlib.Source, args: Any, workdir: Path) -> Path:
    """The latency table, its publications and pgbench's script; with ``--copying``, the table to copy, filled."""
    src.execute(
        f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(),"
        " payload text);"
        f" CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE};"
        f" CREATE PUBLICATION {COPYING_PUBLICATION} FOR TABLE {TABLE}, {benchlib.TABLE};"
        f" ALTER DATABASE {benchlib.DATABASE} SET synchronous_commit = {args.synchronous_commit}"
    )
    if args.copying:
        seconds = bench_copy.fill(src, args.copying)
        print(f"filled {benchlib.TABLE} with {args.copying:,} rows in {seconds:.1f} s")
    script = workdir / "insert.sql"
    script.write_text(f"INSERT INTO {TABLE} (payload) VALUES ('one row, one transaction');\n")
    return script


def run(src: benchlib.Source, args: Any, workdir: Path, script: Path, *, copying: bool) -> float:
    """One measurement, by a pipeline of its own (and a lake of its own, in ``workdir``); returns its exact p99."""
    src.execute(f"TRUNCATE {TABLE}")  # before the pipeline's slot exists: the last run's rows are not streamed
    workdir.mkdir()
    pipeline_id = 2 if copying else 1
    sections: dict[str, Any] = {}
    if copying:
        sections["copy"] = {"method": "incremental", "chunk_rows": args.chunk_rows, "skip": [f"public.{TABLE}"]}
    config = PipelineConfig.model_validate(
        {
            "pipeline": {"id": pipeline_id, "publication": COPYING_PUBLICATION if copying else PUBLICATION},
            "source": {"host": "127.0.0.1", "port": src.port, "database": benchlib.DATABASE, "sslmode": "disable"},
            "batch": {"max_fill_ms": args.max_fill_ms},
            "metrics": {"listen": f"127.0.0.1:{free_port()}", "sample_interval_s": 1},
            **sections,
        }
    )
    inner: Any = NullDestination()
    if args.destination == "ducklake":
        inner = DuckLakeDestination(
            DuckLakeConfig.model_validate(
                {"catalog": f"sqlite:///{workdir}/catalog.sqlite", "data_path": f"{workdir}/lake/"}
            ),
            pipeline_id,
        )
    destination = Stamping(inner)
    store = StampingStore(workdir / "store.sqlite", pipeline_id)
    store.destination, store.latencies, store.inserted, store.measuring = destination, [], [], False
    pipeline = Pipeline(config, store, destination)  # type: ignore[arg-type]  # a wrapper of a destination
    pipeline.start()
    try:
        deadline = time.monotonic() + 120
        while not ready(pipeline, copying):
            if pipeline.wait(timeout=0) or time.monotonic() > deadline:
                raise RuntimeError("the table did not become Ready" + (" or the copy did not begin" if copying else ""))
            time.sleep(0.1)
        registry = pipeline.metrics.registry
        copied_before = copied_rows(registry)
        before = histogram(registry)
        batches_before = int(registry.get_sample_value("etl_batch_rows_count") or 0)
        store.measuring = True
        cpu_before, started = os.times(), time.monotonic()
        load = pgbench(src, args, script)
        max_lag, copy_ended, copy_ended_at = 0.0, math.nan, math.inf
        while load.poll() is None:
            max_lag = max(max_lag, registry.get_sample_value("etl_replication_lag_bytes") or 0.0)
            if copying and math.isnan(copy_ended) and ready(pipeline, False):
                copy_ended, copy_ended_at = time.monotonic() - started, time.time()
            time.sleep(0.25)
        copied = copied_rows(registry) - copied_before
        output = load.stdout.read() if load.stdout else ""
        if load.returncode != 0:
            raise RuntimeError(f"pgbench failed ({load.returncode}):\n{output}")
        bench = parse_pgbench(output)
        committed = int(src.scalar(f"SELECT count(*) FROM {TABLE}"))
        deadline = time.monotonic() + 60
        while len(store.latencies) < committed:
            if pipeline.wait(timeout=0) or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the pipeline did not make every transaction durable: {committed} committed,"
                    f" {len(store.latencies)} timed"
                )
            time.sleep(0.05)
        wall = time.monotonic() - started
        cpu_after = os.times()
        batches = int(registry.get_sample_value("etl_batch_rows_count") or 0) - batches_before
        while (after := histogram(registry))[-1][1] - before[-1][1] < committed and time.monotonic() < deadline:
            time.sleep(0.01)  # the writer observes the histogram just after it stored the progress
    finally:
        pipeline.shutdown(timeout=60)
    window = [(upper, count - base) for (upper, count), (_, base) in zip(after, before, strict=True)]
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)

    print(
        f"\ncommit to durable into {args.destination}, {args.rate:,} tx/s target for {args.seconds} s,"
        f" [batch] max_fill_ms = {args.max_fill_ms}"
        + (f", while {benchlib.TABLE} copies in chunks of {args.chunk_rows:,}" if copying else "")
    )
    print(
        f"  load: {int(bench['transactions']):,} transactions of one row in {args.seconds} s over {args.clients}"
        f" connections = {bench['transactions'] / args.seconds:,.0f} tx/s (pgbench tps {bench['tps']:,.0f});"
        f" schedule lag avg {bench['lag_avg_ms']:.2f} ms, max {bench['lag_max_ms']:.1f} ms;"
        f" commit round trip avg {bench['latency_avg_ms']:.2f} ms; synchronous_commit = {args.synchronous_commit}"
    )
    print(
        f"  engine: {batches:,} batches ({committed / max(batches, 1):,.0f} rows each), CPU {cpu:.1f} s in"
        f" {wall:.1f} s ({cpu / wall:.0%} of a core), replication lag at most {max_lag / 1024:,.0f} KiB"
    )
    print(f"  {'':<58} {'count':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>9}")
    p50, p99 = histogram_quantile(0.5, window), histogram_quantile(0.99, window)
    print(
        f"  {HISTOGRAM + ' (registry)':<58} {int(window[-1][1]):>8,} {ms(p50):>8}"
        f" {ms(p99):>8} {ms(histogram_max(window)):>9}"
    )
    every = exact_line("every transaction, exact (insert to progress stored)", store.latencies)
    if copying:
        during = [x for x, at in zip(store.latencies, store.inserted, strict=True) if at <= copy_ended_at]
        every = exact_line("those committed while the copy ran, exact", during)
        state = "still copying at its end" if math.isnan(copy_ended) else f"the table ready {copy_ended:.1f} s in"
        print(f"  copy: {copied:,.0f} rows of {benchlib.TABLE} copied while the load ran ({state})")
    load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    target = TARGET_P99_S[args.destination]
    for what, value in (("registry p99", p99), ("exact p99" + (" during the copy" if copying else ""), every)):
        verdict = "meets" if value < target else "ABOVE"
        print(f"  {what} {ms(value)} ms: {verdict} the target p99 < {ms(target)} ms")
    print(f"  load average now {load_avg}; at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    return every


def exact_line(name: str, latencies: list[float]) -> float:
    """Print p50, p99 (linear between the closest ranks) and max of exact latencies; return the p99."""
    if not latencies:
        return math.nan
    values = np.array(latencies)
    p50, p99 = np.percentile(values, 50), np.percentile(values, 99)
    print(f"  {name:<58} {values.size:>8,} {ms(p50):>8} {ms(p99):>8} {ms(values.max()):>9}")
    return float(p99)


def ready(pipeline: Pipeline, copy_begun: bool) -> bool:
    """Every table ready; or, with ``copy_begun``, the latency table ready and the other one copying."""
    states = pipeline.states
    kinds = sorted(s.kind.value for s in states.snapshot().values()) if states is not None else []
    if copy_begun:
        return kinds == sorted([TableStateKind.READY.value, TableStateKind.COPYING.value])
    return bool(kinds) and all(k == TableStateKind.READY.value for k in kinds)


def copied_rows(registry: CollectorRegistry) -> float:
    """``etl_copied_rows_total`` over every table."""
    return sum(
        s.value
        for f in registry.collect()
        if f.name == "etl_copied_rows"
        for s in f.samples
        if s.name.endswith("_total")
    )


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--rate", type=int, default=1000, help="transactions per second to commit (default 1000)")
    parser.add_argument("--seconds", type=int, default=30, help="how long the load runs (default 30)")
    parser.add_argument("--clients", type=int, default=4, help="pgbench connections holding the rate (default 4)")
    parser.add_argument(
        "--max-fill-ms", type=int, default=1000, help="[batch] max_fill_ms of the pipeline (default 1000, the engine's)"
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="synchronous_commit of the committing sessions (default on, as most servers run)",
    )
    parser.add_argument(
        "--destination", choices=["null", "ducklake"], default="null", help="where the pipeline writes (default null)"
    )
    parser.add_argument(
        "--copying", type=int, default=0, help="measure again while a table of this many rows copies incrementally"
    )
    parser.add_argument("--chunk-rows", type=int, default=500_000, help="the copy's chunk_rows (default 500000)")
    args = parser.parse_args()
    with benchlib.source(args) as src, tempfile.TemporaryDirectory(prefix="etl-latency-") as workdir:
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        script = prepare(src, args, Path(workdir))
        alone = run(src, args, Path(workdir) / "alone", script, copying=False)
        if args.copying:
            beside = run(src, args, Path(workdir) / "copying", script, copying=True)
            print(f"\np99 while the copy ran / p99 without it: {beside / alone:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
