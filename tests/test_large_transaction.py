"""A 1M-row transaction streams with bounded memory (protocol 2 streaming, spilled to disk)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from etl.testing.pytest_plugin import TestDatabase

ROWS = 1_000_000
PEAK_RSS_LIMIT_MB = 400

ENGINE = textwrap.dedent(
    """
    import json, sys, time
    from etl.config import PipelineConfig
    from etl.destination.null import NullDestination
    from etl.pipeline import Pipeline
    from etl.store.memory import MemoryStore
    from etl.store.base import TableStateKind
    from etl.log import configure_logging

    configure_logging("console", "warning")  # logs to stderr; stdout carries the results
    config = PipelineConfig.model_validate(json.loads(sys.argv[1]))
    destination = NullDestination()
    pipeline = Pipeline(config, MemoryStore(pipeline_id=1), destination)
    pipeline.start()
    deadline = time.monotonic() + 60
    while not (pipeline.states and all(s.kind is TableStateKind.READY for s in pipeline.states.snapshot().values())
               and pipeline.states.snapshot()):
        assert time.monotonic() < deadline, "not ready"
        time.sleep(0.05)
    print("ready", flush=True)
    expected = int(sys.stdin.readline())
    deadline = time.monotonic() + 600
    while destination.changed_rows < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    pipeline.shutdown()
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
    print(json.dumps({"rows": destination.changed_rows, "peak_rss_kb": hwm}), flush=True)
    """
)


@pytest.mark.slow
def test_million_row_transaction_streams_with_bounded_memory(pg_database: TestDatabase) -> None:
    db = pg_database
    db.execute("CREATE TABLE big (id bigint PRIMARY KEY, payload text, n numeric(12,2), at timestamptz)")
    db.execute("CREATE PUBLICATION pub FOR TABLE big")
    config = {
        "pipeline": {"id": 1, "publication": "pub"},
        "source": db.connection().model_dump(),
        "batch": {"max_fill_ms": 500, "spill_threshold_bytes": 16 * 1024 * 1024},
    }
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert engine.stdout is not None and engine.stdin is not None
        assert engine.stdout.readline().strip() == "ready"
        with db.connect() as conn:
            conn.execute("SET logical_decoding_work_mem = '64MB'")  # the server streams the transaction in chunks
            conn.execute(
                "INSERT INTO big SELECT g, md5(g::text), g / 100.0, now() FROM generate_series(1, %s) g", (ROWS,)
            )
        engine.stdin.write(f"{ROWS}\n")
        engine.stdin.flush()
        result = json.loads(engine.stdout.readline())
        assert engine.wait(timeout=120) == 0
    finally:
        engine.kill()
    assert result["rows"] == ROWS
    assert result["peak_rss_kb"] < PEAK_RSS_LIMIT_MB * 1024, result
