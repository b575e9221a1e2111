"""The DDL event trigger on a real server: install, the messages it emits, their order, and parsing them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from etl.lsn import Lsn
from etl.postgres import pgoutput as pg
from etl.postgres.connection import connect
from etl.postgres.ddl import (
    FUNCTION_NAME,
    MESSAGE_PREFIX,
    MESSAGES_TABLE,
    TRIGGER_NAME,
    SchemaChange,
    ddl_trigger_installed,
    install_ddl_trigger,
    install_sql,
    parse_schema_change,
    schema_change_recorded,
    uninstall_ddl_trigger,
)
from etl.schema import ReplicaIdentity, TableName
from etl.testing.pytest_plugin import TestDatabase

DOCS = Path(__file__).resolve().parents[2] / "docs" / "schema-changes.md"


@pytest.fixture
def db(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        """
        CREATE TABLE t (id int PRIMARY KEY, a text NOT NULL DEFAULT 'x', g int GENERATED ALWAYS AS (id * 2) STORED);
        CREATE TABLE other (id int PRIMARY KEY);
        CREATE PUBLICATION pub FOR TABLE t;
        """
    )
    with pg_database.connect() as conn:
        assert install_ddl_trigger(conn)
    return pg_database


@pytest.fixture
def slot(db: TestDatabase) -> Iterator[str]:
    db.execute("SELECT pg_create_logical_replication_slot('ddl_test', 'pgoutput')")
    yield "ddl_test"


def run(db: TestDatabase, *statements: str) -> None:
    """Run statements in one session that waits for its commits to be flushed (so decoding sees them)."""
    with db.connect() as conn:
        conn.execute("SET synchronous_commit = on")
        for statement in statements:
            conn.execute(statement)


def decoded(db: TestDatabase, slot: str, publication: str = "pub") -> list[pg.Message]:
    rows = db.execute(
        "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, 'proto_version', '1',"
        " 'publication_names', %s, 'messages', 'true')",
        (slot, publication),
    )
    decoder = pg.PgOutputDecoder(1)
    return [decoder.decode(bytes(row[0])) for row in rows]


def changes(db: TestDatabase, slot: str, publication: str = "pub") -> list[SchemaChange]:
    return [
        parse_schema_change(m.content)
        for m in decoded(db, slot, publication)
        if isinstance(m, pg.LogicalMessage) and m.prefix == MESSAGE_PREFIX
    ]


def test_install_is_idempotent_and_detected(db: TestDatabase) -> None:
    with db.connect() as conn:
        assert ddl_trigger_installed(conn)
        again = install_ddl_trigger(conn)
        assert again and again.installed
        count = conn.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname = %s", (TRIGGER_NAME,)).fetchone()
        assert count == (1,)
        conn.execute(f"ALTER EVENT TRIGGER {TRIGGER_NAME} DISABLE")
        assert not ddl_trigger_installed(conn)


def test_alter_table_reports_the_full_shape(db: TestDatabase, slot: str) -> None:
    run(db, "ALTER TABLE t ADD COLUMN b numeric(10,2) DEFAULT 1.5, ALTER COLUMN a DROP NOT NULL")
    (change,) = changes(db, slot)
    table_id = db.execute("SELECT 't'::regclass::oid")[0][0]
    assert change.table_id == table_id
    assert change.name == TableName("public", "t")
    assert change.replica_identity is ReplicaIdentity.DEFAULT
    assert [(c.column.name, c.column.attnum, c.generated) for c in change.columns] == [
        ("id", 1, ""),
        ("a", 2, ""),
        ("g", 3, "s"),
        ("b", 4, ""),
    ]
    schema = change.table_schema("pub", Lsn(42))
    assert schema is not None and schema.snapshot_lsn == Lsn(42)
    # the generated column is not published (Postgres 18 publishes it only when asked to)
    assert schema.column_names == ["id", "a", "b"]
    id_, a, b = schema.columns
    assert (id_.primary_key, id_.nullable, id_.default) == (True, False, None)
    assert (a.nullable, a.default, a.type_name) == (True, "'x'::text", "text")
    assert (b.type_name, b.type_modifier, b.default, b.nullable) == ("numeric(10,2)", (10 << 16 | 2) + 4, "1.5", True)


def test_rename_keeps_the_attribute_number_and_drop_removes_the_column(db: TestDatabase, slot: str) -> None:
    run(db, "ALTER TABLE t ADD COLUMN c int", "ALTER TABLE t RENAME COLUMN a TO a2", "ALTER TABLE t DROP COLUMN c")
    added, renamed, dropped = (c.table_schema("pub", Lsn.ZERO) for c in changes(db, slot))
    assert added is not None and renamed is not None and dropped is not None
    assert [(c.name, c.attnum) for c in added.columns] == [("id", 1), ("a", 2), ("c", 4)]
    assert [(c.name, c.attnum) for c in renamed.columns] == [("id", 1), ("a2", 2), ("c", 4)]
    assert [(c.name, c.attnum) for c in dropped.columns] == [("id", 1), ("a2", 2)]


def test_nullability_defaults_identity_and_table_name(db: TestDatabase, slot: str) -> None:
    run(
        db,
        "ALTER TABLE t ALTER COLUMN a SET DEFAULT 'y'",
        "ALTER TABLE t ALTER COLUMN a DROP DEFAULT, ALTER COLUMN a DROP NOT NULL",
        "ALTER TABLE t REPLICA IDENTITY FULL",
        "ALTER TABLE t RENAME TO t2",
    )
    set_default, dropped, full, renamed = changes(db, slot)
    assert (set_default.columns[1].column.default, set_default.columns[1].column.nullable) == ("'y'::text", False)
    assert (dropped.columns[1].column.default, dropped.columns[1].column.nullable) == (None, True)
    assert full.replica_identity is ReplicaIdentity.FULL
    assert [c.column.primary_key for c in full.columns] == [True, False, False]  # the primary key stays the key
    assert renamed.name == TableName("public", "t2")


def test_message_precedes_the_rows_that_follow_it_in_the_transaction(db: TestDatabase, slot: str) -> None:
    run(
        db,
        "BEGIN",
        "INSERT INTO t (id) VALUES (1)",
        "ALTER TABLE t ADD COLUMN b int",
        "INSERT INTO t (id, b) VALUES (2, 20)",
        "SAVEPOINT s",
        "ALTER TABLE t ADD COLUMN c int",
        "RELEASE SAVEPOINT s",
        "INSERT INTO t (id, c) VALUES (3, 30)",
        "COMMIT",
    )
    kinds = [
        "M" if isinstance(m, pg.LogicalMessage) else "I"
        for m in decoded(db, slot)
        if isinstance(m, pg.LogicalMessage | pg.Insert)
    ]
    assert kinds == ["I", "M", "I", "M", "I"]


def test_no_message_for_rolled_back_or_unpublished_tables(db: TestDatabase, slot: str) -> None:
    run(db, "BEGIN", "ALTER TABLE t ADD COLUMN gone int", "ROLLBACK", "ALTER TABLE other ADD COLUMN x int")
    assert changes(db, slot) == []


def test_partition_leaves_and_column_lists(db: TestDatabase, slot: str) -> None:
    db.execute(
        """
        CREATE TABLE parted (id int, v text) PARTITION BY RANGE (id);
        CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10);
        CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (10) TO (20);
        CREATE PUBLICATION leaves FOR TABLE parted;
        CREATE PUBLICATION narrow FOR TABLE t (id, a);
        """
    )
    run(db, "ALTER TABLE parted ADD COLUMN w int", "ALTER TABLE t ADD COLUMN wide int")
    messages = changes(db, slot, "leaves")
    # published through its leaves, so each leaf reports its new shape (the parent is not published)
    assert sorted(str(c.name) for c in messages[:2]) == ["public.parted_1", "public.parted_2"]
    assert all(c.table_schema("leaves", Lsn.ZERO) is not None for c in messages[:2])
    assert [c.column.name for c in messages[0].columns] == ["id", "v", "w"]
    wide = messages[2]
    assert wide.name == TableName("public", "t")
    narrow = wide.table_schema("narrow", Lsn.ZERO)
    everything = wide.table_schema("pub", Lsn.ZERO)
    assert narrow is not None and narrow.column_names == ["id", "a"]
    assert everything is not None and everything.column_names == ["id", "a", "wide"]
    assert wide.table_schema("leaves", Lsn.ZERO) is None  # not published by that publication


@pytest.fixture
def role(db: TestDatabase) -> Iterator[str]:
    name = f"etl_ddl_user_{os.getpid()}"
    db.execute(f"CREATE ROLE {name} LOGIN")
    db.execute(f"GRANT CREATE ON SCHEMA public TO {name}")
    try:
        yield name
    finally:
        db.execute(f"DROP OWNED BY {name}")
        db.execute(f"DROP ROLE {name}")


def test_a_role_that_is_not_superuser(db: TestDatabase, role: str, slot: str) -> None:
    with db.connect() as conn:
        uninstall_ddl_trigger(conn)
    with connect(db.connection(user=role)) as user_conn:
        refused = install_ddl_trigger(user_conn)
        assert not refused and "not a superuser" in refused.reason
        with db.connect() as conn:
            assert install_ddl_trigger(conn)
        accepted = install_ddl_trigger(user_conn)
        assert accepted and "already installed" in accepted.reason
        # the function runs as the role that alters its own table
        user_conn.execute("SET synchronous_commit = on")
        user_conn.execute("CREATE TABLE public.mine (id int PRIMARY KEY)")
        db.execute("ALTER PUBLICATION pub ADD TABLE mine")
        user_conn.execute("ALTER TABLE public.mine ADD COLUMN x int NOT NULL DEFAULT 0")
    (change,) = changes(db, slot)
    assert change.name == TableName("public", "mine")
    assert [(c.column.name, c.column.default, c.column.nullable) for c in change.columns][-1] == ("x", "0", False)


def test_uninstall_removes_trigger_and_function_but_keeps_a_shared_schema(db: TestDatabase, slot: str) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE etl.keep_me (x int)")  # e.g. the Postgres store in the same schema
        uninstall_ddl_trigger(conn)
        uninstall_ddl_trigger(conn)  # idempotent
        assert not ddl_trigger_installed(conn)
        assert conn.execute("SELECT to_regproc('etl.emit_schema_change')").fetchone() == (None,)
        assert conn.execute("SELECT to_regclass('etl.keep_me')").fetchone() is not None
        conn.execute("DROP TABLE etl.keep_me")
        uninstall_ddl_trigger(conn)
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'etl'").fetchone() is None
    run(db, "ALTER TABLE t ADD COLUMN b int")
    assert changes(db, slot) == []


def test_manual_install_sql_in_the_docs_is_current(pg_database: TestDatabase) -> None:
    """The SQL the docs give administrators is exactly what the engine installs, and works on its own."""
    assert install_sql() in DOCS.read_text()
    with pg_database.connect() as conn:
        with conn.transaction():
            conn.execute(install_sql())
        assert ddl_trigger_installed(conn)


def test_the_cli_prints_the_sql_that_installs_and_removes_the_trigger(pg_database: TestDatabase) -> None:
    """`etl ddl-trigger --print-sql`, named by the warnings for roles that may not install it, needs no pipeline
    file; what it prints installs the current trigger, and `--print-uninstall-sql` removes it."""

    def printed(option: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "etl.cli", "ddl-trigger", option], capture_output=True, text=True, check=True
        )
        return result.stdout

    with pg_database.connect() as conn:
        with conn.transaction():
            conn.execute(printed("--print-sql"))
        assert ddl_trigger_installed(conn)
        with conn.transaction():
            conn.execute(printed("--print-uninstall-sql"))
        assert not ddl_trigger_installed(conn)
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'etl'").fetchone() is None


def test_a_failing_catalog_read_never_fails_the_users_ddl(db: TestDatabase, role: str, slot: str) -> None:
    """The trigger warns and emits nothing when it cannot build the message; the ALTER TABLE itself succeeds.

    The function runs as its owner: here that owner is an ordinary role that may not read a catalog view.
    """
    db.execute("REVOKE SELECT ON pg_catalog.pg_publication_tables FROM PUBLIC")
    db.execute(f"ALTER FUNCTION {FUNCTION_NAME}() OWNER TO {role}")
    notices: list[str] = []
    try:
        with connect(db.connection(user=role)) as user_conn:
            user_conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
            user_conn.execute("CREATE TABLE public.mine (id int PRIMARY KEY)")
            db.execute("ALTER PUBLICATION pub ADD TABLE mine")
            user_conn.execute("SET synchronous_commit = on")
            user_conn.execute("ALTER TABLE public.mine ADD COLUMN x int")
            cols = user_conn.execute(
                "SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.mine'::regclass AND attnum > 0"
            )
            assert cols.fetchone() == (2,)
    finally:
        db.execute(f"ALTER FUNCTION {FUNCTION_NAME}() OWNER TO postgres")
    assert any("no schema change message for table public.mine" in n for n in notices)
    assert changes(db, slot) == []


def test_the_trigger_records_its_messages_and_no_other_role_can(db: TestDatabase, role: str, slot: str) -> None:
    """Only a message the trigger emitted has its LSN in the record; an ordinary role can forge the message,
    not the record. A table's owner altering its table gets the record all the same (the function runs as
    the superuser who installed it)."""
    with connect(db.connection(user=role)) as user_conn:
        user_conn.execute("CREATE TABLE public.mine (id int PRIMARY KEY)")
        db.execute("ALTER PUBLICATION pub ADD TABLE mine")
        user_conn.execute("SET synchronous_commit = on")
        user_conn.execute("ALTER TABLE public.mine ADD COLUMN x int")
        forged = user_conn.execute("SELECT pg_logical_emit_message(true, %s, 'forged')::text", (MESSAGE_PREFIX,))
        row = forged.fetchone()
        assert row is not None
        forged_lsn = Lsn.parse(row[0])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            user_conn.execute(f"INSERT INTO {MESSAGES_TABLE} (lsn, table_oid) VALUES (%s, 0)", (str(forged_lsn),))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            user_conn.execute(f"DELETE FROM {MESSAGES_TABLE}")
    messages = [m for m in decoded(db, slot) if isinstance(m, pg.LogicalMessage) and m.prefix == MESSAGE_PREFIX]
    assert len(messages) == 2
    with connect(db.connection(user=role)) as reader:  # the pipeline's role need not be a superuser
        assert schema_change_recorded(reader, messages[0].lsn)
        assert messages[1].lsn == forged_lsn and not schema_change_recorded(reader, forged_lsn)


def test_messages_of_a_trigger_that_records_nothing_are_not_trusted(pg_database: TestDatabase) -> None:
    with pg_database.connect() as conn:
        assert not schema_change_recorded(conn, Lsn(42)), "no record table: an earlier trigger, or none"
