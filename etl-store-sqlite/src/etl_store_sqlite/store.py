"""The SQLite store: pipeline state in one SQLite file (WAL mode), through SQLAlchemy Core.

Every transaction starts with ``BEGIN IMMEDIATE`` so a writer takes the file's write lock up front
and waits up to ``busy_timeout_ms`` for another one instead of failing half-way. The file is marked
with a SQLite ``application_id``; a database that holds tables but lacks the mark belongs to another
program and is refused. The pipeline lock is an ``flock`` on ``<path>.pipeline-<id>.lock``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field

from etl.api import Check, FileLock, Integer, PipelineLockedError, StoreError, file_to_create, validate
from etl.api.sql import SqlStore, driver_message

APPLICATION_ID = 0x45544C31  # "ETL1"


class SqliteStore(SqlStore):
    name: ClassVar[str] = "sqlite"
    package: ClassVar[str] = "etl-store-sqlite"

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        path: Path = Field(
            description="The SQLite file. Created when missing; its directory must exist. A relative path is relative"
            " to the working directory."
        )
        busy_timeout_ms: Integer = Field(
            5000,
            ge=0,
            description="How long a write waits while another connection writes (for example `etl status` reading at"
            " the same time).",
        )

    @classmethod
    def from_config(cls, config: Config | Mapping[str, Any], pipeline_id: int) -> SqliteStore:
        if not isinstance(config, cls.Config):
            config = validate(cls.Config, config, "store", "store")
        return cls(config.path, pipeline_id, busy_timeout_ms=config.busy_timeout_ms)

    @classmethod
    def preflight(cls, config: Config) -> list[Check]:
        """The file exists and is writable, or its directory exists and is writable (the run creates it)."""
        return [file_to_create("store file", config.path)]

    def __init__(self, path: str | Path, pipeline_id: int, *, busy_timeout_ms: int = 5000) -> None:
        self.path = Path(path)
        self._file_lock = FileLock(Path(f"{self.path}.pipeline-{pipeline_id}.lock"))
        deadline = time.monotonic() + busy_timeout_ms / 1000
        while True:
            try:
                super().__init__(_engine(self.path, busy_timeout_ms), pipeline_id)
                return
            except StoreError as exc:
                # SQLite reports some locks at once instead of waiting out busy_timeout (where waiting could
                # deadlock); seen when etl run opened the file while etl status was opening and migrating it.
                if not _busy(exc.__cause__) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def describe(self) -> str:
        return f"SQLite store {self.path}"

    def acquire_lock(self) -> None:
        with self._writing():
            if self._file_lock.held:
                return
            if self._file_lock.try_acquire():
                self._reload_locked()
                return
            holder = self._file_lock.holder()
            raise PipelineLockedError(
                f"pipeline {self.pipeline_id} is already running against the {self.describe()}"
                + (
                    f" (process {holder} holds {self._file_lock.path})"
                    if holder
                    else f" ({self._file_lock.path} is locked)"
                ),
                hint=f"another `etl run` for pipeline {self.pipeline_id} is running; stop it first",
            )

    def _release(self) -> None:
        self._file_lock.release()
        super()._release()

    def _before_migrate(self, conn: sa.Connection) -> None:
        app_id = conn.exec_driver_sql("PRAGMA application_id").scalar()
        if app_id == APPLICATION_ID:
            return
        tables = conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar()
        if app_id or tables:
            raise StoreError(
                f"{self.path} is a SQLite database of another program, not an etl store",
                hint="set the store's path to a new file (etl creates it) or to a file etl created",
            )
        conn.exec_driver_sql(f"PRAGMA application_id = {APPLICATION_ID}")

    def _open_error(self, exc: sa.exc.SQLAlchemyError) -> StoreError:
        message = driver_message(exc)
        if "not a database" in message or "malformed" in message:
            return StoreError(
                f"{self.path} is not a SQLite database or is corrupt ({message})",
                hint="set the store's path to the file etl created, or move this file away to start a new store",
            )
        if "unable to open" in message:
            return StoreError(
                f"cannot open the SQLite store file {self.path} ({message})",
                hint="check that its directory exists and that this user may write there",
            )
        return super()._open_error(exc)


def _engine(path: Path, busy_timeout_ms: int) -> sa.Engine:
    engine = sa.create_engine(sa.URL.create("sqlite+pysqlite", database=str(path)))

    @sa.event.listens_for(engine, "connect")
    def _configure(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" event below issues BEGIN
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                raise sqlite3.OperationalError(f"cannot switch {path} to WAL mode (journal mode is {mode})")
            cursor.execute("PRAGMA synchronous = FULL")
        finally:
            cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _busy(error: BaseException | None) -> bool:
    """Whether a failed open was SQLite finding the file locked (``SQLITE_BUSY``, or an extended code of it)."""
    code = getattr(getattr(error, "orig", None), "sqlite_errorcode", None)  # absent on errors raised by hand
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY
