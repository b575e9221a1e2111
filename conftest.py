"""Suite-wide pytest hooks of this repository (not shipped: plugin authors get ``etl.testing`` only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
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
    """The order pytest-xdist hands tests out in: those marked ``slow`` first, so the longest start while every
    worker is free instead of running on alone at the end; then the rest, each file's tests spread evenly among
    the others'; those marked ``alone`` last.

    Spread: a file's tests are of one kind, and in file order the workers ran a dozen end-to-end fault tests at
    once, each waiting on timers and child processes, the cores two-thirds idle for a minute, then a file of
    Spark tests at once, all CPU. The majors mix too: the destination-side tests run on the first major only.
    ``alone`` last: such a test waits for every test in flight to end and holds the other workers meanwhile; at
    the end it waits for a few short ones, among the rest it could wait minutes for a slow one."""
    files: dict[Path, list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("slow") is None:
            files.setdefault(item.path, []).append(item)
    spread = {id(item): i / len(tests) for tests in files.values() for i, item in enumerate(tests)}

    def order(item: pytest.Item) -> tuple[int, float]:
        if item.get_closest_marker("slow") is not None:
            return (0, 0.0)
        return (2 if item.get_closest_marker("alone") is not None else 1, spread[id(item)])

    items.sort(key=order)
