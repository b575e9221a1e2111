"""The destination contract (``etl.testing.destination_contract``) for the bigquery destination, against a local
BigQuery server (local-bigquery), rows read back with google-cloud-bigquery."""

from __future__ import annotations

from typing import Any

import pytest

from etl.destination.base import Destination
from etl.schema import TableSchema
from etl.testing.destination_contract import DestinationContract
from etl_spark.bigquery.destination import BigQueryDestination
from etl_spark.bigquery.names import table_id


class TestBigQueryDestination(DestinationContract):
    @pytest.fixture
    def destination(
        self, bigquery_emulator: Any, spark: Any, kit: Any, request: pytest.FixtureRequest
    ) -> BigQueryDestination:
        return kit.make_bigquery(
            bigquery_emulator, f"contract_{request.node.name}"
        )  # shut down after the test by conftest

    def read_rows(self, destination: Destination, schema: TableSchema) -> list[dict[str, Any]]:
        from google.api_core.exceptions import NotFound

        assert isinstance(destination, BigQueryDestination)
        names = ", ".join(f"`{c}`" for c in schema.column_names)
        table = f"`{destination.config.project}.{destination.config.dataset}.{table_id(schema.name)}`"
        try:
            return [dict(row.items()) for row in destination.client.query_and_wait(f"SELECT {names} FROM {table}")]
        except NotFound:
            raise KeyError(f"no table {schema.name} in BigQuery") from None
