"""The Postgres store: the durable store contract on real Postgres, migrations, errors, the advisory lock."""

from __future__ import annotations

import socket
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from etl.config import PostgresConnection, load_config
from etl.errors import PipelineLockedError, StoreError
from etl.factory import build_store
from etl.lsn import Lsn
from etl.plugins import load_registry
from etl.store.base import APPLY_WORKER, TableState, TableStateKind
from etl.store.migrations import MIGRATIONS, Migration
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.store_contract import ConcurrentStoreContract
from etl_store_postgres import PostgresStore, PostgresStoreConfig


def store_options(connection: PostgresConnection, **extra: Any) -> dict[str, Any]:
    """Store config keys for a test database (JSON-serialisable, password included when set)."""
    options = connection.model_dump(exclude={"password", "application_name"}, exclude_none=True)
    if connection.password is not None:
        options["password"] = connection.password.get_secret_value()
    return {**options, **extra}


def open_store(db: TestDatabase, pipeline_id: int = 1, **extra: Any) -> PostgresStore:
    return PostgresStore.from_config(store_options(db.connection(), **extra), pipeline_id)


class TestPostgresStoreContract(ConcurrentStoreContract):
    store_class = PostgresStore

    @pytest.fixture
    def store_config(self, pg_database: TestDatabase) -> dict[str, Any]:
        return store_options(pg_database.connection())


def test_registered_as_the_postgres_store() -> None:
    assert load_registry().store("postgres") is PostgresStore


def test_config_takes_the_source_connection_keys_and_a_schema() -> None:
    config = PostgresStoreConfig.model_validate(
        {"host": "db.internal", "port": 6432, "database": "state", "user": "etl", "password": "pw",
         "sslmode": "verify-full", "sslrootcert": "/ca.pem", "schema": "etl_state"}
    )  # fmt: skip
    assert (config.host, config.port, config.schema_name, config.sslmode) == (
        "db.internal",
        6432,
        "etl_state",
        "verify-full",
    )
    assert PostgresStoreConfig.model_validate({}).schema_name == "etl"
    assert "pw" not in repr(config)


