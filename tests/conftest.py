"""Cross-package end-to-end tests: real Postgres (both majors), real pipelines."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

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

    def major(item: pytest.Item) -> Any:
        return dict(getattr(getattr(item, "callspec", None), "params", {})).get("pg_major")

    first = min((m for m in map(major, items) if m is not None), default=None)
    drop = [i for i in items if i.get_closest_marker("first_major") and major(i) not in (None, first)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]
