"""``BatchWriter``: which destination failures it retries, and tables that fail together.

The destination is the memory destination with failures injected in front of its writes (a stand-in for a
destination that fails, named as such below); the store is the memory store.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etl.config import PipelineSection
from etl.destination.base import WriteResult
from etl.destination.memory import MemoryDestination
from etl.errors import (
    ConfigError,
    DestinationError,
    SourceError,
    TableError,
    TableErrors,
    TransientError,
    TypeChangeError,
    may_pass,
    naming_table,
)
from etl.events import EventBatch
from etl.replication.retries import TableRetries
from etl.replication.writer import BatchWriter
from etl.schema import ColumnSchema, TableName, TableSchema
from etl.store.base import APPLY_WORKER, RetryKind
from etl.store.memory import MemoryStore
from etl.testing.batches import BatchBuilder

SCHEMAS = {
    name: TableSchema(oid, TableName("public", name), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("v", 25)))
    for oid, name in ((101, "a"), (102, "b"), (103, "c"))
}


class FailingDestination(MemoryDestination):
    """Stand-in for a failing destination: the memory destination, raising each of ``failures`` in turn before
    its writes, then writing."""

    def __init__(self, failures: list[Exception]) -> None:
        super().__init__()
        self.failures = failures
        self.calls: list[set[int]] = []
        self.ready: list[bool] = []

    def write_events(self, batch: EventBatch) -> WriteResult:
        self.calls.append(set(batch.changes))
        self.ready.append(batch.all_tables_ready)
        if self.failures:
            raise self.failures.pop(0)
        return super().write_events(batch)


def one_row_each() -> EventBatch:
    builder = BatchBuilder()
    for schema in SCHEMAS.values():
        builder.relation(schema).insert(schema, {"id": 1, "v": schema.name.name})
    return builder.commit().build()


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    store = MemoryStore(pipeline_id=1)
    yield store
    store.close()


def write(destination: FailingDestination, store: MemoryStore) -> tuple[BatchWriter, dict[int, TableError]]:
    errored: dict[int, TableError] = {}
    writer = BatchWriter(destination, store, APPLY_WORKER, errored.__setitem__)
    destination.startup()
    writer.submit(one_row_each())
    return writer, errored


def test_a_destination_error_no_retry_mends_fails_the_write_at_once(store: MemoryStore) -> None:
    refused = DestinationError("permission denied", hint="grant it", transient=False)
    destination = FailingDestination([refused])
    writer, _ = write(destination, store)
    with pytest.raises(DestinationError, match="permission denied"):
        writer.wait()
    writer.close()
    assert len(destination.calls) == 1  # not eight retries with backoff first
    assert store.get_progress(APPLY_WORKER) is None


def test_a_destination_error_that_may_pass_is_retried(store: MemoryStore) -> None:
    destination = FailingDestination([DestinationError("busy"), DestinationError("busy again")])
    writer, _ = write(destination, store)
    writer.wait()
    writer.close()
    assert len(destination.calls) == 3
    assert [r["v"] for r in destination.rows("public.a")] == ["a"]
    assert store.get_progress(APPLY_WORKER) is not None


def test_tables_that_fail_together_are_errored_in_one_go(store: MemoryStore) -> None:
    failures = [TableError("bad a", table_id=101), TableError("bad b", table_id=102)]
    destination = FailingDestination([TableErrors(failures)])
    errored: dict[int, TableError] = {}
    writer = BatchWriter(destination, store, APPLY_WORKER, errored.__setitem__)
    destination.startup()
    writer.submit(replace(one_row_each(), all_tables_ready=True))
    writer.wait()
    writer.close()
    assert {t: e.message for t, e in errored.items()} == {101: "bad a", 102: "bad b"}
    assert destination.calls == [{101, 102, 103}, {103}]  # one more write, with the table that did not fail
    assert destination.ready == [True, False]  # without the failed tables, no longer every table's state
    assert [r["v"] for r in destination.rows("public.c")] == ["c"]


class NoKernelDestination(FailingDestination):
    """Stand-in for a destination whose per-table work meets a pyarrow kernel missing for table 102's types."""

    def write_events(self, batch: EventBatch) -> WriteResult:
        if 102 in batch.changes:
            self.calls.append(set(batch.changes))
            with naming_table(102):
                pc.equal(pa.array([[1]]), pa.array([[1]]))  # no kernel compares lists
        return super().write_events(batch)


