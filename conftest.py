"""Suite-wide pytest hooks of this repository (not shipped: plugin authors get ``etl.testing`` only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from etl_spark.testing.bigquery_emulator import BigQueryEmulator


@pytest.fixture(scope="session")
def bigquery_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigQueryEmulator]:
    """One local BigQuery server (local-bigquery 0.4.0, loopback) per test process, for etl-spark's tests and the
    end-to-end ones alike; tests use datasets of their own."""
    from etl_spark.testing.bigquery_emulator import running_emulator

    with running_emulator(tmp_path_factory.mktemp("bigquery")) as server:
        yield server


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first, in their order, then the rest: pytest-xdist hands tests out in this order,
    so the longest start while every worker is free instead of running on alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
