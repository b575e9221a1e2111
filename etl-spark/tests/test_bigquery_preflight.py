"""``etl check``'s lines for BigQuery, against the local BigQuery server: the dataset as the run opens it, a
local staging directory; with ``--deep``, a Spark job and a probe Spark writes into the staging location."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from etl_spark.bigquery.config import BigQueryConfig
from etl_spark.bigquery.destination import BigQueryDestination
from etl_spark.bigquery.preflight import dataset_check
from etl_spark.testing.bigquery_emulator import PROJECT, BigQueryEmulator


def config(emulator: BigQueryEmulator, dataset: str, **options: Any) -> BigQueryConfig:
    base = {
        "project": PROJECT,
        "dataset": dataset,
        "staging_uri": "gs://staging/etl",
        "staging_local_dir": str(emulator.bucket_dir("staging")),
        "endpoint": emulator.endpoint,
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
    }
    return BigQueryConfig.model_validate(base | options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dataset_that_exists_or_that_the_run_creates_passes(bigquery_emulator: BigQueryEmulator, kit: Any) -> None:
    kit.make_bigquery(bigquery_emulator, "preflight_there")  # its start creates the dataset
    there = dataset_check(config(bigquery_emulator, "preflight_there"))
    assert there.ok and "exists" in there.detail, there
    missing = dataset_check(config(bigquery_emulator, "preflight_not_yet"))
    assert missing.ok and "does not exist yet: the run creates it" in missing.detail, missing


def test_an_unreachable_api_and_an_unusable_staging_directory_fail(
    bigquery_emulator: BigQueryEmulator, tmp_path: Path
) -> None:
    unreachable = dataset_check(config(bigquery_emulator, "d", endpoint=f"http://127.0.0.1:{free_port()}"))
    assert not unreachable.ok and "cannot reach BigQuery" in unreachable.detail, unreachable
    (tmp_path / "file").write_text("")
    checks = BigQueryDestination.preflight(config(bigquery_emulator, "d", staging_local_dir=f"{tmp_path}/file/x"))
    staging = next(c for c in checks if c.name == "bigquery staging")
    assert not staging.ok and "is a file" in staging.detail, staging


def test_deep_runs_a_spark_job_and_writes_a_probe_into_staging(
    bigquery_emulator: BigQueryEmulator, spark: Any, tmp_path: Path
) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    checks = BigQueryDestination.deep_preflight(config(bigquery_emulator, "d", staging_local_dir=str(staging)))
    assert [(c.name, c.ok) for c in checks] == [("spark", True), ("bigquery staging write", True)], checks
    assert list(staging.iterdir()) == []  # the probe was removed
    (staging / "blocked").write_text("")
    blocked = BigQueryDestination.deep_preflight(config(bigquery_emulator, "d", staging_local_dir=f"{staging}/blocked"))
    assert [(c.name, c.ok) for c in blocked] == [("spark", True), ("bigquery staging write", False)], blocked