def test_tables_live_in_the_configured_schema(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE public.orders (id int primary key)")  # the store may share a source database
    open_store(pg_database).close()
    open_store(pg_database, schema="Pipeline State").close()
    tables = pg_database.execute(
        "SELECT table_schema, table_name FROM information_schema.tables"
        " WHERE table_schema IN ('etl', 'Pipeline State', 'public') ORDER BY 1, 2"
    )
    expected = [
        "etl_copy_progress",
        "etl_destination_tables",
        "etl_progress",
        "etl_resync_requests",
        "etl_store_version",
        "etl_table_activity",
        "etl_table_schemas",
        "etl_table_states",
    ]
    assert tables == [
        *(("Pipeline State", t) for t in expected),
        *(("etl", t) for t in expected),
        ("public", "orders"),
    ]


def test_lsns_are_stored_as_hex_text(pg_database: TestDatabase) -> None:
    store = open_store(pg_database)
    store.upsert_progress(APPLY_WORKER, Lsn(2**63))
    store.close()
    assert pg_database.execute('SELECT lsn, lsn COLLATE "C" = lsn FROM etl.etl_progress') == [
        ("8000000000000000", True)
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: nothing listens there


def test_unreachable_database_is_a_clear_error_without_the_password() -> None:
    port = _free_port()
    config = {"host": "127.0.0.1", "port": port, "database": "statedb", "password": "s3cret-pw", "connect_timeout": 2}
    with pytest.raises(StoreError) as caught:
        PostgresStore.from_config(config, 1)
    message = str(caught.value)
    assert f"cannot connect to the Postgres store postgres@127.0.0.1:{port}/statedb" in message
    assert caught.value.hint and "host, port, database" in caught.value.hint
    assert "s3cret-pw" not in message and "s3cret-pw" not in repr(caught.value)
    assert caught.value.__cause__ is None or "s3cret-pw" not in str(caught.value.__cause__)


def test_missing_database_is_a_clear_error(pg_database: TestDatabase) -> None:
    options = store_options(pg_database.connection(), database="no_such_db")
    with pytest.raises(StoreError, match=r"cannot connect to the Postgres store .*/no_such_db.*does not exist"):
        PostgresStore.from_config(options, 1)


def test_missing_privileges_are_a_clear_error(pg_database: TestDatabase) -> None:
    role = f"etl_limited_{uuid.uuid4().hex[:8]}"
    pg_database.execute(f"CREATE ROLE {role} LOGIN")
    try:
        with pytest.raises(StoreError, match="permission denied") as caught:
            open_store(pg_database, user=role)
        assert caught.value.hint and "grant the store's user CREATE" in caught.value.hint
    finally:
        pg_database.execute(f"DROP ROLE {role}")


def _add_column(conn: sa.Connection, schema: str | None) -> None:
    conn.execute(sa.text(f'ALTER TABLE "{schema}".etl_progress ADD COLUMN updated_at timestamptz'))


class FuturePostgresStore(PostgresStore):
    """The store as a later release with one more migration would be."""

    migrations = (*MIGRATIONS, Migration(MIGRATIONS[-1].version + 1, "progress timestamps", _add_column))


def test_migrations_upgrade_and_an_older_release_refuses_a_newer_schema(pg_database: TestDatabase) -> None:
    store = open_store(pg_database)
    store.upsert_progress(APPLY_WORKER, Lsn(42))
    store.close()
    upgraded = FuturePostgresStore.from_config(store_options(pg_database.connection()), 1)
    assert upgraded.get_progress(APPLY_WORKER) == 42
    upgraded.close()
    versions = pg_database.execute("SELECT version FROM etl.etl_store_version ORDER BY 1")
    assert versions == [(m.version,) for m in FuturePostgresStore.migrations]

    with pytest.raises(StoreError, match="was written by a newer etl-store-postgres") as caught:
        open_store(pg_database)
    assert caught.value.hint == "upgrade the package: pip install --upgrade etl-store-postgres"


def test_tables_etl_did_not_write_are_refused(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE SCHEMA etl")
    pg_database.execute("CREATE TABLE etl.etl_progress (name text)")
    with pytest.raises(StoreError, match=r"has tables named like etl's \(etl_progress\)"):
        open_store(pg_database)
    assert pg_database.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'etl'") == [(1,)]


def test_two_processes_creating_a_store_at_once(pg_database: TestDatabase) -> None:
    barrier = threading.Barrier(3)
    results: list[object] = []

    def open_one(pipeline_id: int) -> None:
        barrier.wait()
        try:
            store = open_store(pg_database, pipeline_id)
            store.close()
            results.append("ok")
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=open_one, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["ok"] * 3
    versions = pg_database.execute("SELECT version FROM etl.etl_store_version ORDER BY 1")
    assert versions == [(m.version,) for m in MIGRATIONS], "each migration ran once"


def _advisory_lock_holders(db: TestDatabase) -> list[int]:
    rows = db.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1")
    return [pid for (pid,) in rows]


def test_lock_message_names_the_holding_server_process(pg_database: TestDatabase) -> None:
    holder, other = open_store(pg_database, 5), open_store(pg_database, 5)
    holder.acquire_lock()
    [pid] = _advisory_lock_holders(pg_database)
    with pytest.raises(
        PipelineLockedError, match=rf"pipeline 5 .* \(held by server process {pid} \(application etl-store"
    ):
        other.acquire_lock()
    holder.close()
    other.close()
    assert _advisory_lock_holders(pg_database) == []


def test_lock_is_per_schema(pg_database: TestDatabase) -> None:
    first, second = open_store(pg_database, 1), open_store(pg_database, 1, schema="etl_other")
    first.acquire_lock()
    second.acquire_lock()  # another schema is another store
    first.close()
    second.close()


def test_losing_the_lock_connection_stops_writes(pg_database: TestDatabase) -> None:
    store = open_store(pg_database)
    store.acquire_lock()
    store.update_table_states({1: TableState.init()})
    [pid] = _advisory_lock_holders(pg_database)
    pg_database.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(StoreError, match="lost the lock of pipeline 1"):
        store.update_table_states({1: TableState(TableStateKind.DATA_SYNC)})
    assert store.get_table_state(1) == TableState.init()
    store.close()


def test_store_survives_its_connections_being_dropped(pg_database: TestDatabase) -> None:
    store = open_store(pg_database)
    store.upsert_progress(APPLY_WORKER, Lsn(1))
    pg_database.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'etl-store'"
    )
    assert store.upsert_progress(APPLY_WORKER, Lsn(2)) == 2
    store.close()


def test_connections_run_as_the_configured_application(pg_database: TestDatabase) -> None:
    store = open_store(pg_database, application_name="billing-etl-state")
    store.acquire_lock()
    with pg_database.connect() as conn:
        names = conn.execute(
            "SELECT DISTINCT application_name FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
    assert ("billing-etl-state",) in names
    store.close()


def test_chosen_by_the_pipeline_file_with_secrets_from_the_environment(
    pg_database: TestDatabase, tmp_path: Path
) -> None:
    conn = pg_database.connection()
    pipeline_file = tmp_path / "pipeline.toml"
    pipeline_file.write_text(
        f"""
[pipeline]
id = 4
publication = "pub"

[source]
database = "app"

[store]
type = "postgres"
host = "{conn.host}"
port = {conn.port}
database = "{conn.database}"
user = "${{STORE_USER}}"
password = "${{STORE_PASSWORD}}"
sslmode = "disable"
schema = "etl_state"
"""
    )
    config = load_config(pipeline_file, environ={"STORE_USER": conn.user, "STORE_PASSWORD": "env-secret"})
    store = build_store(config, str(pipeline_file))
    assert isinstance(store, PostgresStore) and store.pipeline_id == 4
    assert "env-secret" not in repr(store) and "env-secret" not in store.describe()
    store.upsert_progress(APPLY_WORKER, Lsn(9))
    store.close()
    assert pg_database.execute("SELECT pipeline_id, worker FROM etl_state.etl_progress") == [(4, APPLY_WORKER)]


def test_preflight_connects_and_finds_the_schema_usable(pg_database: TestDatabase) -> None:
    config = PostgresStoreConfig.model_validate(store_options(pg_database.connection()))
    (check,) = PostgresStore.preflight(config)
    assert check.ok, check.detail
    assert pg_database.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'etl'") == []  # nothing created


def test_preflight_fails_for_a_login_that_may_not_create_the_store(pg_database: TestDatabase) -> None:
    role = f"etl_limited_{uuid.uuid4().hex[:8]}"
    pg_database.execute(f"CREATE ROLE {role} LOGIN")
    try:
        config = PostgresStoreConfig.model_validate(store_options(pg_database.connection(), user=role))
        (check,) = PostgresStore.preflight(config)
    finally:
        pg_database.execute(f"DROP ROLE {role}")
    assert not check.ok
    assert "may not create the store's tables" in check.detail
    assert check.fix and "GRANT USAGE, CREATE ON SCHEMA etl" in check.fix


def test_preflight_fails_for_an_unreachable_server(pg_database: TestDatabase) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    config = PostgresStoreConfig.model_validate(store_options(pg_database.connection(), port=port))
    (check,) = PostgresStore.preflight(config)
    assert not check.ok
    assert f"127.0.0.1:{port}" in check.detail
