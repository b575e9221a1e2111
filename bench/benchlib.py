"""What the benchmark scripts share: the source cluster, the workload table, the engine child, reporting.

The engine always runs in a child process (``run_engine.py``) so that its peak RSS (``VmHWM``) is the
engine's alone and the workload generator does not share its interpreter. The child writes one JSON
object per line on stdout; the parent reads them with ``Engine.expect``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow

from etl.config import PostgresConnection
from etl.demo_postgres import PERSON_SESSION
from etl.log import configure_logging
from etl.postgres.connection import connect
from etl.testing import PostgresInstall, TemporaryCluster, find_install

BENCH_DIR = Path(__file__).resolve().parent
DATABASE = "bench"
PUBLICATION = "bench_pub"
TABLE = "bench_rows"

# Server settings of the throwaway cluster on top of the test defaults: no checkpoints in the middle
# of a run, and no wal_sender_timeout while a walsender waits for a client that is not reading yet.
CLUSTER_SETTINGS = {
    "wal_sender_timeout": "0",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "1h",
    "shared_buffers": "512MB",
    "autovacuum": "off",
}
# On disk, as earlier figures were, not in the tests' /dev/shm: a run's WAL takes gigabytes.
DISK = Path("/tmp")

COLUMNS = """
    id bigint PRIMARY KEY,
    account integer NOT NULL,
    name text,
    amount numeric(12,2),
    score double precision,
    active boolean,
    created timestamptz,
    day date,
    payload jsonb
"""
"""The workload table: mixed types, about 150 bytes of text per row."""


def row_values(g: str) -> str:
    """A SELECT list for the row with id ``g`` (an SQL expression); every fifth name is NULL."""
    return f"""
        {g},
        ({g} % 1000)::int,
        CASE WHEN {g} % 5 = 0 THEN NULL ELSE 'customer ' || {g} END,
        ({g} % 1000000) / 100.0,
        {g} * 0.37,
        {g} % 2 = 0,
        timestamptz '2024-01-01 00:00:00+00' + {g} * interval '1 second',
        date '2024-01-01' + ({g} % 3650)::int,
        jsonb_build_object('g', {g}, 'tag', 't' || {g} % 10)
    """


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--major", type=int, default=18, help="Postgres major version of the binaries (default 18)")
    parser.add_argument(
        "--port",
        type=int,
        help="use a running server on 127.0.0.1:PORT (user postgres, trust auth, wal_level=logical,"
        " wal_sender_timeout=0) instead of a throwaway cluster; the database 'bench' is dropped and recreated",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="record each timed engine run with py-spy (pip install py-spy) into this directory, as collapsed stacks",
    )
    return parser


@dataclass
class Source:
    """The benchmark database and the client tools of the same installation."""

    install: PostgresInstall
    port: int
    profile: Path | None = None
    """Where ``Engine`` writes py-spy profiles, if anywhere."""

    def connection(self, database: str = DATABASE) -> PostgresConnection:
        return PostgresConnection(host="127.0.0.1", port=self.port, database=database, sslmode="disable")

    def connect(self, database: str = DATABASE) -> psycopg.Connection[Any]:
        # the workload's session: the database's own search_path, as a person's (the engine's are pinned)
        return connect(self.connection(database), settings=PERSON_SESSION)

    def execute(self, sql: str) -> None:
        with self.connect() as conn:
            conn.execute(sql)

    def scalar(self, sql: str) -> Any:
        with self.connect() as conn:
            row = conn.execute(sql).fetchone()
            return row[0] if row else None

    def drop_slots(self) -> None:
        """Drop the inactive replication slots of the benchmark database."""
        self.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            f" WHERE database = '{DATABASE}' AND NOT active"
        )

    def client(self, tool: str, *args: str) -> list[str]:
        """The command line of a client tool (``psql``, ``pg_recvlogical``) against the benchmark database."""
        return [self.install.tool(tool), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", *args]

    def server_version(self) -> str:
        return str(self.scalar("SELECT version()")).split(" on ")[0]


@contextlib.contextmanager
def source(args: argparse.Namespace) -> Iterator[Source]:
    """The server to measure: a fresh throwaway cluster, or the one at ``--port``; a fresh database on it."""
    configure_logging(level="warning")
    install = find_install(args.major)
    cluster = None
    if args.port is None:
        cluster = TemporaryCluster(install, CLUSTER_SETTINGS, DISK).start()
    try:
        src = Source(install, cluster.port if cluster is not None else args.port, args.profile)
        with src.connect("postgres") as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                (DATABASE,),
            )
            conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {DATABASE}")
        src.execute(f"CREATE TABLE {TABLE} ({COLUMNS}); CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
        yield src
    finally:
        if cluster is not None:
            cluster.stop()


def machine() -> str:
    """One line on the machine: CPU model, cores, memory, OS, Python and pyarrow."""
    model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{model}, {os.cpu_count()} cores, {memory:.0f} GiB RAM, {platform.system()} {platform.release()},"
        f" Python {platform.python_version()}, pyarrow {pyarrow.__version__}"
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Samples the CPU time of the walsender serving a slot until stopped (the walsender ends with its client)."""

    def __init__(self, src: Source, slot: str) -> None:
        self._src, self._slot = src, slot
        self._stop = threading.Event()
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._src.connect() as conn:
            pid = None
            while pid is None and not self._stop.wait(0.02):
                row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (self._slot,))
                pid = (row.fetchone() or (None,))[0]
        while pid is not None:
            try:
                self.seconds = cpu_seconds(pid)
            except (OSError, IndexError):
                return
            if self._stop.wait(0.05):
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.seconds


