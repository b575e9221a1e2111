"""Cross-package end-to-end tests: real Postgres (both majors), real pipelines."""

from __future__ import annotations

import pytest

from etl.testing.pytest_plugin import first_major_only


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``first_major`` run with the first Postgres major only: what they test lies on the
    destination's side (crash recovery of its writes, its quota use), while the engine's own crash and
    streaming tests run on every major."""
    first_major_only(config, items, lambda item, _: item.get_closest_marker("first_major") is not None)
