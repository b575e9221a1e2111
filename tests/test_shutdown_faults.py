"""`etl run` stops within `[pipeline] shutdown_timeout_s` of SIGTERM even when the source server is frozen
(postmaster and backends SIGSTOPped) in the middle of a table copy, and a restart after the server is back
ends with the destination equal to the source, row for row.

The destination is the plugin template's durable SQLite mirror and the store is SQLite, so what the
stopped run left behind is what the restarted run resumes from.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path

import pytest
from etl_plugin_example.mirror_reader import mirrored_rows
from etl_plugin_example.mirror_schema import sqlite_table_name

from etl.cli import EXIT_UNDRAINED
from etl.schema import TableName
from etl.testing.compare import source_rows
from etl.testing.pipelines import pipeline_config, poll
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config

ROWS = 200_000
"""Rows of ``wide``, 1 kB each: far more than the socket buffers of the copy connections hold (up to ~36 MB
each here), so the copy stalls on the frozen server before it is done."""
TABLES = ("public.wide", "public.small")
MARGIN_S = 20.0
"""Time allowed past the drain timeout: logging the exit, and a loaded machine."""


def copied(mirror: Path) -> int:
    """Rows of ``wide`` in the mirror so far (a count: reading every row at each poll would be slow)."""
    if not mirror.exists():
        return 0
    table = sqlite_table_name(TableName("public", "wide")).replace('"', '""')
    try:
        with closing(sqlite3.connect(f"file:{mirror}?mode=ro", uri=True)) as conn:
            return int(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


def wait_until_stalled(runner: PipelineProcess, mirror: Path, quiet_s: float = 3.0) -> None:
    """Wait until the copy has used up what the socket buffers held: no new row for ``quiet_s`` seconds.

    Until then the copy still gets rows, and a run stopped then drains cleanly; after it, every copy
    connection waits on the frozen server.
    """
    deadline = time.monotonic() + 120
    last, since = copied(mirror), time.monotonic()
    while time.monotonic() - since < quiet_s:
        runner.ensure_alive()
        assert time.monotonic() < deadline, "the copy never stalled on the frozen server"
        time.sleep(0.2)
        if (now := copied(mirror)) != last:
            last, since = now, time.monotonic()
    assert last < ROWS, "the copy finished before the server froze; make the table bigger"


def wait_for_copy_in_progress(runner: PipelineProcess, mirror: Path) -> None:
    def rows() -> int:
        runner.ensure_alive()
        return copied(mirror)

    poll(rows, "a row copied", timeout=120)


@pytest.mark.parametrize(
    ("timeout_s", "signals"),
    [(3, [signal.SIGTERM]), (300, [signal.SIGTERM, signal.SIGINT])],
    ids=["drain-timeout", "second-signal"],
)
@pytest.mark.slow
def test_sigterm_ends_run_against_a_frozen_source_then_restart_catches_up(
    pg_database: TestDatabase, tmp_path: Path, timeout_s: int, signals: list[signal.Signals]
) -> None:
    db = pg_database
    db.execute(
        f"""
        CREATE TABLE wide (id bigint PRIMARY KEY, pad text);
        INSERT INTO wide SELECT g, repeat(md5(g::text), 32) FROM generate_series(1, {ROWS}) g;
        CREATE TABLE small (id int PRIMARY KEY, v text);
        INSERT INTO small SELECT g, 'v' || g FROM generate_series(1, 1000) g;
        CREATE PUBLICATION pub FOR TABLE wide, small;
        """
    )
    mirror = tmp_path / "mirror.sqlite"
    config = pipeline_config(
        db,
        pipeline_id=5,
        pipeline={"shutdown_timeout_s": timeout_s},
        copy={"connections": 2},
        batch={"max_fill_ms": 200, "max_bytes": 65536},
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={"type": "sqlite_mirror", "path": str(mirror)},
    )
    with PipelineProcess(write_config(tmp_path / "pipeline.toml", config)) as runner:
        runner.start()
        wait_for_copy_in_progress(runner, mirror)
        process = runner.process
        assert process is not None
        bound = (timeout_s if len(signals) == 1 else 0) + MARGIN_S
        with db.cluster.frozen():
            wait_until_stalled(runner, mirror)
            began = time.monotonic()
            for sig in signals:
                process.send_signal(sig)
            try:
                code = process.wait(timeout=bound)
            except subprocess.TimeoutExpired:
                process.kill()
                raise AssertionError(
                    f"etl run was still running {bound:.0f}s after {', '.join(s.name for s in signals)} against a"
                    f" frozen source:\n{runner.output()[-4000:]}"
                ) from None
            took = time.monotonic() - began
        # A run that could drain cleanly exits 0; one blocked on the frozen server exits EXIT_UNDRAINED, saying so.
        assert code in (0, EXIT_UNDRAINED), f"exit code {code}:\n{runner.output()[-4000:]}"
        if code == EXIT_UNDRAINED:
            assert "exiting without a clean drain" in runner.output()
            assert "durable progress is kept" in runner.output()
        if len(signals) == 1:
            assert took >= timeout_s - 0.5 or code == 0, f"exited after {took:.1f}s, before its drain timeout"

        runner.start()
        with db.connect() as conn:
            runner.wait_equal(
                lambda: [source_rows(conn, t) for t in TABLES],
                lambda: [mirrored_rows(mirror, t) for t in TABLES],
                timeout=180,
                interval=0.5,
            )
        runner.stop()  # a clean SIGTERM still drains and exits 0


def test_sigterm_while_the_store_server_is_frozen_stops_the_start_cleanly(
    pg_database: TestDatabase, tmp_path: Path
) -> None:
    """SIGTERM while ``etl run`` still builds its store, whose server is frozen: it exits 0 at once, saying it
    stopped before the pipeline started; once the server is back, the next run copies the table into the mirror."""
    db = pg_database
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'x' FROM generate_series(1, 100) g;"
        " CREATE PUBLICATION pub FOR TABLE t"
    )
    mirror = tmp_path / "mirror.sqlite"
    config = pipeline_config(
        db,
        store={"type": "postgres", **db.connection().model_dump(exclude_none=True)},
        destination={"type": "sqlite_mirror", "path": str(mirror)},
    )
    runner = PipelineProcess(write_config(tmp_path / "pipeline.toml", config), log_level="info")
    with db.cluster.frozen():
        runner.start()

        def log() -> str:
            runner.ensure_alive()
            return runner.output()

        poll(log, "etl run to start", until=lambda out: "etl run starting" in out, timeout=60)
        assert runner.process is not None
        runner.process.send_signal(signal.SIGTERM)
        code = runner.process.wait(timeout=MARGIN_S)
    assert code == 0, runner.output()[-4000:]
    assert "stopped before the pipeline started" in runner.output()
    with runner, db.connect() as conn:
        runner.start()
        runner.wait_equal(lambda: source_rows(conn, "public.t"), lambda: mirrored_rows(mirror, "public.t"))
