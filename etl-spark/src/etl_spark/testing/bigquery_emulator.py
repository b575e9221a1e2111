"""A local BigQuery server for tests: ``local-bigquery`` 0.4.0 in its own Python 3.13 virtualenv.

The emulator needs Python 3.13 and DuckDB 1.5.5 with extensions loaded from PyPI wheels (its own
pin, DuckDB 2.0, would download extensions from the internet). The venv is built once into a cache
directory (``ETL_BIGQUERY_EMULATOR_CACHE``, default ``~/.cache/etl-spark``) and reused; each server
binds to loopback on free ports and is stopped by its PID. ``gs://BUCKET/path`` in load jobs maps to
``<data_dir>/gcs/BUCKET/path``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from google.cloud import bigquery

log = structlog.get_logger(__name__)

VERSION = "0.4.0"
DUCKDB_PINS = (
    "duckdb==1.5.5",
    "duckdb-extension-ducklake==1.5.5",
    "duckdb-extension-icu==1.5.5",
    "duckdb-extension-spatial==1.5.5",
    "duckdb-extensions==1.5.5",
)
PROJECT = "local"


def find_python313() -> str:
    """A Python 3.13 interpreter: ``ETL_PYTHON313``, pyenv's 3.13.0, or ``python3.13`` on PATH."""
    for candidate in (
        os.environ.get("ETL_PYTHON313"),
        "/root/.pyenv/versions/3.13.0/bin/python3.13",
        shutil.which("python3.13"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError("local-bigquery needs Python 3.13: set ETL_PYTHON313 to its interpreter")


def emulator_venv(cache: Path | None = None) -> Path:
    """The emulator's virtualenv, built on first use (about two minutes) and cached."""
    root = cache or Path(os.environ.get("ETL_BIGQUERY_EMULATOR_CACHE", Path.home() / ".cache" / "etl-spark"))
    venv = root / f"local-bigquery-{VERSION}-duckdb-1.5.5"
    ready = venv / ".ready"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".local-bigquery.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test processes build it once
        if ready.exists():
            return venv
        if venv.exists():
            shutil.rmtree(venv)
        log.info("building the local-bigquery venv", path=str(venv))
        subprocess.run([find_python313(), "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, f"local-bigquery=={VERSION}"], check=True)
        subprocess.run([*pip, *DUCKDB_PINS], check=True)  # pip warns about local-bigquery's duckdb pin: expected
        ready.touch()
    return venv


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class BigQueryEmulator:
    """A running emulator: its REST endpoint, gRPC port and data directory."""

    endpoint: str
    grpc_port: int
    data_dir: Path
    pid: int

    def bucket_dir(self, bucket: str) -> Path:
        """The local directory the emulator serves as ``gs://bucket``."""
        path = self.data_dir / "gcs" / bucket
        path.mkdir(parents=True, exist_ok=True)
        return path

    def client(self) -> bigquery.Client:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import bigquery

        return bigquery.Client(
            project=PROJECT,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options=ClientOptions(api_endpoint=self.endpoint),
        )


@contextmanager
def running_emulator(data_dir: Path, cache: Path | None = None, timeout: float = 60.0) -> Iterator[BigQueryEmulator]:
    """Start ``local-bigquery serve`` on loopback, wait until it answers, stop it by PID afterwards."""
    venv = emulator_venv(cache)
    home = data_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "HOME": str(home)}
    # Install the wheel-shipped extensions into this HOME, so nothing is downloaded.
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import duckdb; from duckdb_extensions import import_extension; c = duckdb.connect();"
            " [import_extension(n, con=c) for n in ('icu', 'ducklake', 'spatial')]",
        ],
        check=True,
        env=env,
    )
    command = [str(venv / "bin" / "local-bigquery"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--grpc-port", str(grpc_port), "--data-dir", str(data_dir / "data")]
    logfile = open(data_dir / "emulator.log", "wb")  # noqa: SIM115 - closed after the server stops
    process = subprocess.Popen(command, env=env, stdout=logfile, stderr=subprocess.STDOUT)
    emulator = BigQueryEmulator(f"http://127.0.0.1:{port}", grpc_port, data_dir / "data", process.pid)
    try:
        _wait_ready(emulator, process, timeout, data_dir / "emulator.log")
        yield emulator
    finally:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        logfile.close()


def _wait_ready(emulator: BigQueryEmulator, process: subprocess.Popen[bytes], timeout: float, logfile: Path) -> None:
    url = f"{emulator.endpoint}/bigquery/v2/projects/{PROJECT}/datasets"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"local-bigquery exited with {process.returncode}: {logfile.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"local-bigquery did not answer within {timeout} s; log: {logfile}")


if __name__ == "__main__":  # build the cached venv ahead of a test run
    print(emulator_venv(), file=sys.stdout)
