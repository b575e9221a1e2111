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
    """Tests marked ``slow`` first, in their order, then the rest, then those marked ``alone``: pytest-xdist hands
    tests out in this order, so the longest start while every worker is free instead of running on alone at the
    end. An ``alone`` test waits for every test in flight to end, and holds the other workers meanwhile: at the
    end it waits for a few short ones, where among the rest it could wait minutes for a slow one."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item.get_closest_marker("alone") is not None))
