"""`etl status` next to a running pipeline: JSON with each table's state and copy progress, the live view in a
real terminal, and `etl check --format json`."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from etl.config import load_config
from etl.destination.base import WriteResult
from etl.destination.memory import MemoryDestination
from etl.factory import build_store
from etl.lsn import Lsn
from etl.pipeline import Pipeline
from etl.schema import TableSchema
from etl.store.base import APPLY_WORKER, CopyProgress, RetryKind, TableState, TableStateKind
from etl.testing.pipelines import all_ready, pipeline_config, poll, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config

ROWS = 20_000


def etl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "etl.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


def status_json(config: Path) -> dict[str, Any]:
    result = etl("status", "-c", str(config), "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def wait_for_report(
    config: Path, condition: Callable[[dict[str, Any]], bool], what: str, timeout: float = 120
) -> dict[str, Any]:
    return poll(lambda: status_json(config), f"status showing {what}", until=condition, timeout=timeout, least=0.3)


def tables_by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in report["tables"]}


def all_tables_ready(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda r: len(r["tables"]) == count and all(t["state"] == "ready" for t in r["tables"])


@pytest.fixture
def source(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        f"CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'x' FROM generate_series(1, {ROWS}) g"
    )
    pg_database.execute('CREATE TABLE "Empty" (id int PRIMARY KEY)')
    pg_database.execute('ANALYZE t; ANALYZE "Empty"; CREATE PUBLICATION pub FOR TABLE t, "Empty"')
    return pg_database


def sqlite_pipeline(tmp_path: Path, db: TestDatabase, **sections: Any) -> Path:
    config = pipeline_config(
        db, pipeline_id=5, store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")}, **sections
    )
    return write_config(tmp_path / "pipeline.toml", config)


def test_status_json_holds_each_tables_state_and_copy(source: TestDatabase, tmp_path: Path) -> None:
    config = sqlite_pipeline(tmp_path, source, destination={"type": "null"})
    with PipelineProcess(config) as run:
        run.start()
        report = wait_for_report(config, all_tables_ready(2), "both tables ready")
        run.ensure_alive()
        text = etl("status", "-c", str(config))
    [(t_oid, empty_oid)] = source.execute("""SELECT 't'::regclass::oid::bigint, '"Empty"'::regclass::oid::bigint""")
    assert report["pipeline_id"] == 5 and report["publication"] == "pub"
    assert report["store"] == {"type": "sqlite", "durable": True}
    assert report["problems"] == [] and report["notes"] == []
    assert report["destination"] is None  # the null destination records no position of its own
    tables = tables_by_name(report)
    assert set(tables) == {"public.t", 'public."Empty"'}
    full, empty = tables["public.t"], tables['public."Empty"']
    assert (full["oid"], empty["oid"]) == (t_oid, empty_oid)
    for table in (full, empty):
        assert (table["state"], table["reason"], table["retry"]) == ("ready", None, None)
        assert table["copy"]["finished"] is True and table["copy"]["percent"] == 100.0
        assert table["copy"]["eta_s"] == 0.0 and table["copy"]["rows_per_s"] >= 0
    copy = full["copy"]
    assert (copy["rows"], copy["estimate"]) == (ROWS, ROWS), "the final progress counts every row of the table"
    assert copy["started_at"] <= copy["recorded_at"] and copy["started_at"].endswith("+00:00")
    assert (empty["copy"]["rows"], empty["copy"]["estimate"]) == (0, 0)
    [slot] = [s for s in report["slots"] if s["name"] == "etl_apply_5"]
    assert isinstance(slot["lag_bytes"], int) and slot["wal_status"] in ("reserved", "extended")
    assert report["apply_durable_progress"] is not None

    assert text.returncode == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if x.startswith("public.t "))
    assert line.split()[1] == "ready" and f"{ROWS:,} rows in " in line and "rows/s" in line, text.stdout
    slot_line = next(x for x in text.stdout.splitlines() if x.startswith("etl_apply_5 ")).split()
    assert slot_line[1] == "yes" and slot_line[3] in ("reserved", "extended"), text.stdout
    assert not {"True", "False", "None"} & set(text.stdout.split()), text.stdout


def test_status_json_of_a_stopped_pipeline_names_errors_and_problems(source: TestDatabase, tmp_path: Path) -> None:
    """States as a stopped pipeline left them: a table not copied yet (named by the source), an errored one with
    its reason and retry, a copy that stopped half-way; the store holds progress but the apply slot is gone."""
    config_path = sqlite_pipeline(tmp_path, source, destination={"type": "null"})
    [(t_oid, empty_oid)] = source.execute("""SELECT 't'::regclass::oid::bigint, '"Empty"'::regclass::oid::bigint""")
    retry_at = datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
    started = datetime.now(UTC) - timedelta(minutes=5)
    store = build_store(load_config(config_path), str(config_path))
    try:
        store.update_table_states(
            {
                t_oid: TableState.errored("value out of range", "fix it", RetryKind.TIMED, retry_at),
                empty_oid: TableState.init(),
                4_000_000_000: TableState(TableStateKind.DATA_SYNC),  # no such table in the source any more
            }
        )
        store.record_copy_progress(t_oid, CopyProgress(500, 2000, started, started + timedelta(seconds=10)))
        store.upsert_progress(APPLY_WORKER, Lsn(0x16_B374D848))
    finally:
        store.close()

    result = etl("status", "-c", str(config_path), "--format", "json")
    assert result.returncode == 1, "a lost apply slot is a problem: " + result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["apply_durable_progress"] == "16/B374D848" and report["slots"] == []
    [problem] = report["problems"]
    assert problem["kind"] == "apply_slot_lost" and "etl_apply_5 is gone" in problem["message"]
    assert f"etl reset --recopy -c {config_path}" in problem["hint"]
    tables = {t["oid"]: t for t in report["tables"]}
    assert [t["name"] for t in report["tables"]] == ['public."Empty"', "public.t", None]
    errored = tables[t_oid]
    assert (errored["state"], errored["reason"], errored["hint"], errored["retry"], errored["retry_at"]) == (
        "errored",
        "value out of range",
        "fix it",
        "timed",
        "2030-05-06T07:08:09+00:00",
    )
    assert errored["copy"] == {
        "rows": 500,
        "estimate": 2000,
        "percent": 25.0,
        "rows_per_s": 50.0,
        "eta_s": 30.0,
        "elapsed_s": 10.0,
        "started_at": started.isoformat(),
        "recorded_at": (started + timedelta(seconds=10)).isoformat(),
        "finished": False,
        "note": None,
    }
    assert (tables[empty_oid]["state"], tables[empty_oid]["copy"], tables[empty_oid]["reason"]) == ("init", None, None)
    assert tables[4_000_000_000]["state"] == "data_sync"

    text = etl("status", "-c", str(config_path))
    assert text.returncode == 1
    assert "PROBLEM: replication slot etl_apply_5 is gone" in text.stdout
    line = next(x for x in text.stdout.splitlines() if x.startswith("public.t "))
    assert "errored (next retry at 2030-05-06 07:08:09 UTC): value out of range" in line
    assert "500/2,000 rows (25.0%), 50 rows/s, 30s left" in line


class HeldCopy(MemoryDestination):
    """The memory destination, whose copy writes wait until ``released`` (a copy caught in the middle)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.released = threading.Event()

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        if rows.num_rows:  # the empty table's copy goes through
            self.writing.set()
            self.released.wait(120)
        return super().write_table_rows(schema, rows)


