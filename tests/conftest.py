"""Cross-package end-to-end tests: real Postgres (both majors), real pipelines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from etl.testing.pytest_plugin import first_major_only
from etl_spark.bigquery.emulator import BigQueryEmulator, running_emulator


@pytest.fixture(scope="session")
def bigquery_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigQueryEmulator]:
    """One local BigQuery server (local-bigquery 0.4.0, loopback) for the session; tests use their own datasets."""
    with running_emulator(tmp_path_factory.mktemp("bigquery")) as server:
        yield server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``first_major`` run with the first Postgres major only: what they test lies on the
    destination's side (crash recovery of its writes, its quota use), while the engine's own crash and
    streaming tests run on every major."""
    first_major_only(config, items, lambda item, _: item.get_closest_marker("first_major") is not None)
