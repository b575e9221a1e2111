"""The etl plugin of etl-spark: registers the Spark-backed destinations."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from etl.api import hookimpl

if TYPE_CHECKING:
    from etl.api import DestinationFactory


@hookimpl
def etl_destinations() -> Iterable[type[DestinationFactory]]:
    from etl_spark.bigquery.destination import BigQueryDestination
    from etl_spark.ducklake.destination import DuckLakeDestination

    return [DuckLakeDestination, BigQueryDestination]
