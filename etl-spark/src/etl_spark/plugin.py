"""The etl plugin of etl-spark: registers the Spark-backed destinations."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from etl.plugins import hookimpl


@hookimpl
def etl_destinations() -> Iterable[type[Any]]:
    from etl_spark.bigquery.destination import BigQueryDestination
    from etl_spark.ducklake.destination import DuckLakeDestination

    return [DuckLakeDestination, BigQueryDestination]
