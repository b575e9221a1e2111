"""A DuckLake catalog that is not the one the pipeline wrote (lost, moved, another database, or restored from an
older backup) stops the start: the pipeline never streams into a lake without the copied rows, or without the
changes it wrote since, while its store's progress moves on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from etl.config import PipelineConfig
from etl.errors import ConfigError, DestinationError
from etl.factory import build_destination, build_store
from etl.lsn import Lsn
from etl.pipeline import Pipeline
from etl.status import DestinationStatus, StatusReport, destination_status, status_report, text_lines
from etl.store.base import APPLY_WORKER
from etl.testing import free_port
from etl.testing.pipelines import all_ready, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.ducklake.config import DuckLakeConfig
from etl_spark.ducklake.reader import open_lake, snapshot_at
from etl_spark.testing import lake_matches

SPARK = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}}


def lake_config(db: TestDatabase, tmp_path: Path, catalog: str) -> PipelineConfig:
    """The pipeline into the DuckLake ``catalog``, its store in ``tmp_path``."""
    return pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={"type": "ducklake", "catalog": catalog, "data_path": f"{tmp_path}/data/", "spark": SPARK},
    )


def start(db: TestDatabase, tmp_path: Path, catalog: str) -> Pipeline:
    config = lake_config(db, tmp_path, catalog)
    store = build_store(config, "test")
    pipeline = Pipeline(config, store, build_destination(config, store, "test"))
    pipeline.start()
    return pipeline


def status(db: TestDatabase, tmp_path: Path, catalog: str) -> StatusReport:
    config = lake_config(db, tmp_path, catalog)
    store = build_store(config, "test")
    try:
        return status_report(config, store)
    finally:
        store.close()


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


@pytest.mark.slow
@pytest.mark.first_major
def test_a_catalog_restored_from_an_older_backup_stops_the_start(pg_database: TestDatabase, tmp_path: Path) -> None:
    """Each batch records where it brought the lake in the stream; a lake behind the store's progress (the changes
    since its backup would be skipped) stops the start, and says where each snapshot stands."""
    db = pg_database
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'copied' FROM generate_series(1, 50) g;"
        " CREATE PUBLICATION pub FOR TABLE t"
    )
    path = tmp_path / "catalog.sqlite"
    catalog = f"sqlite:///{path}"

    def equal() -> bool:
        with db.connect() as conn:
            return lake_matches(conn, catalog, "public.t")

    pipeline = start(db, tmp_path, catalog)
    try:
        wait_until(lambda: all_ready(pipeline, 1), "the copy", pipeline, timeout=180)
        db.execute("INSERT INTO t VALUES (51, 'before the backup')")
        wait_until(equal, "the row before the backup", pipeline, timeout=180)
    finally:
        pipeline.shutdown()
    shutil.copy(path, tmp_path / "backup.sqlite")
    pipeline = start(db, tmp_path, catalog)
    try:
        db.execute("INSERT INTO t VALUES (52, 'after the backup')")
        (streamed,) = db.execute("SELECT pg_current_wal_insert_lsn()::text")[0]  # past its commit
        wait_until(equal, "the row after the backup", pipeline, timeout=180)
    finally:
        pipeline.shutdown()
    latest = progress(tmp_path, db)
    assert isinstance(latest, Lsn) and latest >= Lsn.parse(streamed)

    # Where the lake stands, as DuckDB shows it: the snapshot that holds the row streamed last says so.
    con = open_lake(catalog)
    try:
        at = snapshot_at(con, 1, Lsn.parse(streamed))
        assert at is not None and snapshot_at(con, 1, Lsn(int(latest) + 1)) is None
        assert con.execute("SELECT v FROM lake.public.t AT (VERSION => ?) WHERE id = 52", [at]).fetchall() == [
            ("after the backup",)
        ]
        assert con.execute("SELECT count(*) FROM lake.public.t AT (VERSION => ?)", [at - 1]).fetchall() == [(51,)]
        ((info, message),) = con.execute(
            "SELECT commit_extra_info, commit_message FROM ducklake_snapshots('lake') WHERE snapshot_id = ?", [at]
        ).fetchall()
    finally:
        con.close()
    recorded = json.loads(info)
    assert recorded["pipeline_id"] == 1 and Lsn.parse(recorded["lsn"]) >= Lsn.parse(streamed)
    assert recorded["lsn"] in message
    report = status(db, tmp_path, catalog)  # etl status shows the same, and no problem
    assert report.destination is not None and report.destination.position is not None
    assert report.destination.position.lsn == latest and report.problems == ()
    assert report.destination.to_json()["lsn"] == str(latest)
    assert f"destination position: {latest} (DuckLake snapshot {at})" in text_lines(report)[0]

    shutil.copy(path, tmp_path / "latest.sqlite")
    shutil.copy(tmp_path / "backup.sqlite", path)
    with pytest.raises(DestinationError, match=r"behind .*, which this pipeline's store says") as error:
        start(db, tmp_path, catalog)
    assert f"behind {latest}," in error.value.message and "etl reset --recopy" in (error.value.hint or "")
    assert progress(tmp_path, db) == latest
    report = status(db, tmp_path, catalog)  # etl status says so before a start fails on it
    assert report.destination is not None and report.destination.position is not None
    assert report.destination.position.lsn < latest
    (problem,) = report.problems
    assert problem.kind == "destination_behind" and f"behind {latest}" in problem.message

    shutil.copy(tmp_path / "latest.sqlite", path)  # the latest catalog again: nothing was lost
    pipeline = start(db, tmp_path, catalog)
    try:
        db.execute("INSERT INTO t VALUES (53, 'after the restore')")
        wait_until(equal, "the row after the restore", pipeline, timeout=180)
    finally:
        pipeline.shutdown()


def test_a_relative_sqlite_catalog_is_refused() -> None:
    """A relative path is found from the working directory: started elsewhere, it would be a new, empty lake."""
    for url in ("sqlite:///var/lake/catalog.sqlite", "sqlite:///catalog.sqlite", "sqlite://"):
        with pytest.raises((ConfigError, ValueError), match="absolute file path"):
            DuckLakeConfig.model_validate({"catalog": url, "data_path": "/var/lake/data/"})
    config = DuckLakeConfig.model_validate({"catalog": "sqlite:////var/lake/catalog.sqlite", "data_path": "/d/"})
    assert config.catalog.get_secret_value() == "sqlite:////var/lake/catalog.sqlite"


def test_status_reads_the_lakes_position_without_creating_or_leaking_anything(
    pg_database: TestDatabase, tmp_path: Path
) -> None:
    """A lake not made yet has no position, and reading it creates no catalog; an unreachable one is reported as
    unknown, with its password masked, and the rest of the status stands."""

    def config(catalog: str) -> PipelineConfig:
        destination = {"type": "ducklake", "catalog": catalog, "data_path": f"{tmp_path}/data/", "spark": SPARK}
        return pipeline_config(pg_database, destination=destination)

    missing = tmp_path / "not-yet.sqlite"
    assert destination_status(config(f"sqlite:///{missing}"), "test") == DestinationStatus("ducklake", None)
    assert not missing.exists()
    unreachable = destination_status(config(f"postgresql://etl:s3cret@127.0.0.1:{free_port()}/lake"), "test")
    assert unreachable is not None and unreachable.position is None and unreachable.error is not None
    assert "cannot read the DuckLake catalog" in unreachable.error and "s3cret" not in unreachable.error
    assert unreachable.line().startswith("destination position: unknown (cannot read the DuckLake catalog")
