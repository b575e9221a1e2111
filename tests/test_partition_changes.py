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

    def copied_rows(self) -> float:
        """Rows of the root this process copied (each copy adds its rows)."""
        assert self.pipeline is not None
        value = self.pipeline.metrics.registry.get_sample_value("etl_copied_rows_total", {"table": "public.pt"})
        return value or 0.0

    def leaves(self) -> tuple[int, ...]:
        rows = self.db.execute("SELECT inhrelid::int FROM pg_inherits WHERE inhparent = 'pt'::regclass ORDER BY 1")
        return tuple(r[0] for r in rows)

    def recorded(self) -> tuple[int, ...] | None:
        """The leaves the pipeline recorded for the root (those its copy read, and empty ones added since)."""
        assert self.pipeline is not None
        schema = self.pipeline.store.get_table_schema(int(self.db.execute("SELECT 'pt'::regclass::int")[0][0]))
        return None if schema is None else schema.partitions

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
    assert lake.copied_rows() == 600

    # A new, empty partition: its rows come through the stream, and nothing is copied again.
    db.execute("CREATE TABLE pt4 PARTITION OF pt FOR VALUES FROM (300) TO (400)")
    wait_until(lambda: lake.recorded() == lake.leaves(), "the new partition recorded", pipeline)
    db.execute("INSERT INTO pt SELECT i, 300 + i % 100, 'streamed' FROM generate_series(2000, 2049) i")
    wait_until(lake.equal, "rows of the new partition streamed", pipeline, timeout=180)
    assert lake.copied_rows() == 600, "an empty partition added copies nothing"

    # A table with rows attached, a partition detached: the root is copied again, once.
    db.execute(
        """
        CREATE TABLE pt5 (LIKE pt); INSERT INTO pt5 SELECT i, 400 + i % 100, 'pre' FROM generate_series(1, 200) i;
        ALTER TABLE pt ATTACH PARTITION pt5 FOR VALUES FROM (400) TO (500);
        ALTER TABLE pt DETACH PARTITION pt3;
        """
    )
    rows = int(db.execute("SELECT count(*) FROM pt")[0][0])
    wait_until(lake.equal, "the attached rows in, the detached ones out", pipeline, timeout=180)
    wait_until(lambda: all_ready(pipeline, 1) and lake.recorded() == lake.leaves(), "the copy's leaves", pipeline)
    assert lake.copied_rows() == 600 + rows, "copied again once"
    db.execute("INSERT INTO pt VALUES (1000, 350, 'after'); DELETE FROM pt WHERE id % 11 = 0")
    wait_until(lake.equal, "streaming goes on", pipeline, timeout=180)

    # A partition detached, changed while out of the root (none of it streamed), and attached again, all between
    # two reads of the partitions (one transaction): the same leaves, but a new attachment, so copied again.
    copied = lake.copied_rows()
    db.execute(
        """
        ALTER TABLE pt DETACH PARTITION pt2;
        UPDATE pt2 SET v = 'changed while detached' WHERE id % 3 = 0;
        DELETE FROM pt2 WHERE id % 7 = 0;
        ALTER TABLE pt ATTACH PARTITION pt2 FOR VALUES FROM (100) TO (200);
        """
    )
    wait_until(lake.equal, "the partition attached again, as it is now", pipeline, timeout=180)
    assert lake.copied_rows() > copied, "copied again"


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
