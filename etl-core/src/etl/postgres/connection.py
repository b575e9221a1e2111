"""Normal connections to the source Postgres, with the session settings the parsers and the engine's SQL rely on.

The settings travel in the libpq ``options`` startup parameter (``-c key=value``), so they hold for
every kind of connection, replication connections included, without an extra round trip; a client's
startup options win over ``ALTER ROLE/DATABASE ... SET``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.pq.abc import PGconn

from etl.config import PostgresConnection
from etl.errors import EtlError, SourceError, TransientError

SESSION_SETTINGS: Final[Mapping[str, str]] = {
    "TimeZone": "UTC",
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
    "search_path": "pg_catalog, pg_temp",
    "standard_conforming_strings": "on",
    "row_security": "off",
}
"""Settings pinned on every source session. Text output of dates, times, floats and bytea depends on the first six.
``search_path``: an unqualified operator or function in the engine's SQL resolves in ``pg_catalog`` only, never to
one that any role with ``CREATE`` on a schema of the path planted there (it would run as the pipeline's role), as
Postgres's own apply worker and pg_dump have it. ``standard_conforming_strings``: string literals read as pglast
(and ``quote_literal``) read them. ``row_security``: a read that a row-level security policy would filter (and
whose functions would run as the pipeline's role) fails instead of copying part of a table."""

# Phrases of libpq/server errors that retrying will not fix.
_PERMANENT_FAILURES: Final = (
    "password authentication failed",
    "authentication failed",
    "no pg_hba.conf entry",
    "does not exist",
    "permission denied",
    "must be superuser or replication role",
    "must have the replication attribute",
    "no password supplied",
    "invalid ",
    "certificate",
    "sslmode",
    "server does not support ssl",
)


def startup_options(settings: Mapping[str, str]) -> str:
    """The libpq ``options`` value that sets ``settings`` at session start."""
    return " ".join(f"-c {_escape_option(key)}={_escape_option(value)}" for key, value in settings.items())


def _escape_option(text: str) -> str:
    # libpq splits ``options`` on whitespace; a backslash escapes the next character.
    return "".join("\\" + ch if ch.isspace() or ch == "\\" else ch for ch in text)


def conninfo_params(
    config: PostgresConnection,
    overrides: Mapping[str, str] | None = None,
    settings: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """libpq parameters for ``config`` (with ``overrides``), the session settings plus ``settings`` in ``options``
    (one set to ``None`` is not pinned).

    An ``options`` override is kept and the settings are appended to it. The result holds the
    password: never log it.
    """
    params = config.conninfo(**(overrides or {}))
    merged = {**SESSION_SETTINGS, **(settings or {})}
    pinned = startup_options({key: value for key, value in merged.items() if value is not None})
    params["options"] = f"{params['options']} {pinned}" if params.get("options") else pinned
    return params


def conninfo_string(
    config: PostgresConnection, settings: Mapping[str, str | None] | None = None, **overrides: str
) -> str:
    """A libpq connection string for ``config`` with the pinned session settings (holds the password)."""
    return make_conninfo(**conninfo_params(config, overrides, settings))


def connect(
    config: PostgresConnection,
    *,
    autocommit: bool = True,
    retried: bool = False,
    settings: Mapping[str, str | None] | None = None,
    **kwargs: Any,
) -> psycopg.Connection[Any]:
    """Open a normal connection to ``config`` with the pinned session settings (``settings``: as
    ``conninfo_params`` takes them).

    Raises ``TransientError`` when the server is unreachable or busy (retrying may help) and
    ``SourceError`` when retrying will not help (authentication, missing database, bad TLS setup).
    ``retried``: the caller retries a ``TransientError`` by itself, so its hint may say so.
    """
    try:
        conn = psycopg.connect(conninfo_string(config, settings), autocommit=autocommit, **kwargs)
    except psycopg.OperationalError as exc:
        raise connection_error(config, exc, retried=retried) from None
    try:
        check_pinned(conn.pgconn, config)
    except BaseException:
        conn.close()
        raise
    return conn


def check_pinned(pgconn: PGconn, config: PostgresConnection) -> None:
    """``SourceError`` unless the server reports (``ParameterStatus``, no round trip) the pinned
    ``standard_conforming_strings``: a connection pooler that drops libpq's ``options`` leaves every setting
    unpinned, and a ``--where`` predicate would be read otherwise than pglast checked it."""
    reported = pgconn.parameter_status(b"standard_conforming_strings")
    if reported != SESSION_SETTINGS["standard_conforming_strings"].encode():
        raise SourceError(
            f"the session on {config.describe()} did not take the pinned settings (standard_conforming_strings is"
            f" {(reported or b'unknown').decode()!r})",
            hint="connect directly to Postgres, or have the pooler pass the libpq 'options' startup parameter on",
        )


def connection_error(
    config: PostgresConnection, exc: BaseException, what: str = "connect to", *, retried: bool = False
) -> EtlError:
    """An error for a failed connection attempt that names the target (never the password) and a hint.

    ``retried`` says whether the caller tries again by itself (a pipeline worker) or gives up (a
    one-shot command): only then does the hint of a ``TransientError`` say that it is retried.
    """
    detail = _scrub(str(exc).strip(), config)
    lowered = detail.lower()
    target = config.describe()
    if any(phrase in lowered for phrase in _PERMANENT_FAILURES):
        if "database" in lowered and "does not exist" in lowered:
            hint = f"create the database, or fix 'database' in the source config (now {config.database!r})"
        elif "role" in lowered and "does not exist" in lowered:
            hint = f"create the role {config.user!r}, or fix 'user' in the source config"
        elif "replication" in lowered or "superuser" in lowered:
            hint = f"grant it with: ALTER ROLE {config.user} WITH REPLICATION"
        elif "pg_hba.conf" in lowered:
            hint = "allow this client in the server's pg_hba.conf (for replication connections too) and reload"
        elif "password" in lowered or "authentication" in lowered:
            hint = "check the user and password of the source config"
        else:
            hint = "check the source settings (host, port, database, user, sslmode and certificates)"
        return SourceError(f"cannot {what} Postgres at {target}: {detail}", hint=hint)
    reachable = "check that the server is running and reachable from here (host, port, firewall)"
    return TransientError(
        f"cannot {what} Postgres at {target}: {detail}",
        hint=f"{reachable}; it is retried" if retried else reachable,
    )


def _scrub(text: str, config: PostgresConnection) -> str:
    """Remove the password from a message, should a driver ever echo it."""
    if config.password is not None:
        secret = config.password.get_secret_value()
        if secret:
            text = text.replace(secret, "***")
    return text