class Engine:
    """The engine in a child process (``run_engine.py``); its JSON lines are read with ``expect``."""

    def __init__(self, src: Source, *args: str, profile: str | None = None) -> None:
        command = [
            sys.executable,
            os.environ.get("BENCH_ENGINE", str(BENCH_DIR / "run_engine.py")),
            "--port",
            str(src.port),
            "--database",
            DATABASE,
        ]
        command += ["--publication", PUBLICATION, *args]
        if profile is not None and src.profile is not None:
            src.profile.mkdir(parents=True, exist_ok=True)
            output = src.profile / f"{profile}.txt"
            py_spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
            command = [
                py_spy or "py-spy",
                "record",
                "--threads",
                "--format",
                "raw",
                "--rate",
                "250",
                "-o",
                str(output),
                "--",
                *command,
            ]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    def expect(self, event: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if not line.startswith("{"):  # py-spy's own messages
                print(line, end="", file=sys.stderr)
                continue
            message: dict[str, Any] = json.loads(line)
            if message["event"] == event:
                return message
        code = self.process.wait()
        raise RuntimeError(f"the engine exited ({code}) before reporting {event!r}; see its log above")

    def wait(self) -> None:
        if self.process.wait(timeout=120) != 0:
            raise RuntimeError(f"the engine exited with {self.process.returncode}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


def timed(command: list[str]) -> float:
    """Run a client command with its output to /dev/null; the wall-clock seconds it took."""
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


@dataclass
class Line:
    name: str
    rows: int
    seconds: float
    peak_rss_mb: float | None = None
    cpu_seconds: float | None = None
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def report(title: str, figure: Line, limit: Line, target: float) -> bool:
    """Print the figure beside the limit and their ratio; whether the ratio meets ``target``."""
    ratio = figure.rate / limit.rate
    print(f"\n{title}")
    print(f"  {'':<34} {'rows':>10} {'seconds':>8} {'rows/s':>10} {'CPU s':>7} {'peak RSS':>9}")
    for line in (figure, limit):
        rss = f"{line.peak_rss_mb:.0f} MB" if line.peak_rss_mb is not None else "-"
        cpu = f"{line.cpu_seconds:.1f}" if line.cpu_seconds is not None else "-"
        print(
            f"  {line.name:<34} {line.rows:>10,} {line.seconds:>8.2f} {line.rate:>10,.0f} {cpu:>7} {rss:>9}"
            + (f"  {line.note}" if line.note else "")
        )
    verdict = "meets" if ratio >= target else "BELOW"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"  ratio {ratio:.2f} ({verdict} the target >= {target}); load average now {load}")
    return ratio >= target
