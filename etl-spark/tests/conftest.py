"""Fixtures for etl-spark: one Spark session per test session, lakes on SQLite and Postgres catalogs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest

from etl.destination.base import DestinationContext
from etl.destination.memory import sort_rows
from etl.schema import TableSchema
from etl.store.memory import MemoryStore
from etl.testing.batches import BatchBuilder, commit_time, rows_table
from etl.testing.pytest_plugin import first_major_only
from etl_spark.bigquery.config import BigQueryConfig
from etl_spark.bigquery.destination import BigQueryDestination
from etl_spark.ducklake.config import SPARK_CONF, DuckLakeConfig
from etl_spark.ducklake.destination import DuckLakeDestination
from etl_spark.ducklake.reader import connect_duckdb
from etl_spark.session import SparkSettings, get_spark, stop_spark
from etl_spark.testing.bigquery_emulator import PROJECT, BigQueryEmulator


@dataclass
class Lake:
    """Where a test lake lives, and a real DuckDB (ducklake extension from PyPI, loaded offline) to read it."""

    url: str
    data_path: str
    duckdb_target: str

    def duckdb(self) -> duckdb.DuckDBPyConnection:
        con = self.duckdb_bare()
        con.execute(f"ATTACH 'ducklake:{self.duckdb_target}' AS lake")
        return con

    def duckdb_bare(self) -> duckdb.DuckDBPyConnection:
        """DuckDB with the ducklake, sqlite and postgres extensions loaded, nothing attached."""
        return connect_duckdb("sqlite", "postgres")

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        con = self.duckdb()
        try:
            return con.execute(sql, params or []).fetchall()
        finally:
            con.close()

    def rows(self, schema: TableSchema, version: int | None = None) -> list[dict[str, Any]]:
        """The lake table of ``schema`` as DuckDB reads it (at snapshot ``version``, or the latest), sorted."""
        at = f" AT (VERSION => {version})" if version is not None else ""
        names = schema.column_names
        quoted = ", ".join(f'"{n}"' for n in names)
        rows = self.query(f"SELECT {quoted} FROM lake.{schema.name.quoted()}{at}")
        return sort_rows(dict(zip(names, r, strict=True)) for r in rows)

    def snapshot(self) -> int:
        """The lake's latest snapshot."""
        return int(self.query("SELECT max(snapshot_id) FROM lake.snapshots()")[0][0])


SPARK = SparkSettings(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"})


@pytest.fixture(scope="session")
def _spark_session() -> Iterator[None]:
    yield
    stop_spark()


@pytest.fixture
def spark(_spark_session: None) -> Any:
    """The running Spark session, started when none runs: a test module of tests/ may have stopped the
    session to start one with another master (one session per process)."""
    return get_spark(SPARK, SPARK_CONF)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A SQLite-catalog case does not depend on the Postgres major: run it with the first major only."""
    first_major_only(config, items, lambda _, params: params.get("lake") == "sqlite")


@pytest.fixture(params=["sqlite", "postgres"])
def lake(request: pytest.FixtureRequest, tmp_path: Path, spark: Any, pg_major: int) -> Iterator[Lake]:
    """A lake location: catalog URL (SQLite file or a fresh Postgres database) and a data directory."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/catalog.sqlite"
        duckdb_target = f"sqlite:{tmp_path}/catalog.sqlite"
    else:
        db = request.getfixturevalue("pg_database")
        conn = db.connection()
        url = f"postgresql://{conn.user}@{conn.host}:{conn.port}/{conn.database}"
        duckdb_target = f"postgres:host={conn.host} port={conn.port} dbname={conn.database} user={conn.user}"
    yield Lake(url, str(tmp_path / "data") + "/", duckdb_target)


_STARTED: list[DuckLakeDestination | BigQueryDestination] = []


def make_destination(lake: Lake, pipeline_id: int = 1, **options: Any) -> DuckLakeDestination:
    """A started destination; the end of the test shuts it down (its upkeep thread, planners, catalog).

    Its copies are Spark jobs, as those of tables over ``driver_copy_max_bytes`` are: the tests' tables are small,
    and the tests of the driver's copy of small tables set the option."""
    base = {"catalog": lake.url, "data_path": lake.data_path, "spark": SPARK.model_dump(), "driver_copy_max_bytes": 0}
    config = DuckLakeConfig.model_validate({**base, **options})
    destination = DuckLakeDestination.from_config(config, DestinationContext(pipeline_id, MemoryStore(pipeline_id)))
    destination.startup()
    _STARTED.append(destination)
    return destination


def make_bigquery(emulator: BigQueryEmulator, dataset: str, **options: Any) -> BigQueryDestination:
    """A started bigquery destination on ``emulator`` writing into ``dataset`` (no pause between writes); the end
    of the test shuts it down. ``options`` are further config keys, or replace these."""
    base = {
        "project": PROJECT,
        "dataset": re.sub(r"\W", "_", dataset),
        "staging_uri": "gs://staging/etl",
        "staging_local_dir": str(emulator.bucket_dir("staging")),
        "min_apply_interval_s": 0,
        "endpoint": emulator.endpoint,
        "spark": SPARK.model_dump(),
    }
    config = BigQueryConfig.model_validate({**base, **options})
    destination = BigQueryDestination.from_config(config, DestinationContext(1, MemoryStore(1)))
    destination.startup()
    _STARTED.append(destination)
    return destination


@pytest.fixture(autouse=True)
def _shut_destinations_down() -> Iterator[None]:
    yield
    while _STARTED:
        _STARTED.pop().shutdown()


class Kit:
    """The helpers above, for test modules (conftest cannot be imported under --import-mode=importlib)."""

    BatchBuilder = BatchBuilder
    commit_time = staticmethod(commit_time)
    rows_table = staticmethod(rows_table)
    make_destination = staticmethod(make_destination)
    make_bigquery = staticmethod(make_bigquery)


@pytest.fixture
def kit() -> type[Kit]:
    return Kit
