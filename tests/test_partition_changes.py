"""ATTACH and DETACH PARTITION under ``publish_via_partition_root``: rows move in or out of the root with
nothing in the stream, so the pipeline copies the root again, whether it ran at the time or was down.

The lake is read back with DuckDB and compared with the source row for row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.testing.pipelines import all_ready, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.ducklake.reader import open_lake
from etl_spark.testing import comparable_source_rows, lake_rows

SPARK = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}}


class Lake:
    def __init__(self, db: TestDatabase, tmp_path: Path) -> None:
        self.db = db
        self.catalog = f"sqlite:///{tmp_path}/catalog.sqlite"
        self.config = pipeline_config(
            db,
            store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
            destination={"type": "ducklake", "catalog": self.catalog, "data_path": f"{tmp_path}/data/", "spark": SPARK},
        )
        self.pipeline: Pipeline | None = None

    def start(self) -> Pipeline:
        store = build_store(self.config, "test")
        self.pipeline = Pipeline(self.config, store, build_destination(self.config, store, "test"))
        self.pipeline.start()
        return self.pipeline

    def stop(self) -> None:
        if self.pipeline is not None:
            self.pipeline.shutdown()
            self.pipeline = None

    def equal(self) -> bool:
        with self.db.connect() as conn:
            expected = comparable_source_rows(conn, "public.pt")
        con = open_lake(self.catalog)
        try:
            return lake_rows(con, "public.pt") == expected
        finally:
            con.close()


@pytest.fixture
def lake(pg_database: TestDatabase, tmp_path: Path) -> Iterator[Lake]:
    pg_database.execute(
        """
        CREATE TABLE pt (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);
        CREATE TABLE pt1 PARTITION OF pt FOR VALUES FROM (0) TO (100);
        CREATE TABLE pt2 PARTITION OF pt FOR VALUES FROM (100) TO (200);
        CREATE TABLE pt3 PARTITION OF pt FOR VALUES FROM (200) TO (300);
        INSERT INTO pt SELECT i, i % 300, 'copied' FROM generate_series(1, 600) i;
        CREATE PUBLICATION pub FOR TABLE pt WITH (publish_via_partition_root = true);
        """
    )
    lake = Lake(pg_database, tmp_path)
    try:
        yield lake
    finally:
        lake.stop()


@pytest.mark.slow
def test_attach_and_detach_while_streaming_make_the_lake_equal(lake: Lake) -> None:
    db = lake.db
    pipeline = lake.start()
    wait_until(lambda: all_ready(pipeline, 1) and lake.equal(), "the copy", pipeline, timeout=180)
    db.execute(
        """
        CREATE TABLE pt4 (LIKE pt); INSERT INTO pt4 SELECT i, 300 + i % 100, 'pre' FROM generate_series(1, 200) i;
        ALTER TABLE pt ATTACH PARTITION pt4 FOR VALUES FROM (300) TO (400);
        ALTER TABLE pt DETACH PARTITION pt3;
        UPDATE pt SET v = 'streamed' WHERE id % 7 = 0;
        """
    )
    wait_until(lake.equal, "the attached rows in, the detached ones out", pipeline, timeout=180)
    db.execute("INSERT INTO pt VALUES (1000, 350, 'after'); DELETE FROM pt WHERE id % 11 = 0")
    wait_until(lake.equal, "streaming goes on", pipeline, timeout=180)


@pytest.mark.slow
def test_attach_and_detach_while_the_pipeline_is_down_make_the_lake_equal(lake: Lake) -> None:
    db = lake.db
    pipeline = lake.start()
    wait_until(lambda: all_ready(pipeline, 1) and lake.equal(), "the copy", pipeline, timeout=180)
    lake.stop()
    db.execute(
        """
        ALTER TABLE pt DETACH PARTITION pt1;
        CREATE TABLE pt4 (LIKE pt); INSERT INTO pt4 SELECT i, 300 + i % 100, 'pre' FROM generate_series(1, 200) i;
        ALTER TABLE pt ATTACH PARTITION pt4 FOR VALUES FROM (300) TO (400);
        """
    )
    pipeline = lake.start()
    wait_until(lake.equal, "the partitions changed while down", pipeline, timeout=180)