def test_a_kernel_pyarrow_lacks_for_a_tables_types_errors_that_table_alone(store: MemoryStore) -> None:
    destination = NoKernelDestination([])
    writer, errored = write(destination, store)
    writer.wait()
    writer.close()
    assert list(errored) == [102] and "no kernel" in errored[102].message
    assert destination.calls == [{101, 102, 103}, {101, 103}]
    assert [r["v"] for r in destination.rows("public.c")] == ["c"]


def test_an_errored_table_waits_for_the_user_when_its_destination_error_cannot_pass() -> None:
    retries = TableRetries(PipelineSection(id=1, publication="p"))
    refused = retries.errored(101, DestinationError("denied", transient=False), "etl resync --table public.a")
    assert refused.retry is RetryKind.MANUAL
    assert retries.errored(101, DestinationError("unreachable"), "etl resync").retry is RetryKind.TIMED


def test_a_type_change_waits_for_the_user_unless_the_config_asks_for_a_copy() -> None:
    change = TypeChangeError("a: column v changed type", hint="copy the table again: etl resync", table_id=101)
    stopped = TableRetries(PipelineSection(id=1, publication="p")).errored(101, change, "etl resync")
    assert (stopped.retry, stopped.hint) == (RetryKind.MANUAL, "copy the table again: etl resync")

    retries = TableRetries(
        PipelineSection(id=1, publication="p", table_error_retry_max_attempts=1), resync_on_type_change=True
    )
    for _ in range(3):  # each change is copied again at once, however many: none counts as a failed attempt
        before = datetime.now(UTC)
        state = retries.errored(101, change, "etl resync")
        assert state.retry is RetryKind.TIMED and state.retry_at is not None and state.retry_at <= datetime.now(UTC)
        assert state.retry_at >= before and "on_type_change" in (state.hint or "")


@pytest.mark.parametrize(
    ("error", "passes"),
    [
        (TransientError("connection lost"), True),
        (TransientError("lost, but the raiser knows it stays", transient=False), False),
        (DestinationError("busy"), True),
        (DestinationError("denied", transient=False), False),
        (TableError("bad value", table_id=101), False),
        (TableError("this table's write timed out", table_id=101, transient=True), True),
        (SourceError("no publication"), False),
        (SourceError("the server is short of memory", transient=True), True),
        (ConfigError("bad key"), False),
        (OSError("disk full"), True),
        (RuntimeError("a library's own error"), True),
    ],
)
def test_every_error_says_whether_it_may_pass_in_one_attribute(error: Exception, passes: bool) -> None:
    """``may_pass`` reads ``transient`` of any error of ours, whatever its class, and the table retries and the
    writer act on it alike: a timed retry and write retries when it may pass, the user's turn at once otherwise."""
    assert may_pass(error) is passes
    retries = TableRetries(PipelineSection(id=1, publication="p"))
    assert retries.errored(101, error, "etl resync").retry is (RetryKind.TIMED if passes else RetryKind.MANUAL)
    if isinstance(error, TransientError | DestinationError | OSError):  # what the writer retries, when it may pass
        destination = FailingDestination([error])
        store = MemoryStore(pipeline_id=1)
        writer, _ = write(destination, store)
        if passes:
            writer.wait()
        else:
            with pytest.raises(type(error)):
                writer.wait()
        writer.close()
        store.close()
        assert len(destination.calls) == (2 if passes else 1)
