"""Catalog URLs: the SQLAlchemy engine for one, and the URL (or a driver message) with its password masked."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url

from etl.api import ConfigError

_URL_HINT = "use sqlite:////absolute/path/catalog.sqlite or postgresql://user:password@host:port/database"


def redacted(url: str) -> str:
    """A catalog URL fit for messages: the password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable catalog URL>"


def masked(message: str, url: str) -> str:
    """A driver message with the URL's password, should it appear, masked."""
    try:
        password = make_url(url).password
    except Exception:
        return message
    return message.replace(str(password), "***") if password else message


_WRITE: Final = "etl_write"


@contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction that will write (committed at the end, rolled back on error)."""
    with engine.connect().execution_options(**{_WRITE: True}) as conn, conn.begin():
        yield conn


def engine_for(url: str, connect_timeout: int | None = None) -> Engine:
    """An engine for a ``sqlite:///`` or ``postgresql://`` URL (psycopg 3 driver); ``connect_timeout`` seconds at
    most to connect to a Postgres catalog (libpq's default otherwise: none).

    SQLite transactions of ``writing`` begin with ``BEGIN IMMEDIATE``: a writer takes the write lock before it
    reads the latest snapshot, so two writers serialize instead of failing on upgrade. Reads begin a deferred
    transaction and never take the write lock, so they do not queue for it (without WAL a commit still waits
    for the reads under way to end).
    """
    try:
        parsed = make_url(url)
    except Exception:
        raise ConfigError("the DuckLake catalog is not a valid URL", hint=_URL_HINT) from None
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        timeout = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
        engine = sa.create_engine(parsed.set(drivername="postgresql+psycopg"), pool_pre_ping=True, connect_args=timeout)
    elif backend == "sqlite":
        if not (parsed.database or "").startswith("/"):
            # A relative file would be found from the working directory: started from another one, a pipeline
            # would write into a new, empty lake while its store's progress moved on.
            raise ConfigError(
                f"the SQLite DuckLake catalog needs an absolute file path, not {parsed.database or 'none'!r}",
                hint=f"sqlite:////absolute/path/catalog.sqlite (four slashes: sqlite:/// and the path's own /),"
                f" for example sqlite:///{Path(parsed.database or 'catalog.sqlite').absolute()}",
            )
        engine = sa.create_engine(parsed, connect_args={"timeout": 60})

        @sa.event.listens_for(engine, "connect")
        def _no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _write_lock(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE" if connection.get_execution_options().get(_WRITE) else "BEGIN")

    else:
        raise ConfigError(f"the DuckLake catalog must live in SQLite or Postgres, not {backend!r}", hint=_URL_HINT)
    return engine


def one_of(conn: Connection, expression: str, parameter: str, values: Sequence[int]) -> tuple[str, Any]:
    """A condition that the SQL ``expression`` is one of the integers ``values``, bound as the one parameter
    ``parameter`` (a JSON array in SQLite, an array in Postgres), and that parameter's value. One parameter, not
    one per value: SQLAlchemy's expanding ``IN`` renders a name per value, which costs more than the query for
    thousands."""
    ints = [int(v) for v in values]
    if conn.dialect.name == "postgresql":
        return f"{expression} = ANY(CAST(:{parameter} AS bigint[]))", ints
    return f"{expression} IN (SELECT value FROM json_each(:{parameter}))", json.dumps(ints)
