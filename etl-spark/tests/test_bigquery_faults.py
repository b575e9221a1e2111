"""BigQuery answering with real HTTP faults (``fault_proxy`` in front of the bigquery_emulator): what passes is retried
and the table ends equal to the reference, with no duplicate; an exceeded quota stops with its name."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from etl.destination.memory import MemoryDestination
from etl.errors import DestinationError, TransientError
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.bigquery.destination import BigQueryDestination
from etl_spark.bigquery.names import table_id
from etl_spark.testing.bigquery_emulator import BigQueryEmulator
from etl_spark.testing.fault_proxy import DROP, LOSE_ANSWER, Fault, FaultProxy

ORDERS = TableSchema(
    16700,
    TableName("public", "orders"),
    (ColumnSchema("id", 23, nullable=False, primary_key=True), ColumnSchema("note", 25)),
)


@pytest.fixture
def proxy(bigquery_emulator: BigQueryEmulator) -> Iterator[FaultProxy]:
    with FaultProxy(bigquery_emulator.endpoint).running() as running:
        yield running


@pytest.fixture
def destination(
    proxy: FaultProxy, bigquery_emulator: Any, spark: Any, kit: Any, request: pytest.FixtureRequest
) -> BigQueryDestination:
    """The destination, talking to the bigquery_emulator through ``proxy``."""
    return kit.make_bigquery(bigquery_emulator, f"d_{request.node.name}", endpoint=proxy.endpoint, api_retry_seconds=2)


def rows(destination: BigQueryDestination) -> list[tuple[Any, ...]]:
    ref = f"`{destination.config.project}.{destination.config.dataset}.{table_id(ORDERS.name)}`"
    return sorted(tuple(r.values()) for r in destination.client.query_and_wait(f"SELECT id, note FROM {ref}"))


def write(destination: BigQueryDestination, reference: MemoryDestination, batch: Any) -> int:
    """Write as the engine does: a ``TransientError`` is retried after a pause; how many were retried."""
    for attempt in range(10):
        try:
            destination.write_events(batch)
            break
        except TransientError:
            if attempt == 9:
                raise
            time.sleep(1)
    reference.write_events(batch)
    return attempt


@pytest.mark.parametrize(
    "fault", [(503, "backendError"), (429, "rateLimitExceeded"), (DROP, "")], ids=["503", "429", "dropped"]
)
@pytest.mark.parametrize("during", ["/jobs", "TRANSACTION"], ids=["load", "dml"])
def test_faults_outlasting_the_clients_retries_are_retried_by_the_engine(
    destination: BigQueryDestination, proxy: FaultProxy, kit: Any, fault: tuple[int, str], during: str
) -> None:
    status, reason = fault
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    write(destination, reference, b.commit().insert(ORDERS, {"id": 1, "note": "a"}).build())
    proxy.add(Fault(status, reason, method="POST", contains=during, until=time.monotonic() + 5))  # > 2 s of retries
    batch = b.commit().insert(ORDERS, {"id": 2, "note": "b"}).update(ORDERS, {"id": 1, "note": "c"}).build()
    assert write(destination, reference, batch) > 0  # the client gave up, the engine's retry carried on
    assert proxy.faults[0].fired
    assert rows(destination) == [(1, "c"), (2, "b")]


def test_an_answer_lost_after_the_dml_committed_is_replayed_harmlessly(
    destination: BigQueryDestination, proxy: FaultProxy, kit: Any
) -> None:
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    write(destination, reference, b.commit().insert(ORDERS, {"id": 1, "note": "a"}).build())
    lost = proxy.add(Fault(LOSE_ANSWER, method="POST", contains="TRANSACTION", until=time.monotonic() + 3))
    batch = b.commit().insert(ORDERS, {"id": 2, "note": "b"}).update(ORDERS, {"id": 1, "note": "c"}).build()
    write(destination, reference, batch)
    assert lost.fired  # the server applied the batch at least once without the client hearing of it
    assert rows(destination) == [(1, "c"), (2, "b")]
    write(destination, reference, batch)  # the engine replaying the batch after a restart: the watermark skips it
    assert rows(destination) == [(1, "c"), (2, "b")]


def test_an_exceeded_quota_stops_with_its_name(destination: BigQueryDestination, proxy: FaultProxy, kit: Any) -> None:
    b = kit.BatchBuilder()
    destination.write_events(b.commit().insert(ORDERS, {"id": 1, "note": "a"}).build())
    proxy.add(Fault(403, "quotaExceeded", method="POST", contains="/jobs", times=100))
    with pytest.raises(DestinationError, match="quotaExceeded") as raised:
        destination.write_events(b.commit().insert(ORDERS, {"id": 2, "note": "b"}).build())
    assert "min_apply_interval_s" in (raised.value.hint or "")
