"""Throwaway Postgres clusters for test suites: the demo's cluster, plus what tests do to a server.

Standbys, restarts with other settings, a database per test, the server's log, and freezing every process
of the server (SIGSTOP) to look like a hung host.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Self

import psycopg
import structlog
from psycopg import pq

from etl.demo_postgres import PostgresInstall, ThrowawayCluster, pid_alive

log = structlog.get_logger(__name__)


class KeptConnections:
    """Autocommit connections to one database kept open across calls, one per thread.

    A test suite makes thousands of one-statement calls (a statement of a test, a poll of the source, a database
    created and dropped per test); a connection each starts a server process, some 10 ms of CPU between server
    and client. A kept connection is replaced when the server closed it (a restart, a terminated backend: its
    socket turned readable while it was idle) or a statement left a transaction open, as a new one per call
    would never have seen it."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self._connect = connect
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[psycopg.Connection[Any]] = []

    def get(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.info.transaction_status != pq.TransactionStatus.IDLE or _readable(conn):
            if conn is not None:
                conn.close()
            conn = self._local.conn = self._connect()
            with self._lock:
                self._open = [c for c in self._open if not c.closed] + [conn]
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._open:
                conn.close()
            self._open = []


def _readable(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection has something to read: the server's end of it, mostly."""
    return bool(select.select([conn.fileno()], [], [], 0)[0])


SHM = Path("/dev/shm")
SHM_ROOM = 4 << 30


def cluster_directory() -> Path:
    """Where test clusters keep their files: ``ETL_TEST_PG_DIR`` when set, else ``/dev/shm`` when it is a
    directory with 4 GiB free, else ``/tmp``.

    Memory rather than a disk: a suite creates and drops hundreds of thousands of relation files (a database
    per test copies the template's few hundred), and under that churn a disk filesystem's inode allocation
    (ext4's) took more CPU than Postgres's own work: CREATE DATABASE 157 ms of CPU on ``/tmp`` here, 20 ms on
    ``/dev/shm``. Test clusters run with fsync off: a disk keeps nothing for them that memory does not."""
    named = os.environ.get("ETL_TEST_PG_DIR")
    if named:
        return Path(named)
    try:
        if SHM.is_dir() and os.access(SHM, os.W_OK) and shutil.disk_usage(SHM).free >= SHM_ROOM:
            return SHM
    except OSError:
        pass
    return Path("/tmp")


class TemporaryCluster(ThrowawayCluster):
    """A throwaway cluster (``start()``, ``stop()``, ``connect()``) that tests can also restart, freeze, give a
    standby and databases. Its files go under ``directory``, by default ``cluster_directory()``."""

    def __init__(
        self, install: PostgresInstall, settings: Mapping[str, str] | None = None, directory: Path | None = None
    ) -> None:
        super().__init__(install, settings, directory or cluster_directory())
        self._kept: dict[str, KeptConnections] = {}
        self._kept_lock = threading.Lock()

    def kept_connection(self, database: str = "postgres") -> psycopg.Connection[Any]:
        """The calling thread's kept autocommit connection to ``database`` (``KeptConnections``): for one-off
        statements and polls; ``connect()`` gives a connection of one's own."""
        with self._kept_lock:
            kept = self._kept.get(database)
            if kept is None:
                kept = self._kept[database] = KeptConnections(partial(self.connect, database))
        return kept.get()

    def _close_kept(self, database: str | None = None) -> None:
        with self._kept_lock:
            closing = list(self._kept.values()) if database is None else [self._kept.pop(database, None)]
            if database is None:
                self._kept.clear()
        for kept in closing:
            if kept is not None:
                kept.close()

    def stop(self) -> None:
        self._close_kept()
        super().stop()

    def start_standby(self, settings: Mapping[str, str] | None = None) -> Self:
        """A hot standby of this running cluster, started: a base backup that streams the WAL from here, with
        ``hot_standby_feedback`` on (and ``settings``). ``stop()`` it like this one."""
        primary = f"host=127.0.0.1 port={self.port} user=postgres"
        standby = type(self)(
            self.install,
            {
                **self.settings,
                "hot_standby": "on",
                "hot_standby_feedback": "on",
                "primary_conninfo": primary,
                **(settings or {}),
            },
            self.directory,
        )
        datadir = standby._make_root()
        standby._run(
            "pg_basebackup", "-D", str(datadir), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-c", "fast"
        )
        (datadir / "standby.signal").touch()
        if standby.user is not None:
            shutil.chown(datadir / "standby.signal", standby.user)
        return standby._launch()

    def restart(self, settings: Mapping[str, str] | None = None) -> None:
        """Restart, optionally with changed settings (the port stays)."""
        self.settings.update(settings or {})
        self._write_settings()
        assert self.datadir is not None and self._root is not None
        self._run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.datadir))
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.datadir), "-l", str(self._root / "server.log"))

    def create_database(self, name: str) -> None:
        self.kept_connection().execute(f'CREATE DATABASE "{name}"')

    def drop_database(self, name: str) -> None:
        """Drop a database with its replication slots and sessions."""
        self._close_kept(name)
        conn = self.kept_connection()
        for _ in range(50):
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE database = %s AND active_pid IS NOT NULL",
                (name,),
            )
            try:
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                    (name,),
                )
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.1)
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log_text(self) -> str:
        assert self._root is not None
        return (self._root / "server.log").read_text(errors="replace")

    def crash(self) -> None:
        """End the server at once, as a crash would (an immediate shutdown: no checkpoint, nothing more sent to its
        standbys), and wait until it is gone; ``stop()`` then deletes its files."""
        self._close_kept()
        postmaster = self._postmaster_pid()
        if postmaster is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGQUIT)
        deadline = time.monotonic() + 30
        while pid_alive(postmaster):
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres (pid {postmaster}) did not end after SIGQUIT")
            time.sleep(0.05)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[list[int]]:
        """Freeze the server for the duration of the block: SIGSTOP the postmaster and all its processes.

        Clients see what a hung server looks like: TCP connections are still accepted (by the kernel)
        and their sockets stay open, but nothing is ever answered. Everything is thawed (SIGCONT) when
        the block ends, however it ends; ``thaw()`` does it early. Yields the frozen PIDs, postmaster
        first. Other users of the cluster freeze too, so keep the block short and tests serial.
        """
        pids = self.freeze()
        try:
            yield pids
        finally:
            self.thaw(pids)

    def freeze(self) -> list[int]:
        """SIGSTOP the postmaster, then its processes (a stopped postmaster starts no new ones); return the PIDs.

        Prefer ``frozen()``; whoever calls this must call ``thaw()`` with the result, whatever happens.
        """
        postmaster = self._postmaster_pid()
        if postmaster is None or not pid_alive(postmaster):
            raise RuntimeError("the cluster is not running, so it cannot be frozen")
        os.kill(postmaster, signal.SIGSTOP)
        pids = [postmaster]
        try:
            for child in _children(postmaster):
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    os.kill(child, signal.SIGSTOP)
                    pids.append(child)
        except BaseException:
            self.thaw(pids)
            raise
        log.debug("postgres frozen", pids=pids)
        return pids

    def thaw(self, pids: list[int]) -> None:
        """SIGCONT the processes ``freeze()`` stopped: its own first, the postmaster last. Idempotent."""
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        log.debug("postgres thawed", pids=pids)


def _children(parent: int) -> list[int]:
    """The PIDs of ``parent``'s child processes, from /proc (Linux)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            children.append(int(entry.name))
    return children
