"""Schema changes end to end: ALTER TABLE on a streaming table, with and without the DDL trigger.

Each step alters the source table, writes rows, and checks the schema the destination received
(``RelationEvent``), the version in the store and the rows written after the change.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from structlog.testing import capture_logs

from etl.destination.base import WriteResult
from etl.destination.memory import MemoryDestination
from etl.events import EventBatch, RelationEvent
from etl.pipeline import Pipeline
from etl.postgres.ddl import ddl_trigger_installed
from etl.schema import ColumnSchema, TableName, TableSchema
from etl.store.memory import MemoryStore
from etl.testing.compare import source_rows
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase

TABLE = "public.items"


class RecordingDestination(MemoryDestination):
    """The memory destination, also keeping every schema it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.relations: list[TableSchema] = []

    def write_events(self, batch: EventBatch) -> WriteResult:
        self.relations.extend(e.schema for e in batch.events() if isinstance(e, RelationEvent))
        return super().write_events(batch)


@dataclass
class Run:
    db: TestDatabase
    pipeline: Pipeline
    store: MemoryStore
    destination: RecordingDestination
    trigger: bool

    def sql(self, *statements: str) -> None:
        for statement in statements:
            self.db.execute(statement)

    def column(self, name: str) -> ColumnSchema:
        schema = self.destination.schema(TABLE)
        return next(c for c in schema.columns if c.name == name)

    def wait_for_schema(self, what: str, *names: str) -> None:
        wait_until(lambda: self.destination.schema(TABLE).column_names == list(names), what, self.pipeline)

    def wait_for_row(self, row_id: int) -> dict[str, Any]:
        wait_until(lambda: self.row(row_id) is not None, f"row {row_id}", self.pipeline)
        row = self.row(row_id)
        assert row is not None
        return row

    def row(self, row_id: int) -> dict[str, Any] | None:
        return next((r for r in self.destination.rows(TABLE) if r["id"] == row_id), None)

    def source_row(self, row_id: int) -> dict[str, Any]:
        with self.db.connect() as conn:
            return next(r for r in source_rows(conn, TABLE) if r["id"] == row_id)

    def stored(self) -> TableSchema:
        table_id = self.destination.schema(TABLE).id
        schema = self.store.get_table_schema(table_id)
        assert schema is not None
        return schema


@pytest.fixture(params=[True, False], ids=["trigger", "relation-only"])
def run(request: pytest.FixtureRequest, pg_database: TestDatabase) -> Iterator[Run]:
    trigger: bool = request.param
    pg_database.execute(
        """
        CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int);
        INSERT INTO items VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3);
        CREATE PUBLICATION pub FOR TABLE items;
        """
    )
    store = MemoryStore(pipeline_id=1)
    destination = RecordingDestination()
    config = pipeline_config(pg_database, pipeline={"install_ddl_trigger": trigger})
    pipeline = Pipeline(config, store, destination)
    pipeline.start()
    try:
        with pg_database.connect() as conn:
            assert ddl_trigger_installed(conn) is trigger
        wait_until(lambda: all_ready(pipeline, 1), "table ready", pipeline)
        yield Run(pg_database, pipeline, store, destination, trigger)
    finally:
        pipeline.shutdown()


def test_add_drop_rename_nullability_and_defaults(run: Run) -> None:
    # -- add a column with a default --------------------------------------------------------------
    run.sql("ALTER TABLE items ADD COLUMN price numeric(8,2) DEFAULT 9.99")
    if run.trigger:  # the trigger reports the change at the DDL, before any row of the table
        run.wait_for_schema("the added column, with no row written", "id", "name", "qty", "price")
    run.sql("INSERT INTO items VALUES (4, 'four', 4, 1.50)", "INSERT INTO items (id, name) VALUES (5, 'five')")
    assert run.wait_for_row(5) == run.source_row(5) == {"id": 5, "name": "five", "qty": None, "price": Decimal("9.99")}
    assert run.wait_for_row(4) == run.source_row(4)
    price = run.column("price")
    assert price.nullable is True
    assert price.type_name == ("numeric(8,2)" if run.trigger else "")  # RELATION carries no type names
    assert price.default == ("9.99" if run.trigger else None)
    assert price.attnum == (4 if run.trigger else None)
    assert run.stored().same_shape(run.destination.schema(TABLE))

    # -- drop a column ---------------------------------------------------------------------------
    run.sql("ALTER TABLE items DROP COLUMN qty", "INSERT INTO items VALUES (6, 'six', 6.00)")
    assert run.wait_for_row(6) == run.source_row(6) == {"id": 6, "name": "six", "price": Decimal("6.00")}
    assert run.destination.schema(TABLE).column_names == ["id", "name", "price"]

    # -- rename a column -------------------------------------------------------------------------
    relations = len(run.destination.relations)
    run.sql("ALTER TABLE items RENAME COLUMN name TO title", "INSERT INTO items VALUES (7, 'seven', 7.00)")
    assert run.wait_for_row(7) == run.source_row(7) == {"id": 7, "title": "seven", "price": Decimal("7.00")}
    assert run.destination.schema(TABLE).column_names == ["id", "title", "price"]
    assert len(run.destination.relations) == relations + 1  # one version: RELATION matched the trigger's
    title = run.column("title")
    # taken as the renamed column, not a new one: it keeps what is known of "name" (NOT NULL)
    assert title.nullable is False
    if run.trigger:
        assert title.attnum == 2
        # the destination matches columns by attribute number, so rows written before keep their values
        with run.db.connect() as conn:
            titles = {r["id"]: r["title"] for r in source_rows(conn, TABLE)}
        assert {r["id"]: r["title"] for r in run.destination.rows(TABLE)} == titles

    # -- SET NOT NULL / DROP NOT NULL --------------------------------------------------------------
    relations = len(run.destination.relations)
    run.sql("ALTER TABLE items ALTER COLUMN price SET NOT NULL", "INSERT INTO items VALUES (8, 'eight', 8.00)")
    assert run.wait_for_row(8) == run.source_row(8)
    if run.trigger:
        assert run.column("price").nullable is False
        assert run.stored().columns[2].nullable is False
        assert len(run.destination.relations) == relations + 1
    else:  # not on the wire: the RELATION message matches the current version, no new one
        assert run.column("price").nullable is True
        assert len(run.destination.relations) == relations
    run.sql("ALTER TABLE items ALTER COLUMN price DROP NOT NULL", "INSERT INTO items VALUES (9, 'nine', NULL)")
    assert run.wait_for_row(9) == run.source_row(9)
    assert run.column("price").nullable is True

    # -- SET DEFAULT -----------------------------------------------------------------------------
    run.sql("ALTER TABLE items ALTER COLUMN price SET DEFAULT 1.25", "INSERT INTO items (id, title) VALUES (10, 'ten')")
    assert run.wait_for_row(10) == run.source_row(10) == {"id": 10, "title": "ten", "price": Decimal("1.25")}
    assert run.column("price").default == ("1.25" if run.trigger else None)
    assert run.stored().same_shape(run.destination.schema(TABLE))


