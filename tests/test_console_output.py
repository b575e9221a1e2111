"""What ``etl run`` prints: with ``--log-format json``, one JSON event per line and nothing else, the Spark
JVM's output included (it comes through the pipeline's log as events of the ``spark`` logger)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest

from etl.errors import DestinationError
from etl.testing.pipelines import pipeline_config
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config
from etl_spark.ducklake.reader import open_lake
from etl_spark.testing import comparable_source_rows, lake_rows


@pytest.mark.first_major  # the console is the process's, whatever the source's major
def test_etl_run_into_ducklake_prints_only_json_lines(pg_database: TestDatabase, tmp_path: Path) -> None:
    db = pg_database
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'x' FROM generate_series(1, 20) g")
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    catalog = f"sqlite:///{tmp_path}/catalog.sqlite"
    config = pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={
            "type": "ducklake",
            "catalog": catalog,
            "data_path": f"{tmp_path}/lake/",
            "spark": {"master": "local[1]"},
            "driver_copy_max_bytes": 0,  # the copy is a Spark job: the JVM runs, and prints, before the lake is equal
        },
    )
    # debug: the JVM's start-up notices are logged at debug, so the log holds some of its lines for certain
    with PipelineProcess(write_config(tmp_path / "p.toml", config), log_level="debug", log_format="json") as run:
        run.start()
        db.execute("INSERT INTO t VALUES (21, 'streamed')")

        def lake() -> list[dict[str, object]]:
            con = open_lake(catalog)
            try:
                return lake_rows(con, "public.t")
            finally:
                con.close()

        def source() -> list[dict[str, object]]:
            with db.connect() as conn:
                return comparable_source_rows(conn, "public.t")

        run.wait_equal(source, lake, not_yet=(duckdb.Error, DestinationError))  # no table yet; no catalog yet
    lines = run.output().splitlines()
    not_json = []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            not_json.append(line)
    assert not not_json, "lines that are not JSON:\n" + "\n".join(not_json[:20])
    assert all(isinstance(e, dict) and "event" in e and "level" in e for e in events)
    from_jvm = [e for e in events if e.get("logger") == "spark"]
    assert any("Using incubator modules" in e["event"] for e in from_jvm), from_jvm
    assert not any("log4j" in e["event"] for e in from_jvm), "Spark's default log4j profile was used"
    warned = [e["event"] for e in events if re.search(r"\w+Warning: ", e["event"])]  # as logging.captureWarnings logs
    assert not warned, warned  # a library's warning (pyspark's about pandas 3, say) is noise to an operator
