"""The Postgres store: pipeline state in a schema (default ``etl``) of any Postgres database.

It can live in the source database or another one. SQLAlchemy Core runs over psycopg 3; the engine
is built from a ``creator`` so the password never becomes part of a URL that could be logged. The
pipeline lock is a session advisory lock held on a connection of its own, which the server releases
when that connection ends, including when the holding process dies.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping
from typing import Any, ClassVar

import psycopg
import sqlalchemy as sa
from psycopg.conninfo import make_conninfo
from pydantic import Field

from etl.api import Check, EtlError, PipelineLockedError, PostgresConnection, StoreError, connect, validate
from etl.api.sql import SqlStore, driver_message


class PostgresStoreConfig(PostgresConnection):
    """The connection settings of the source (TLS, ``${VAR}`` secrets), plus the schema to use."""

    schema_name: str = Field(
        "etl",
        alias="schema",
        min_length=1,
        max_length=63,
        description="The schema that holds the store's tables. Created on first use when missing.",
    )
    application_name: str = Field("etl-store", description="Shown in `pg_stat_activity` for the store's connections.")


def advisory_key(*parts: object) -> int:
    """A signed 64-bit advisory lock key derived from ``parts``."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresStore(SqlStore):
    name: ClassVar[str] = "postgres"
    package: ClassVar[str] = "etl-store-postgres"
    Config: ClassVar[type[PostgresStoreConfig]] = PostgresStoreConfig

    @classmethod
    def from_config(cls, config: PostgresStoreConfig | Mapping[str, Any], pipeline_id: int) -> PostgresStore:
        if not isinstance(config, PostgresStoreConfig):
            config = validate(PostgresStoreConfig, config, "store", "store")
        return cls(config, pipeline_id)

    @classmethod
    def preflight(cls, config: PostgresStoreConfig) -> list[Check]:
        """The server takes the store's login, which may use the store's schema or create it."""
        try:
            with connect(config) as conn:
                row = conn.execute(
                    "SELECT CASE WHEN n.oid IS NULL THEN has_database_privilege(current_database(), 'CREATE')"
                    " ELSE has_schema_privilege(n.oid, 'USAGE') AND has_schema_privilege(n.oid, 'CREATE') END"
                    " FROM (SELECT 1) one LEFT JOIN pg_namespace n ON n.nspname = %s",
                    (config.schema_name,),
                ).fetchone()
        except EtlError as exc:
            return [Check("store database", False, exc.message, exc.hint)]
        where = f"{config.describe()}, schema {config.schema_name}"
        if not row or not row[0]:
            return [
                Check(
                    "store database",
                    False,
                    f"{where}: the login may not create the store's tables there",
                    f"GRANT USAGE, CREATE ON SCHEMA {config.schema_name} (or CREATE ON DATABASE, if the schema is"
                    " to be created) TO the store's user",
                )
            ]
        return [Check("store database", True, f"{where}: reachable, and the store's tables may be created")]

    def __init__(self, config: PostgresStoreConfig, pipeline_id: int) -> None:
        self.config = config
        self.schema = config.schema_name
        self._lock_conn: psycopg.Connection[Any] | None = None
        conninfo = make_conninfo("", **config.conninfo())

        def new_connection() -> psycopg.Connection[Any]:
            return psycopg.connect(conninfo)

        self._connect = new_connection
        engine = sa.create_engine("postgresql+psycopg://", creator=new_connection, pool_pre_ping=True, pool_size=2)
        super().__init__(engine, pipeline_id, schema=self.schema)

    def describe(self) -> str:
        return f"Postgres store {self.config.describe()} (schema {self.schema})"

    # -- the pipeline lock ----------------------------------------------------------------------------
    def acquire_lock(self) -> None:
        with self._writing():
            if self._lock_conn is not None:
                return
            key = advisory_key("etl-pipeline", self.schema, self.pipeline_id)
            try:
                conn = self._connect()
                conn.autocommit = True
            except psycopg.Error as exc:
                raise self._unreachable(exc) from None
            try:
                locked = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
                holder = None if locked and locked[0] else _lock_holder(conn, key)
            except psycopg.Error as exc:
                conn.close()
                raise StoreError(
                    f"{self.describe()}: taking the pipeline lock failed: {self._scrub(str(exc))}"
                ) from None
            if holder is not None:
                conn.close()
                raise PipelineLockedError(
                    f"pipeline {self.pipeline_id} is already running against the {self.describe()}"
                    f" (held by server process {holder})",
                    hint=f"another `etl run` for pipeline {self.pipeline_id} is running; stop it first",
                )
            self._lock_conn = conn
            self._reload_locked()

    def _check_lock(self) -> None:
        if self._lock_conn is None:
            return
        try:
            self._lock_conn.execute("SELECT 1")
        except psycopg.Error as exc:
            raise StoreError(
                f"{self.describe()}: lost the lock of pipeline {self.pipeline_id}: its connection ended"
                f" ({self._scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)})",
                hint="stop this pipeline and start it again: another process may have started it in the meantime",
            ) from None

    def _release(self) -> None:
        if self._lock_conn is not None:
            conn, self._lock_conn = self._lock_conn, None
            # Ending the session releases the lock too, but only once the server has processed the disconnect:
            # unlock first, so that a next holder (a restart of this pipeline) finds it free at once.
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock_all()")
            conn.close()
        super()._release()

    # -- opening ------------------------------------------------------------------------------------
    def _before_migrate(self, conn: sa.Connection) -> None:
        # Two processes opening a new store at once: the second waits here until the first committed.
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(advisory_key("etl-migrate", self.schema))))
        if not sa.inspect(conn).has_schema(self.schema):
            conn.execute(sa.schema.CreateSchema(self.schema))

    def _open_error(self, exc: sa.exc.SQLAlchemyError) -> StoreError:
        orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else None
        if isinstance(orig, psycopg.OperationalError) and orig.sqlstate is None:
            return self._unreachable(orig)
        if isinstance(orig, psycopg.errors.InsufficientPrivilege):
            return StoreError(
                f"{self.describe()}: permission denied: {self._scrub(driver_message(exc))}",
                hint=f"grant the store's user CREATE on the database, or create schema {self.schema} "
                "owned by that user beforehand",
            )
        return StoreError(f"cannot open {self.describe()}: {self._scrub(driver_message(exc))}")

    def _unreachable(self, exc: psycopg.Error) -> StoreError:
        detail = " ".join(line.strip() for line in str(exc).strip().splitlines())
        return StoreError(
            f"cannot connect to the {self.describe()}: {self._scrub(detail)}",
            hint="check the store's host, port, database, user and password (or TLS settings), "
            "and that the server is running and accepts connections from here",
        )

    def _scrub(self, text: str) -> str:
        password = self.config.password.get_secret_value() if self.config.password else ""
        return text.replace(password, "***") if password else text


def _lock_holder(conn: psycopg.Connection[Any], key: int) -> str:
    """Which server process holds the advisory lock ``key`` (as much as this role may see)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    row = conn.execute(
        """
        SELECT l.pid, a.application_name, host(a.client_addr)
        FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid::text::bigint = %s AND l.objid::text::bigint = %s
        """,
        (unsigned >> 32, unsigned & 0xFFFF_FFFF),
    ).fetchone()
    if row is None:
        return "unknown"
    pid, application, client = row
    details = ", ".join(x for x in (application and f"application {application}", client and f"from {client}") if x)
    return f"{pid} ({details})" if details else str(pid)
