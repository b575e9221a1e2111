"""The destination contract (``etl.testing.destination_contract``) for the bigquery destination, against a local
BigQuery server (local-bigquery), rows read back with google-cloud-bigquery."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from etl.destination.base import Destination, DestinationContext
from etl.schema import TableSchema
from etl.store.memory import MemoryStore
from etl.testing.destination_contract import DestinationContract
from etl_spark.bigquery.destination import BigQueryConfig, BigQueryDestination
from etl_spark.bigquery.emulator import PROJECT, BigQueryEmulator, running_emulator
from etl_spark.bigquery.names import table_id
from etl_spark.session import SparkSettings


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigQueryEmulator]:
    with running_emulator(tmp_path_factory.mktemp("bigquery")) as server:
        yield server


class TestBigQueryDestination(DestinationContract):
    @pytest.fixture
    def destination(
        self, emulator: BigQueryEmulator, spark: Any, request: pytest.FixtureRequest
    ) -> Iterator[BigQueryDestination]:
        config = BigQueryConfig(
            project=PROJECT,
            dataset=f"contract_{request.node.name}",
            staging_uri="gs://staging/etl",
            staging_local_dir=str(emulator.bucket_dir("staging")),
            min_apply_interval_s=0,
            endpoint=emulator.endpoint,
            spark=SparkSettings(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"}),
        )
        destination = BigQueryDestination.from_config(config, DestinationContext(1, MemoryStore(1)))
        destination.startup()
        yield destination
        destination.shutdown()

    def read_rows(self, destination: Destination, schema: TableSchema) -> list[dict[str, Any]]:
        from google.api_core.exceptions import NotFound

        assert isinstance(destination, BigQueryDestination)
        names = ", ".join(f"`{c}`" for c in schema.column_names)
        table = f"`{destination.config.project}.{destination.config.dataset}.{table_id(schema.name)}`"
        try:
            return [dict(row.items()) for row in destination.client.query_and_wait(f"SELECT {names} FROM {table}")]
        except NotFound:
            raise KeyError(f"no table {schema.name} in BigQuery") from None
