"""SIGKILL the pipeline process during the copy and during streaming, restart it: nothing lost, nothing doubled.

The destination is the plugin template's durable SQLite mirror (a real, watermarked destination); the
store is SQLite or Postgres, so state has to survive the process.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from etl_plugin_example.mirror_reader import MirrorReader

from etl.testing.compare import source_rows
from etl.testing.pytest_plugin import TestDatabase

TABLES = ("public.items", "public.ledger")


def write_config(path: Path, db: TestDatabase, store: str, tmp_path: Path) -> Path:
    store_section = (
        f'type = "sqlite"\npath = "{tmp_path / "state.sqlite"}"'
        if store == "sqlite"
        else f'type = "postgres"\nhost = "127.0.0.1"\nport = {db.cluster.port}\ndatabase = "{db.name}"\n'
        'user = "postgres"\nsslmode = "disable"'
    )
    path.write_text(
        f"""
[pipeline]
id = 9
publication = "pub"
copy_connections = 2
[source]
host = "127.0.0.1"
port = {db.cluster.port}
database = "{db.name}"
user = "postgres"
sslmode = "disable"
[batch]
max_fill_ms = 200
max_bytes = 65536
[store]
{store_section}
[destination]
type = "sqlite_mirror"
path = "{tmp_path / "mirror.sqlite"}"
"""
    )
    return path


class Runner:
    """``etl run`` as a child process that the test kills and restarts."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "etl.cli", "--log-level", "warning", "run", "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                assert self.process.wait(timeout=60) == 0
            finally:
                self.process.kill()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def mirror_rows(mirror: Path, table: str) -> list[dict[str, object]] | None:
    if not mirror.exists():
        return None
    try:
        with MirrorReader(mirror) as reader:
            return reader.rows(table)
    except (KeyError, sqlite3.OperationalError):  # not created yet
        return None


def wait_equal(db: TestDatabase, mirror: Path, runner: Runner, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    with db.connect() as conn:
        while True:
            if all(mirror_rows(mirror, t) == source_rows(conn, t) for t in TABLES):
                return
            assert runner.alive(), "etl run exited"
            assert time.monotonic() < deadline, "the destination never became equal to the source"
            time.sleep(0.3)


@pytest.fixture(params=["sqlite", "postgres"])
def setup(request: pytest.FixtureRequest, pg_database: TestDatabase, tmp_path: Path) -> Iterator[tuple[Runner, Path]]:
    db = pg_database
    db.execute(
        """
        CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int, updated timestamptz);
        INSERT INTO items SELECT g, 'item ' || g, g % 100, timestamptz '2026-01-01 00:00+00' + g * interval '1 s'
            FROM generate_series(1, 200000) g;
        CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item bigint, delta int);
        INSERT INTO ledger (item, delta) SELECT g % 1000, g % 7 - 3 FROM generate_series(1, 50000) g;
        CREATE PUBLICATION pub FOR TABLE items, ledger;
        """
    )
    runner = Runner(write_config(tmp_path / "pipeline.toml", db, request.param, tmp_path))
    try:
        yield runner, tmp_path / "mirror.sqlite"
    finally:
        runner.stop()


def test_sigkill_during_copy_then_restart(pg_database: TestDatabase, setup: tuple[Runner, Path]) -> None:
    runner, mirror = setup
    runner.start()
    deadline = time.monotonic() + 60
    while not (rows := mirror_rows(mirror, "public.items")):  # some rows copied, the copy not finished
        assert time.monotonic() < deadline and runner.alive()
        time.sleep(0.02)
    assert len(rows) < 200000, "the copy finished before the kill; make the table bigger"
    runner.kill()
    pg_database.execute("UPDATE items SET qty = -1 WHERE id % 1000 = 0; DELETE FROM ledger WHERE id % 10 = 0")
    runner.start()
    wait_equal(pg_database, mirror, runner)


def test_sigkill_during_streaming_then_restart(pg_database: TestDatabase, setup: tuple[Runner, Path]) -> None:
    runner, mirror = setup
    runner.start()
    wait_equal(pg_database, mirror, runner)

    done = threading.Event()

    def workload() -> None:
        with pg_database.connect() as conn:
            for i in range(400):
                with conn.transaction():
                    conn.execute("INSERT INTO ledger (item, delta) VALUES (%s, 1)", (i,))
                    conn.execute("UPDATE items SET qty = qty + 1, name = name || '+' WHERE id = %s", (i % 50 + 1,))
                    conn.execute("DELETE FROM ledger WHERE id = %s", (i * 7 + 1,))
                time.sleep(0.005)
        done.set()

    writer = threading.Thread(target=workload)
    writer.start()
    time.sleep(0.8)  # some of the workload streamed, some not yet
    runner.kill()
    time.sleep(0.5)
    runner.start()
    writer.join(timeout=120)
    assert done.is_set()
    pg_database.execute("TRUNCATE ledger")
    pg_database.execute("INSERT INTO ledger (item, delta) VALUES (1, 1)")
    wait_equal(pg_database, mirror, runner)
