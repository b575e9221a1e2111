"""A column's type changed to one DuckLake cannot read from the table's files (``ALTER COLUMN ... TYPE ... USING``):
with ``[copy] on_type_change = "resync"`` the pipeline copies the table again with the new type by itself, while
the other tables stream on; by default the table waits for ``etl resync``.

The lake is read back with DuckDB and compared with the source row for row.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.store.base import RetryKind, TableStateKind
from etl.testing.pipelines import all_ready, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.ducklake.reader import open_lake
from etl_spark.testing import comparable_source_rows, lake_rows

SPARK = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}}


def start(db: TestDatabase, tmp_path: Path, on_type_change: str) -> tuple[Pipeline, str]:
    catalog = f"sqlite:///{tmp_path}/catalog.sqlite"
    config = pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={"type": "ducklake", "catalog": catalog, "data_path": f"{tmp_path}/data/", "spark": SPARK},
        copy={"on_type_change": on_type_change},
    )
    store = build_store(config, "test")
    pipeline = Pipeline(config, store, build_destination(config, store, "test"))
    pipeline.start()
    return pipeline, catalog


def equal(db: TestDatabase, catalog: str, table: str) -> bool:
    with db.connect() as conn:
        expected = comparable_source_rows(conn, table)
    con = open_lake(catalog)
    try:
        return lake_rows(con, table) == expected
    finally:
        con.close()


@pytest.fixture
def db(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        """
        CREATE TABLE items (id int PRIMARY KEY, qty int);
        INSERT INTO items SELECT i, i FROM generate_series(1, 300) i;
        CREATE TABLE other (id int PRIMARY KEY, v text);
        INSERT INTO other SELECT i, 'copied' FROM generate_series(1, 50) i;
        CREATE PUBLICATION pub FOR TABLE items, other;
        """
    )
    return pg_database


ALTER = "ALTER TABLE items ALTER COLUMN qty TYPE text USING 'n' || qty::text"


@pytest.mark.parametrize("on_type_change", ["stop", "resync"])
def test_an_incompatible_type_change_waits_for_resync_or_is_copied_again(
    db: TestDatabase, tmp_path: Path, on_type_change: str
) -> None:
    pipeline, catalog = start(db, tmp_path, on_type_change)
    try:
        wait_until(lambda: all_ready(pipeline, 2), "the copies", pipeline, timeout=180)
        items = int(db.execute("SELECT 'items'::regclass::int")[0][0])
        db.execute("UPDATE items SET qty = qty + 1 WHERE id <= 10")
        wait_until(lambda: equal(db, catalog, "public.items"), "the update streamed", pipeline, timeout=120)

        db.execute(ALTER)
        db.execute("UPDATE items SET qty = qty || '!' WHERE id % 7 = 0; INSERT INTO items VALUES (1000, 'new')")
        db.execute("INSERT INTO other VALUES (1000, 'streamed')")
        wait_until(lambda: equal(db, catalog, "public.other"), "the other table streams on", pipeline, timeout=120)
        if on_type_change == "stop":
            wait_until(lambda: pipeline.store.get_table_states()[items].kind is TableStateKind.ERRORED, "errored")
            state = pipeline.store.get_table_states()[items]
            assert state.retry is RetryKind.MANUAL and "etl resync" in (state.hint or ""), state
            assert not equal(db, catalog, "public.items")
        else:
            wait_until(lambda: equal(db, catalog, "public.items"), "copied again, as text", pipeline, timeout=180)
            wait_until(lambda: all_ready(pipeline, 2), "ready again", pipeline)
            db.execute("UPDATE items SET qty = 'after' WHERE id = 1")
            wait_until(lambda: equal(db, catalog, "public.items"), "streaming goes on", pipeline, timeout=120)
    finally:
        pipeline.shutdown()