def test_rows_around_a_change_inside_one_transaction(run: Run) -> None:
    run.sql(
        """
        BEGIN;
        INSERT INTO items VALUES (20, 'before', 20);
        ALTER TABLE items ADD COLUMN note text NOT NULL DEFAULT 'n/a';
        INSERT INTO items VALUES (21, 'after', 21, 'noted');
        UPDATE items SET note = 'updated' WHERE id = 20;
        COMMIT;
        """
    )
    assert run.wait_for_row(21) == run.source_row(21)
    assert run.wait_for_row(20) == run.source_row(20) == {"id": 20, "name": "before", "qty": 20, "note": "updated"}
    note = run.column("note")
    assert (note.nullable, note.default) == ((False, "'n/a'::text") if run.trigger else (True, None))
    # exactly one new version, whichever source reported it
    assert [r.column_names for r in run.destination.relations] == [["id", "name", "qty", "note"]]


@pytest.fixture
def replication_role(pg_database: TestDatabase) -> Iterator[str]:
    """A role that may replicate and read the table, but is not a superuser."""
    name = f"etl_replicator_{os.getpid()}"
    pg_database.execute(f"CREATE ROLE {name} LOGIN REPLICATION")
    try:
        yield name
    finally:
        pg_database.execute(f"DROP OWNED BY {name}")
        pg_database.execute(f"DROP ROLE {name}")


def test_without_permission_the_pipeline_warns_and_follows_relation_messages(
    pg_database: TestDatabase, replication_role: str
) -> None:
    db = pg_database
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text); CREATE PUBLICATION pub FOR TABLE items")
    db.execute(f"GRANT SELECT ON items TO {replication_role}")
    config = pipeline_config(db)
    config = config.model_copy(update={"source": db.connection(user=replication_role)})
    destination = MemoryDestination()
    with capture_logs() as logs:
        pipeline = Pipeline(config, MemoryStore(pipeline_id=1), destination)
        pipeline.start()
    try:
        (warning,) = [e for e in logs if e["event"].startswith("DDL trigger not installed")]
        assert warning["log_level"] == "warning"
        assert "not a superuser" in warning["reason"]
        assert "nullability, defaults" in warning["lost"]
        assert "etl ddl-trigger --print-sql" in warning["hint"]
        with db.connect() as conn:
            assert not ddl_trigger_installed(conn)
        wait_until(lambda: all_ready(pipeline, 1), "table ready", pipeline)
        db.execute("ALTER TABLE items ADD COLUMN extra int")
        db.execute("INSERT INTO items VALUES (1, 'one', 11)")
        wait_until(lambda: destination.rows(TABLE) == [{"id": 1, "name": "one", "extra": 11}], "row", pipeline)
    finally:
        pipeline.shutdown()


def test_a_renamed_schema_renames_its_published_tables(pg_database: TestDatabase) -> None:
    """``ALTER SCHEMA ... RENAME TO`` moves the schema's tables to their new names in the destination: before
    Postgres 18 pgoutput sends no RELATION message for it, so the trigger reports each published table."""
    db = pg_database
    db.execute("CREATE SCHEMA sch1; CREATE TABLE sch1.t1 (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO sch1.t1 SELECT g, 'before' FROM generate_series(1, 5) g")
    db.execute("CREATE PUBLICATION pub FOR TABLE sch1.t1")
    destination = RecordingDestination()
    pipeline = Pipeline(pipeline_config(db), MemoryStore(pipeline_id=1), destination)
    pipeline.start()
    try:
        wait_until(lambda: all_ready(pipeline, 1), "table ready", pipeline)
        db.execute("INSERT INTO sch1.t1 VALUES (6, 'streamed')")  # the stream sent the table's RELATION already
        wait_until(lambda: destination_matches(db, destination, "sch1.t1"), "the streamed row", pipeline)
        db.execute("ALTER SCHEMA sch1 RENAME TO sch2")
        db.execute("INSERT INTO sch2.t1 VALUES (7, 'after'), (8, 'after')")
        wait_until(lambda: destination_matches(db, destination, "sch2.t1"), "sch2.t1 as in the source", pipeline)
        assert destination.table_names() == [TableName("sch2", "t1")]
        assert destination.relations[-1].name == TableName("sch2", "t1")
    finally:
        pipeline.shutdown()
