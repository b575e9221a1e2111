"""Cross-package end-to-end tests: real Postgres (both majors), real pipelines."""

from __future__ import annotations

import pytest

from etl.testing.pytest_plugin import first_major_only


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``first_major`` run with the first Postgres major only: what they test lies on the
    destination's side (crash recovery of its writes, its quota use), while the engine's own crash and
    streaming tests run on every major. So do the ``local-cluster`` cases of a test parametrized by Spark
    master: the master decides where the destination's tasks run (one JVM, or executors of their own), the
    same code against the same source either way, and the ``local[2]`` cases run on every major."""
    first_major_only(
        config,
        items,
        lambda item, params: (
            item.get_closest_marker("first_major") is not None
            or str(params.get("spark", "")).startswith("local-cluster")
        ),
    )
