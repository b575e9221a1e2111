"""The destination contract (``etl.testing.destination_contract``) for the ducklake destination, on both
catalogs, read back by DuckDB (``preview``)."""

from __future__ import annotations

from typing import Any

import pytest

from etl.testing.destination_contract import DestinationContract
from etl_spark.ducklake.destination import DuckLakeDestination


class TestDuckLakeDestination(DestinationContract):
    @pytest.fixture
    def destination(self, lake: Any, kit: Any) -> DuckLakeDestination:
        return kit.make_destination(lake)  # shut down after the test by conftest
