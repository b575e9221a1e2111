"""Normal source connections: pinned session settings and clear, secret-free connection errors."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from etl.errors import SourceError, TransientError
from etl.postgres.connection import SESSION_SETTINGS, connect, conninfo_string, startup_options
from etl.postgres.copy_session import CopySession
from etl.postgres.replication import ReplicationConnection
from etl.testing import free_port
from etl.testing.pytest_plugin import TestDatabase

SECRET = "s3cret-Passw0rd-xyz"


def test_connect_pins_session_settings(pg_database: TestDatabase) -> None:
    with connect(pg_database.connection()) as conn:
        assert conn.autocommit
        # the text forms the codecs rely on
        row = conn.execute("SELECT '2024-01-02 03:04:05+02'::timestamptz::text, '\\x01ff'::bytea::text").fetchone()
        assert row == ("2024-01-02 01:04:05+00", "\\x01ff")


def test_every_kind_of_source_session_pins_the_settings_over_the_databases_own(pg_database: TestDatabase) -> None:
    """Normal, replication and copy sessions (the Spark executors' too: ``read_ranges``) all take the pinned
    settings, over what ``ALTER DATABASE ... SET`` gives: with ``public`` first in the path, an operator any role
    planted there would run as the pipeline's role (issue 47)."""
    pg_database.execute(
        f"ALTER DATABASE {pg_database.name} SET search_path = public, pg_catalog;"
        f" ALTER DATABASE {pg_database.name} SET standard_conforming_strings = off;"
        f" ALTER DATABASE {pg_database.name} SET row_security = on"
    )
    keys = list(SESSION_SETTINGS)
    settings = ", ".join(f"current_setting('{key}')" for key in keys)
    config = pg_database.connection()
    with connect(config) as conn:
        normal = conn.execute(f"SELECT {settings}").fetchone()
    with ReplicationConnection.connect(config) as rconn:
        replication = rconn.execute(f"SELECT {settings}")[0]
    with CopySession(config, None) as session:
        copy = tuple(session.scalar(f"SELECT concat_ws('|', {settings})", "read the settings").split("|"))
    for kind, shown in [("normal", normal), ("replication", replication), ("copy", copy)]:
        assert shown is not None
        pinned = {k: v.split(",")[0] if k == "DateStyle" else v for k, v in zip(keys, shown, strict=True)}
        assert pinned == SESSION_SETTINGS, kind  # DateStyle shows "ISO, MDY"
    assert SESSION_SETTINGS["search_path"] == "pg_catalog, pg_temp"
    assert SESSION_SETTINGS["standard_conforming_strings"] == "on"
    assert SESSION_SETTINGS["row_security"] == "off"


def test_connect_passes_kwargs(pg_database: TestDatabase) -> None:
    with connect(pg_database.connection(), autocommit=False) as conn:
        assert not conn.autocommit


def test_conninfo_string_keeps_overrides_and_settings(pg_database: TestDatabase) -> None:
    config = pg_database.connection()
    text = conninfo_string(config, application_name="copy-7", options="-c work_mem=8MB")
    assert "application_name=copy-7" in text
    assert "work_mem=8MB" in text and "TimeZone=UTC" in text
    import psycopg

    with psycopg.connect(text) as conn:
        assert conn.execute("SHOW work_mem").fetchone() == ("8MB",)
        assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
        assert conn.execute("SHOW application_name").fetchone() == ("copy-7",)


def test_startup_options_escape_whitespace() -> None:
    assert startup_options({"search_path": "a, b"}) == "-c search_path=a,\\ b"


def test_unreachable_server_is_transient_and_hides_password() -> None:
    from etl.config import PostgresConnection

    config = PostgresConnection.model_validate(
        {"port": free_port(), "password": SECRET, "sslmode": "disable", "connect_timeout": 2}
    )
    with pytest.raises(TransientError) as info:
        connect(config)
    text = str(info.value) + repr(info.value) + str(info.value.hint)
    assert SECRET not in text
    assert config.describe() in text
    assert info.value.hint


def test_missing_database_is_a_source_error_with_hint(pg_database: TestDatabase) -> None:
    config = pg_database.connection().model_copy(update={"database": "no_such_db", "password": SecretStr(SECRET)})
    with pytest.raises(SourceError) as info:
        connect(config)
    text = str(info.value) + repr(info.value)
    assert SECRET not in text
    assert "no_such_db" in text and f":{config.port}/" in text
    assert info.value.hint is not None and "database" in info.value.hint


def test_missing_role_is_a_source_error_with_hint(pg_database: TestDatabase) -> None:
    config = pg_database.connection(user="nobody_here")
    with pytest.raises(SourceError) as info:
        connect(config)
    assert "nobody_here" in str(info.value)
    assert info.value.hint is not None and "role" in info.value.hint
