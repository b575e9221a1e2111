"""A backfill's ``--where`` predicate runs as the pipeline's role: what it may call (issue 47)."""

from __future__ import annotations

import pytest

from etl.errors import ConfigError
from etl.postgres.connection import connect
from etl.postgres.predicate import predicate_rows
from etl.schema import TableName
from etl.testing.pytest_plugin import TestDatabase

T = TableName("public", "t")


@pytest.fixture
def db(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        """
        CREATE TABLE t (id int PRIMARY KEY, v text);
        CREATE SCHEMA app;
        CREATE FUNCTION app.region(int) RETURNS text STABLE LANGUAGE sql AS $$SELECT 'eu'$$;
        CREATE FUNCTION app.act(int) RETURNS bool LANGUAGE sql AS $$SELECT true$$;
        CREATE FUNCTION app.act(int, int) RETURNS bool LANGUAGE sql AS $$SELECT true$$;
        CREATE OPERATOR app.=== (LEFTARG = int, RIGHTARG = int, FUNCTION = app.act);
        """
    )
    return pg_database


def test_immutable_and_stable_calls_are_taken_and_volatile_ones_refused_before_they_run(db: TestDatabase) -> None:
    """Volatile functions may act (end sessions, reload the config, reach other servers), and would as the
    pipeline's role: refused by name, every overload of it looked at, before the source plans the read."""
    taken = [
        "id > 0 AND v LIKE 'a%' AND now() > '2020-01-01'",
        "lower(v) = 'x' OR pg_catalog.date_trunc('day', now()) < now()",
        "app.region(id) = 'eu'",  # another schema's stable function, by its qualified name
        "id IN (SELECT length(v) FROM public.t)",
    ]
    refused = {
        "id > random() * 10": "function pg_catalog.random",
        "pg_terminate_backend(pg_backend_pid())": "function pg_catalog.pg_terminate_backend",
        "id IN (SELECT pg_catalog.pg_reload_conf()::int)": "function pg_catalog.pg_reload_conf",
        "app.act(id)": "function app.act",
        "id OPERATOR(app.===) 1": 'operator app."==="',
    }
    with connect(db.connection()) as conn:
        for where in taken:
            assert predicate_rows(conn, T, where) >= 0, where
        for where, named in refused.items():
            with pytest.raises(ConfigError) as info:
                predicate_rows(conn, T, where)
            assert named in info.value.message and "volatile" in info.value.message, where
            assert info.value.hint is not None and "stable" in info.value.hint


def test_an_unqualified_function_of_another_schema_is_not_found(db: TestDatabase) -> None:
    """The pinned search_path: names resolve in pg_catalog only, whatever the database's path says."""
    db.execute(f"ALTER DATABASE {db.name} SET search_path = app, public")
    with connect(db.connection()) as conn, pytest.raises(ConfigError, match="region"):
        predicate_rows(conn, T, "region(id) = 'eu'")
