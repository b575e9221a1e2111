"""Cross-package end-to-end tests: real Postgres (both majors), real pipelines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from etl_spark.bigquery.emulator import BigQueryEmulator, running_emulator


@pytest.fixture(scope="session")
def bigquery_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigQueryEmulator]:
    """One local BigQuery server (local-bigquery 0.4.0, loopback) for the session; tests use their own datasets."""
    with running_emulator(tmp_path_factory.mktemp("bigquery")) as server:
        yield server
