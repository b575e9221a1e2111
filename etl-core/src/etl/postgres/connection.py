"""Normal connections to the source Postgres, with the session settings the value parsers rely on.

The settings travel in the libpq ``options`` startup parameter (``-c key=value``), so they hold for
every kind of connection, replication connections included, without an extra round trip.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import psycopg
from psycopg.conninfo import make_conninfo

from etl.config import PostgresConnection
from etl.errors import EtlError, SourceError, TransientError

SESSION_SETTINGS: Final[Mapping[str, str]] = {
    "TimeZone": "UTC",
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
}
"""Settings pinned on every source session: text output of dates, times, floats and bytea depends on them."""

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
    settings: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """libpq parameters for ``config`` (with ``overrides``), the session settings plus ``settings`` in ``options``.

    An ``options`` override is kept and the settings are appended to it. The result holds the
    password: never log it.
    """
    params = config.conninfo(**(overrides or {}))
    pinned = startup_options({**SESSION_SETTINGS, **(settings or {})})
    params["options"] = f"{params['options']} {pinned}" if params.get("options") else pinned
    return params


def conninfo_string(config: PostgresConnection, **overrides: str) -> str:
    """A libpq connection string for ``config`` with the pinned session settings (holds the password)."""
    return make_conninfo(**conninfo_params(config, overrides))


def connect(
    config: PostgresConnection, *, autocommit: bool = True, retried: bool = False, **kwargs: Any
) -> psycopg.Connection[Any]:
    """Open a normal connection to ``config`` with the pinned session settings.

    Raises ``TransientError`` when the server is unreachable or busy (retrying may help) and
    ``SourceError`` when retrying will not help (authentication, missing database, bad TLS setup).
    ``retried``: the caller retries a ``TransientError`` by itself, so its hint may say so.
    """
    try:
        return psycopg.connect(conninfo_string(config), autocommit=autocommit, **kwargs)
    except psycopg.OperationalError as exc:
        raise connection_error(config, exc, retried=retried) from None


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
