"""A source where other roles plant things for the pipeline (issue 47): operators and functions in ``public`` that
would run as the pipeline's role, row-level security policies, ``standard_conforming_strings = off``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from etl.checks import run_checks
from etl.config import PipelineConfig
from etl.destination.memory import MemoryDestination
from etl.key_chunk import KeyChunk
from etl.pipeline import Pipeline, request_resync
from etl.postgres.copy import plan_chunk
from etl.schema import TableName
from etl.status import status_report
from etl.store.base import TableStateKind
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, table_states, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_store_sqlite.store import SqliteStore

ROWS = 3000

TRAPS = {
    # operator: (left, right, returns, what it computes); pg_catalog has no exact match for these types
    "=": ("oid", "regclass", "bool", "$1 OPERATOR(pg_catalog.=) $2::oid"),  # every take-on's
    "%": ("bigint", "integer", "int8", "$1 OPERATOR(pg_catalog.%) $2"),  # a chunk's split over connections
    "*": ("bigint", "numeric", "numeric", "$1 OPERATOR(pg_catalog.*) $2"),  # a planned chunk's size estimate
}
SHADOWS = {
    # function(arguments): the type an engine query passes outmatches pg_catalog's
    "format(text, name, name)": "pg_catalog.format($1, $2, $3)",  # etl check
    "starts_with(name, text)": "pg_catalog.starts_with($1::text, $2)",  # etl status
}


def mallory(db: TestDatabase) -> str:
    """The hostile role of ``db``'s test: roles are the cluster's, and tests on other databases run at once."""
    return f"mallory_{db.name}"


def trap(name: str, returns: str, body: str, role: str) -> str:
    """A function body that, run by a superuser, makes mallory (``role``) one, and leaves a row in her table."""
    return (
        f"RETURNS {returns} LANGUAGE plpgsql AS $$BEGIN INSERT INTO public.sprung VALUES ('{name}', current_user);"
        f" EXECUTE 'ALTER ROLE {role} SUPERUSER'; RETURN {body}; END$$"
    )


@pytest.fixture
def planted(pg_database: TestDatabase) -> TestDatabase:
    """Two tables (one copied in chunks, one by snapshot) on a database where any role may create in ``public``
    (the default before Postgres 15) and literals are read with backslash escapes; mallory, who may only log in, has
    planted operators and functions there."""
    db = pg_database
    db.execute(
        f"""
        ALTER DATABASE {db.name} SET standard_conforming_strings = off;
        GRANT CREATE ON SCHEMA public TO PUBLIC;
        CREATE ROLE {mallory(db)} LOGIN;
        CREATE TABLE big (id bigint PRIMARY KEY, v text);
        INSERT INTO big SELECT g, 'row ' || g FROM generate_series(1, {ROWS}) g;
        CREATE TABLE pairs (a int, b int, PRIMARY KEY (a, b));
        INSERT INTO pairs SELECT g, g FROM generate_series(1, 50) g;
        CREATE PUBLICATION pub FOR TABLE big, pairs;
        ANALYZE big;
        """
    )
    with db.cluster.connect(db.name) as conn:
        conn.execute(f"SET ROLE {mallory(db)}")
        conn.execute("CREATE TABLE public.sprung (trap text, by_role name)")
        conn.execute("GRANT INSERT ON public.sprung TO PUBLIC")
        for op, (left, right, returns, body) in TRAPS.items():
            name = f"public.trap_{ord(op)}"
            conn.execute(f"CREATE FUNCTION {name}({left}, {right}) {trap(op, returns, body, mallory(db))}")
            conn.execute(f"CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {name})")
        for signature, body in SHADOWS.items():
            returns = "bool" if signature.startswith("starts_with") else "text"
            conn.execute(f"CREATE FUNCTION public.{signature} {trap(signature, returns, body, mallory(db))}")
    return db


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "state.sqlite"


@pytest.fixture
def pipeline(planted: TestDatabase, store_path: Path) -> Iterator[Pipeline]:
    config = pipeline_config(planted, copy={"method": "incremental", "chunk_rows": 2000, "connections": 2})
    p = Pipeline(config, SqliteStore(store_path, pipeline_id=1), MemoryDestination())
    p.start()
    yield p
    p.shutdown()


def test_what_a_login_role_plants_in_public_never_runs_as_the_pipeline(
    planted: TestDatabase, pipeline: Pipeline, store_path: Path
) -> None:
    """Take-on, chunked and snapshot copies, a chunk planned for a destination's workers, ``etl check``, ``etl status``
    and a backfill all run with ``search_path = pg_catalog, pg_temp`` and qualified operators: mallory stays who she
    is, her table empty.
    The backfill's predicate is read as the one literal pglast lexes, though the database reads backslash escapes
    (``standard_conforming_strings = off``): it picks rows 1-10 only, not every row."""
    db, p = planted, pipeline
    destination = p.destination
    assert isinstance(destination, MemoryDestination)
    wait_until(lambda: all_ready(p, 2), "both tables copied", p, timeout=120)
    wait_until(lambda: destination_matches(db, destination, "public.big", "public.pairs"), "copied", p)
    assert not [c for c in run_checks(p.config) if c.failed]
    store = SqliteStore(store_path, pipeline_id=1)
    try:
        bait = f"bait_{db.name}"  # a slot not the pipeline's: status calls starts_with() on its name
        db.execute("SELECT pg_create_physical_replication_slot(%s)", (bait,))
        try:
            assert {t.name for t in status_report(p.config, store).tables} == {"public.big", "public.pairs"}
        finally:
            db.execute("SELECT pg_drop_replication_slot(%s)", (bait,))
        schema = destination.schema("public.big")
        # A chunk planned for a destination's workers (DuckLake's) estimates its bytes: bigint * numeric.
        with plan_chunk(p.config.source, schema, None, KeyChunk(("id",), None, 2000), parts=2) as planned:
            assert planned[2].rows == 2000 and planned[3].size_bytes
        tampered = pa.table({"id": pa.array([5, 500], pa.int64()), "v": ["tampered", "tampered"]})
        destination.write_table_rows(schema, tampered)
        hostile = "id <= 10 OR v = '\\'' ) OR (true --'"
        request_resync(p.config, store, TableName("public", "big"), hostile)
    finally:
        store.close()
    wait_until(lambda: value(destination, 5) == "row 5", "the backfill mends row 5", p)
    wait_until(lambda: all_ready(p, 2), "the backfill done", p)
    assert value(destination, 500) == "tampered", "the predicate picked rows past 10"
    db.execute("INSERT INTO big VALUES (0, 'streamed')")
    db.execute("UPDATE big SET v = 'row 500' WHERE id = 500")
    wait_until(lambda: destination_matches(db, destination, "public.big", "public.pairs"), "the stream", p)

    assert db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [mallory(db)]) == [(False,)]
    assert db.execute("SELECT * FROM public.sprung") == []


def value(destination: MemoryDestination, key: int) -> str:
    (v,) = [row["v"] for row in destination.rows("public.big") if row["id"] == key]
    return str(v)


@pytest.fixture
def policed(pg_database: TestDatabase) -> TestDatabase:
    """A table whose owner enabled row-level security, with a tenant policy that calls a function of the owner's
    (``app.leak()``, SECURITY INVOKER: it runs as the reading role, and refuses any but the owner); a plain table; a
    pipeline role ``etl_reader`` with REPLICATION and SELECT, neither a superuser nor BYPASSRLS."""
    db = pg_database
    db.execute(
        """
        CREATE ROLE etl_reader LOGIN REPLICATION;
        CREATE ROLE tenant_owner;
        CREATE SCHEMA app AUTHORIZATION tenant_owner;
        GRANT USAGE ON SCHEMA app TO etl_reader;
        CREATE TABLE app.tenants (id int PRIMARY KEY, tenant text);
        INSERT INTO app.tenants SELECT g, 'tenant ' || g % 3 FROM generate_series(1, 300) g;
        ALTER TABLE app.tenants OWNER TO tenant_owner;
        CREATE TABLE plain (id int PRIMARY KEY, v text);
        INSERT INTO plain VALUES (1, 'plain');
        GRANT SELECT ON app.tenants, plain TO etl_reader;
        CREATE PUBLICATION pub FOR TABLE app.tenants, plain;
        SET ROLE tenant_owner;
        CREATE FUNCTION app.leak() RETURNS bool LANGUAGE plpgsql SECURITY INVOKER AS
          $$BEGIN IF current_user <> 'tenant_owner' THEN RAISE 'app.leak() ran as %', current_user; END IF;
            RETURN true; END$$;
        ALTER TABLE app.tenants ENABLE ROW LEVEL SECURITY;
        CREATE POLICY tenant ON app.tenants USING (app.leak() AND tenant = current_setting('app.tenant', true));
        RESET ROLE;
        """
    )
    return db


def reader_config(db: TestDatabase) -> PipelineConfig:
    config = pipeline_config(db, pipeline={"install_ddl_trigger": False})
    return config.model_copy(update={"source": db.connection(user="etl_reader")})


def test_a_table_behind_row_level_security_errors_until_the_role_bypasses_it(
    policed: TestDatabase, store_path: Path
) -> None:
    """The stream has every row and a copy through policies would have some (0 of 300 here): with
    ``row_security = off`` the copy fails instead, before any policy's function runs, and the table errors with
    what to do while the other streams on; ``etl check`` says so beforehand. Given BYPASSRLS, a resync copies every
    row."""
    db = policed
    config = reader_config(db)
    (rls,) = [c for c in run_checks(config) if c.name == "row-level security"]
    assert rls.failed and "app.tenants" in rls.detail and "BYPASSRLS" in (rls.fix or "")
    tenants = int(db.execute("SELECT 'app.tenants'::regclass::oid")[0][0])
    destination = MemoryDestination()
    p = Pipeline(config, SqliteStore(store_path, pipeline_id=1), destination)
    p.start()
    try:
        wait_until(lambda: table_states(p).get(tenants) is TableStateKind.ERRORED, "app.tenants errored", p)
        assert p.states is not None
        state = p.states.get(tenants)
        assert state is not None and state.reason is not None and state.hint is not None
        assert "row-level security" in state.reason and "leak" not in state.reason, state.reason
        assert "BYPASSRLS" in state.hint
        db.execute("INSERT INTO plain VALUES (2, 'streams on')")
        wait_until(lambda: destination_matches(db, destination, "public.plain"), "the other table streams on", p)

        db.execute("ALTER ROLE etl_reader BYPASSRLS")
        assert not [c for c in run_checks(config) if c.failed]
        db.execute("INSERT INTO app.tenants VALUES (301, 'while errored')")
        p.resync(tenants)
        wait_until(lambda: all_ready(p, 2), "app.tenants copied", p)
        wait_until(lambda: destination_matches(db, destination, "app.tenants", "public.plain"), "every row", p)
        assert len(destination.rows("app.tenants")) == 301
    finally:
        p.shutdown()
