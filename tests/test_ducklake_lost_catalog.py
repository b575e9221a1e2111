"""A DuckLake catalog that is not the one the pipeline wrote (lost, moved, another database) stops the start:
the pipeline never streams into a lake without the copied rows while its store's progress moves on."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.errors import ConfigError, DestinationError
from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.store.base import APPLY_WORKER
from etl.testing.pipelines import all_ready, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.ducklake.config import DuckLakeConfig
from etl_spark.testing import lake_matches

SPARK = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}}


def start(db: TestDatabase, tmp_path: Path, catalog: str) -> Pipeline:
    config = pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={"type": "ducklake", "catalog": catalog, "data_path": f"{tmp_path}/data/", "spark": SPARK},
    )
    store = build_store(config, "test")
    pipeline = Pipeline(config, store, build_destination(config, store, "test"))
    pipeline.start()
    return pipeline


def progress(tmp_path: Path, db: TestDatabase) -> object:
    config = pipeline_config(db, store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")})
    store = build_store(config, "test")
    try:
        return store.get_progress(APPLY_WORKER)
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.first_major
def test_a_catalog_without_the_copied_tables_stops_the_start(pg_database: TestDatabase, tmp_path: Path) -> None:
    db = pg_database
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'copied' FROM generate_series(1, 50) g;"
        " CREATE PUBLICATION pub FOR TABLE t"
    )
    catalog = f"sqlite:///{tmp_path}/catalog.sqlite"
    pipeline = start(db, tmp_path, catalog)
    try:
        wait_until(lambda: all_ready(pipeline, 1), "the copy", pipeline, timeout=180)
    finally:
        pipeline.shutdown()
    before = progress(tmp_path, db)
    db.execute("INSERT INTO t VALUES (51, 'streamed later')")

    for other in (f"sqlite:///{tmp_path}/elsewhere/catalog.sqlite", catalog.replace("catalog.sqlite", "empty.sqlite")):
        with pytest.raises(DestinationError, match="no record of 1 of the 1 tables") as error:
            start(db, tmp_path, other)
        assert "etl reset --recopy" in (error.value.hint or "")
        assert progress(tmp_path, db) == before

    pipeline = start(db, tmp_path, catalog)  # the right catalog again: nothing was lost
    try:

        def equal() -> bool:
            with db.connect() as conn:
                return lake_matches(conn, catalog, "public.t")

        wait_until(equal, "the row streamed while another catalog was named", pipeline, timeout=180)
    finally:
        pipeline.shutdown()


def test_a_relative_sqlite_catalog_is_refused() -> None:
    """A relative path is found from the working directory: started elsewhere, it would be a new, empty lake."""
    for url in ("sqlite:///var/lake/catalog.sqlite", "sqlite:///catalog.sqlite", "sqlite://"):
        with pytest.raises((ConfigError, ValueError), match="absolute file path"):
            DuckLakeConfig.model_validate({"catalog": url, "data_path": "/var/lake/data/"})
    config = DuckLakeConfig.model_validate({"catalog": "sqlite:////var/lake/catalog.sqlite", "data_path": "/d/"})
    assert config.catalog.get_secret_value() == "sqlite:////var/lake/catalog.sqlite"