@pytest.fixture
def held_pipeline(source: TestDatabase, tmp_path: Path) -> Iterator[tuple[Path, Pipeline, HeldCopy]]:
    config = pipeline_config(source, pipeline_id=5, store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")})
    config_path = write_config(tmp_path / "pipeline.toml", config)
    destination = HeldCopy()
    pipeline = Pipeline(config, build_store(config, str(config_path)), destination)
    pipeline.start()
    try:
        yield config_path, pipeline, destination
    finally:
        destination.released.set()
        pipeline.shutdown()


def test_status_in_another_process_sees_a_copy_in_the_middle(
    held_pipeline: tuple[Path, Pipeline, HeldCopy],
) -> None:
    config, pipeline, destination = held_pipeline
    wait_until(destination.writing.is_set, "the copy writing", pipeline)
    copying = wait_for_report(
        config,
        lambda r: tables_by_name(r).get("public.t", {}).get("copy") is not None,
        "the copy of public.t",
    )
    table = tables_by_name(copying)["public.t"]
    assert table["state"] == "data_sync"
    assert table["copy"]["finished"] is False
    assert (table["copy"]["rows"], table["copy"]["estimate"], table["copy"]["percent"]) == (0, ROWS, 0.0)

    destination.released.set()
    wait_until(lambda: all_ready(pipeline, 2), "both tables ready", pipeline)
    done = tables_by_name(status_json(config))["public.t"]["copy"]
    assert (done["rows"], done["finished"], done["percent"]) == (ROWS, True, 100.0)


# -- the live view, in a real terminal -----------------------------------------------------------------------

_BECOME_TERMINAL_SESSION = """
import fcntl, os, sys, termios
os.setsid()  # a session of its own whose controlling terminal is the pty: Ctrl-C there is its SIGINT
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
os.execv(sys.executable, [sys.executable, "-m", "etl.cli", *sys.argv[1:]])
"""

_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")


class Terminal:
    """A command whose stdin, stdout and stderr are a pseudo-terminal of ``rows`` x ``columns``."""

    def __init__(self, args: list[str], rows: int = 40, columns: int = 160) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM", "CI")}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BECOME_TERMINAL_SESSION, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**env, "TERM": "xterm-256color"},
        )
        os.close(slave)
        self.master = master
        self.raw = b""

    def text(self) -> str:
        """Everything written so far, without the terminal's control sequences."""
        return _ESCAPES.sub("", self.raw.decode(errors="replace"))

    def read(self, timeout: float) -> bool:
        """Read what is there within ``timeout``; False at the end of the output."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every holder of the terminal's other side has closed it
            return False
        self.raw += chunk
        return bool(chunk)

    def wait_for(self, condition: Callable[[str], bool], what: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while not condition(self.text()):  # a read that finds nothing new is no failure: a refresh takes a while
            assert time.monotonic() < deadline, f"the terminal never showed {what}:\n{self.text()}"
            self.read(0.5)
        return self.text()

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def finish(self, timeout: float = 30) -> int:
        """Read to the end of the output and return the exit code."""
        deadline = time.monotonic() + timeout
        while self.read(0.5):
            assert time.monotonic() < deadline, f"the command did not end:\n{self.text()}"
        return self.process.wait(timeout=timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)


def test_watch_shows_states_copy_and_lag_live_until_ctrl_c(source: TestDatabase, tmp_path: Path) -> None:
    config = sqlite_pipeline(tmp_path, source, destination={"type": "null"})
    terminal = Terminal(["status", "-c", str(config), "--watch", "--interval", "0.5"], columns=220)
    try:
        terminal.wait_for(lambda s: "no tables yet" in s and "no slots" in s, "a pipeline that never ran")
        with PipelineProcess(config) as run:
            run.start()  # the view, already running, reads the store afresh at each refresh
            ready = re.compile(r"public\.t\W+ready\W")
            screen = terminal.wait_for(
                lambda s: bool(ready.search(s)) and "etl_apply_5" in s and f"{ROWS:,} (100.0%)" in s,
                "public.t copied and ready, and the apply slot",
            )
            assert 'public."Empty"' in screen
            for header in ("state", "copy", "rows/s", "ETA", "lag", "confirmed flush"):
                assert header in screen, f"no {header!r} column:\n{screen}"
            assert "done" in screen and "━" in screen, "a finished copy's progress bar"
            source.execute(f"INSERT INTO t VALUES ({ROWS + 1}, 'streamed')")
            screen = terminal.wait_for(lambda s: "1 ins, 0 upd, 0 del" in s, "the streamed insert, counted")
            assert "changes" in screen and "last write" in screen and " ago)" in screen, screen
            run.ensure_alive()
            terminal.send(b"\x03")
            assert terminal.finish() == 0, terminal.text()
    finally:
        terminal.close()


def test_watch_needs_a_durable_store(source: TestDatabase, tmp_path: Path) -> None:
    config = write_config(tmp_path / "pipeline.toml", pipeline_config(source, destination={"type": "null"}))
    result = etl("status", "-c", str(config), "--watch")
    assert result.returncode == 1
    assert "etl status --watch needs a durable store" in result.stderr
    assert '[store] type = "sqlite" or "postgres"' in result.stderr

    once = etl("status", "-c", str(config), "--format", "json")
    assert once.returncode == 0, once.stderr
    report = json.loads(once.stdout)
    assert report["store"] == {"type": "memory", "durable": False}
    assert report["tables"] == [] and "status needs a durable store" in report["notes"][0]


# -- etl check --format json --------------------------------------------------------------------------------


def test_check_json(source: TestDatabase, tmp_path: Path) -> None:
    config = sqlite_pipeline(tmp_path, source, destination={"type": "null"})
    result = etl("check", "-c", str(config), "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    names = [c["name"] for c in report["checks"]]
    assert {"source reachable", "wal_level", "publication", "store", "destination"} <= set(names)
    assert report["ok"] is True and report["totals"]["failed"] == 0
    assert report["totals"]["checks"] == len(names) == report["totals"]["passed"] + report["totals"]["warned"]
    wal = next(c for c in report["checks"] if c["name"] == "wal_level")
    assert (wal["passed"], wal["verdict"], wal["hint"]) == (True, "pass", None)
    assert "logical" in wal["message"]

    bad = write_config(
        tmp_path / "bad.toml", pipeline_config(source, publication="nope", store={"type": "nosuchstore"})
    )
    failed = etl("check", "-c", str(bad), "--format", "json")
    assert failed.returncode == 1
    report = json.loads(failed.stdout)
    assert report["ok"] is False and report["totals"]["failed"] >= 2
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["publication"]["verdict"] == "fail" and "CREATE PUBLICATION nope" in by_name["publication"]["hint"]
    assert by_name["store"]["passed"] is False and "nosuchstore" in by_name["store"]["message"]
