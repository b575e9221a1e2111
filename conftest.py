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
    """The order pytest-xdist hands tests out in: the tests marked ``slow`` spread over the first two thirds of
    the others, then the rest, the tests marked ``alone`` last. A slow test is mostly CPU (JVMs, copies,
    restarts) and the others mostly wait (on timers, servers, child processes), so side by side they keep both
    cores busy, where the slow tests first and the others after left the cores idle two fifths of the second
    half (docs/testing.md, step 28). Every slow test still starts long before the end, and an ``alone`` test,
    which waits until no other test runs, does not hold the workers idle while a slow one ends."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    alone = [item for item in items if item.get_closest_marker("alone") and item not in slow]
    others = [item for item in items if item not in slow and item not in alone]
    step = len(others) * 2 // (3 * len(slow)) if slow else 0
    ordered = []
    for n, test in enumerate(slow):
        ordered += [test, *others[n * step : (n + 1) * step]]
    items[:] = [*ordered, *others[len(slow) * step :], *alone]
