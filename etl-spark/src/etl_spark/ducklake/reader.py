"""Reading a lake with real DuckDB and its ``ducklake`` extension, loaded offline from the PyPI wheels.

``pip install 'etl-spark[duckdb]'`` brings ``duckdb==1.5.5`` and the ``duckdb-extension-*`` wheels of
the same version; they are installed into a private extension directory from the wheel files, so
nothing is downloaded and autoloading stays off.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import weakref
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sqlalchemy.engine import make_url

from etl.api import ConfigError, DestinationError, Lsn

if TYPE_CHECKING:
    import duckdb

# PyPI package suffix -> the name DuckDB loads it under.
_EXTENSIONS = {"ducklake": "ducklake", "sqlite": "sqlite_scanner", "postgres": "postgres_scanner", "httpfs": "httpfs"}
_INSTALL_HINT = "pip install 'etl-spark[duckdb]' (duckdb and its ducklake, sqlite and postgres extensions, 1.5.5)"

_lock = threading.Lock()
_extension_directory: str | None = None
_installed: set[str] = set()
_verified: set[str] = set()
"""Extensions this process has loaded once with their signatures checked."""


def duckdb_target(catalog_url: str) -> tuple[str, str]:
    """The ``ducklake:`` attach target for a catalog URL, and the extension its metadata database needs."""
    try:
        url = make_url(catalog_url)
    except Exception:
        raise ConfigError("the DuckLake catalog is not a valid URL", hint="see docs/destinations/ducklake.md") from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        if not url.database:
            raise ConfigError(
                "a SQLite DuckLake catalog needs a file path", hint="sqlite:////absolute/path/catalog.sqlite"
            )
        return f"ducklake:sqlite:{url.database}", "sqlite"
    if backend == "postgresql":
        parts = {
            "host": url.host,
            "port": url.port,
            "dbname": url.database,
            "user": url.username,
            "password": url.password,
            **url.query,
        }
        libpq = " ".join(f"{k}={_libpq_value(str(v))}" for k, v in parts.items() if v is not None)
        return f"ducklake:postgres:{libpq}", "postgres"
    raise ConfigError(f"DuckDB cannot open a DuckLake catalog in {backend!r}", hint="use a sqlite or postgresql URL")


def _libpq_value(value: str) -> str:
    if value and not any(c in value for c in " '\\"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def connect_duckdb(*extensions: str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with ``ducklake`` and the named extensions (``sqlite``, ``postgres``, ``httpfs``) loaded.

    DuckDB checks an extension's signature at each ``LOAD`` by hashing its file (35 MB, 70 ms each). The
    first load of each extension in the process checks it; later connections skip the check, since they
    load the same files from the process's own extension directory (``mkdtemp``: mode 0700), which
    nothing else can change in between.
    """
    try:
        import duckdb  # optional extra
    except ImportError:
        raise DestinationError("reading a DuckLake lake needs DuckDB", hint=_INSTALL_HINT) from None
    packages = ("ducklake", *extensions)
    with _lock:
        checked = _verified.issuperset(packages)
    con = duckdb.connect(
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "extension_directory": _extensions_dir(),
            "allow_unsigned_extensions": checked,
        }
    )
    try:
        for package in packages:
            with _lock:
                if package not in _installed:  # into this process's extension directory, once
                    con.execute(f"INSTALL '{_extension_file(package)}'")
                    _installed.add(package)
            con.execute(f"LOAD {_EXTENSIONS[package]}")
    except BaseException:
        con.close()
        raise
    if not checked:
        with _lock:
            _verified.update(packages)
    return con


