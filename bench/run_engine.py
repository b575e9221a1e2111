"""The engine side of a benchmark: one pipeline into the null destination, in this process.

Started by ``bench_copy.py`` and ``bench_streaming.py``; not meant to be run by hand. Modes:

- ``copy``: start the pipeline and time until the null destination counted ``--rows`` copied rows (with
  ``--method incremental``, chunk rows, which come as changes).
- ``ready``: start the pipeline, wait until every table is Ready, stop (the store keeps the states).
- ``stream``: start the pipeline (tables already Ready in the store) and time until the null
  destination counted ``--rows`` changed rows.

Each mode ends by printing one JSON line ``{"event": "done", ...}`` with the seconds, the process's
CPU seconds and its peak resident set size (``VmHWM``: the kernel's high-water mark, so no sampling).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from etl.config import PipelineConfig
from etl.destination.base import WriteResult
from etl.destination.null import NullDestination
from etl.events import EventBatch
from etl.log import configure_logging
from etl.pipeline import Pipeline
from etl.schema import TableSchema
from etl.store.base import Store, TableStateKind
from etl.store.memory import MemoryStore
from etl.testing import free_port
from etl_store_sqlite.store import SqliteStore


class CountingNull(NullDestination):
    """The null destination, plus an event set once ``target`` rows arrived (no polling in the hot path)."""

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target
        self.reached = threading.Event()

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        result = super().write_table_rows(schema, rows)
        if self.copied_rows >= self.target:
            self.reached.set()
        return result

    def write_events(self, batch: EventBatch) -> WriteResult:
        result = super().write_events(batch)
        if self.changed_rows + self.copied_rows >= self.target:
            self.reached.set()
        return result


def peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("VmHWM not found in /proc/self/status")


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def wait_for(pipeline: Pipeline, condition: Callable[[], bool], event: threading.Event | None = None) -> None:
    """Wait until ``condition()``, checked when ``event`` is set or every 50 ms."""
    while not condition():
        if pipeline.wait(timeout=0):
            raise RuntimeError("the pipeline stopped before the benchmark finished")
        if event is not None:
            event.wait(0.05)
        else:
            time.sleep(0.05)


class Scraper:
    """Reads ``/metrics`` every second on a thread, as a Prometheus server would while the benchmark runs."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with urllib.request.urlopen(self._url, timeout=10) as response:
                response.read()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def all_ready(pipeline: Pipeline) -> bool:
    states = pipeline.states
    kinds = [s.kind for s in states.snapshot().values()] if states is not None else []
    return bool(kinds) and all(k is TableStateKind.READY for k in kinds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["copy", "ready", "stream"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("--publication", required=True)
    parser.add_argument("--pipeline-id", type=int, default=1)
    parser.add_argument("--rows", type=int, default=0, help="rows the null destination must count")
    parser.add_argument("--store", type=Path, help="SQLite store file (default: the memory store)")
    parser.add_argument("--method", choices=["snapshot", "incremental"], default="snapshot", help="[copy] method")
    parser.add_argument("--chunk-rows", type=int, default=50_000, help="[copy] chunk_rows (incremental)")
    parser.add_argument(
        "--metrics", action="store_true", help="serve [metrics] on a free port and scrape it every second"
    )
    args = parser.parse_args()
    configure_logging(level="warning")

    raw: dict[str, Any] = {
        "pipeline": {"id": args.pipeline_id, "publication": args.publication},
        "source": {"host": "127.0.0.1", "port": args.port, "database": args.database, "sslmode": "disable"},
    }
    raw["copy"] = {"method": args.method, "chunk_rows": args.chunk_rows}
    port = free_port()
    if args.metrics:
        raw["metrics"] = {"listen": f"127.0.0.1:{port}", "sample_interval_s": 1}
    config = PipelineConfig.model_validate(raw)
    store: Store = SqliteStore(args.store, args.pipeline_id) if args.store else MemoryStore(args.pipeline_id)
    destination = CountingNull(args.rows)
    pipeline = Pipeline(config, store, destination)
    cpu_before = os.times()
    started = time.monotonic()
    pipeline.start()
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics") if args.metrics else None
    try:
        if args.mode == "copy":
            wait_for(
                pipeline, lambda: destination.copied_rows + destination.changed_rows >= args.rows, destination.reached
            )
        elif args.mode == "ready":
            wait_for(pipeline, lambda: all_ready(pipeline))
        else:
            wait_for(pipeline, lambda: destination.changed_rows >= args.rows, destination.reached)
        seconds = time.monotonic() - started
        cpu_after = os.times()
    finally:
        if scraper is not None:
            scraper.stop()
        pipeline.shutdown(timeout=60)
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    copied = destination.copied_rows + destination.changed_rows  # an incremental copy's chunks come as changes
    rows = copied if args.mode == "copy" else destination.changed_rows
    emit("done", seconds=seconds, rows=rows, cpu_seconds=cpu, peak_rss_mb=peak_rss_mb(), batches=destination.batches)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
