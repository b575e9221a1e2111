"""Suite-wide pytest hooks of this repository (not shipped: plugin authors get ``etl.testing`` only)."""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first, in their order, then the rest: pytest-xdist hands tests out in this order,
    so the longest start while every worker is free instead of running on alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