def open_lake(catalog_url: str, alias: str = "lake", *, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """DuckDB with the lake attached as ``alias`` (read-only unless asked otherwise).

    A SQLite catalog is read from a consistent snapshot taken with Python's own SQLite (``sqlite3``,
    the library the writer uses). DuckDB reaches SQLite through a second copy of the library, and two
    copies in one process do not see each other's POSIX locks: closing the file in one drops the
    other's. DuckDB reading the live catalog while this process writes it can then fail ("attempt to
    write a readonly database") or even damage it. A write attach uses the live file: do that only
    with the pipeline stopped.
    """
    target, extension = duckdb_target(catalog_url)
    snapshot = _sqlite_snapshot(make_url(catalog_url).database or "") if extension == "sqlite" and read_only else None
    if snapshot is not None:
        target = f"ducklake:sqlite:{snapshot}"
    con = connect_duckdb(extension)
    if snapshot is not None:
        weakref.finalize(con, os.remove, snapshot)
    try:
        con.execute(f"ATTACH '{_sql_string(target)}' AS {alias}" + (" (READ_ONLY)" if read_only else ""))
    except Exception as exc:
        con.close()
        message = str(exc)
        password = make_url(catalog_url).password
        if password:
            message = message.replace(str(password), "***")
        raise DestinationError(
            f"DuckDB could not attach the lake: {message}",
            hint="check that the catalog exists and is reachable with these credentials",
        ) from None
    return con


def _sqlite_snapshot(path: str, wait: float = 60) -> str:
    """A consistent copy of a SQLite database (the backup API), in a temporary file; it waits up to ``wait``
    seconds for a writer's transaction to end."""
    if not Path(path).is_file():
        raise DestinationError(f"no DuckLake catalog at {path}", hint="check the catalog URL; the pipeline creates it")
    deadline = time.monotonic() + wait

    def give_up_at_deadline(_status: int, _remaining: int, _total: int) -> None:
        if time.monotonic() > deadline:
            raise DestinationError(
                f"the DuckLake catalog {path} stayed locked by a writer for {wait:.0f} s",
                hint="retry; if it persists, look for a process stuck in a catalog transaction",
            )

    handle, copy = tempfile.mkstemp(prefix="etl-catalog-", suffix=".sqlite")
    os.close(handle)
    try:
        source_uri = f"{Path(path).resolve().as_uri()}?mode=ro"
        with (
            closing(sqlite3.connect(source_uri, uri=True, timeout=wait)) as source,
            closing(sqlite3.connect(copy)) as to,
        ):
            source.backup(to, progress=give_up_at_deadline)
    except BaseException:
        os.remove(copy)
        raise
    return copy


def _sql_string(value: str) -> str:
    return value.replace("'", "''")


def _extensions_dir() -> str:
    """One private extension directory per process, removed at exit."""
    global _extension_directory
    with _lock:
        if _extension_directory is None:
            _extension_directory = tempfile.mkdtemp(prefix="etl-duckdb-ext-")
            atexit.register(shutil.rmtree, _extension_directory, ignore_errors=True)
        return _extension_directory


def _extension_file(package: str) -> str:
    try:
        module = importlib.import_module(f"duckdb_extension_{package}")
    except ImportError:
        raise DestinationError(f"the DuckDB {package} extension is not installed", hint=_INSTALL_HINT) from None
    found = next(Path(module.__path__[0]).rglob("*.duckdb_extension"), None)
    if found is None:
        raise DestinationError(f"the duckdb-extension-{package} package holds no extension file", hint=_INSTALL_HINT)
    return _sql_string(str(found))


SNAPSHOT_AT: Final = (
    "SELECT min(snapshot_id) FROM ducklake_snapshots(?) WHERE commit_extra_info IS NOT NULL"
    " AND json_extract(commit_extra_info, '$.pipeline_id')::BIGINT = ?"
    " AND json_extract(commit_extra_info, '$.lsn_int')::UBIGINT >= ?"
)
"""The DuckDB SQL of ``snapshot_at`` (parameters: the lake's alias, the pipeline id, the LSN as an integer)."""


LATEST_CONSISTENT: Final = (
    "SELECT max(snapshot_id) FROM ducklake_snapshots(?) WHERE commit_extra_info IS NOT NULL"
    " AND json_extract(commit_extra_info, '$.pipeline_id')::BIGINT = ?"
    " AND coalesce(json_extract(commit_extra_info, '$.consistent')::BOOLEAN, false)"
)
"""The DuckDB SQL of ``latest_consistent`` (parameters: the lake's alias, the pipeline id)."""


def latest_consistent(con: duckdb.DuckDBPyConnection, pipeline_id: int, alias: str = "lake") -> int | None:
    """The latest snapshot of the lake attached as ``alias`` that pipeline ``pipeline_id`` marked as a state the
    source had, across all its tables (``"consistent": true`` in its ``commit_extra_info``); ``None`` before the
    first (while tables are still copied or catching up)."""
    row = con.execute(LATEST_CONSISTENT, [alias, int(pipeline_id)]).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def snapshot_at(con: duckdb.DuckDBPyConnection, pipeline_id: int, lsn: Lsn, alias: str = "lake") -> int | None:
    """The first snapshot of the lake attached as ``alias`` that holds everything pipeline ``pipeline_id`` streamed
    up to ``lsn`` (it stands at ``lsn`` or past it: ``catalog.positions``); ``None`` while the lake is behind it.
    Read it with ``SELECT ... FROM lake.s.t AT (VERSION => <snapshot>)``."""
    row = con.execute(SNAPSHOT_AT, [alias, int(pipeline_id), int(lsn)]).fetchone()
    return None if row is None or row[0] is None else int(row[0])
