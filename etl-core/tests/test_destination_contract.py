"""The destination contract (``etl.testing.destination_contract``) holds for the memory destination, and each of
its checks fails for a destination with the one defect it is there to catch."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from etl.destination.base import WriteResult
from etl.destination.memory import MemoryDestination
from etl.events import MISSING, EventBatch, InsertEvent, RelationEvent, TruncateEvent, UpdateEvent
from etl.schema import TableSchema
from etl.testing.destination_contract import DestinationContract


class TestMemoryDestination(DestinationContract):
    @pytest.fixture
    def destination(self) -> Iterator[MemoryDestination]:
        destination = MemoryDestination()
        destination.startup()
        yield destination
        destination.shutdown()


class Broken(MemoryDestination):
    """The memory destination with one defect, named by a check of the contract it breaks. A fake by design."""

    def __init__(self, defect: str) -> None:
        super().__init__()
        self.defect = defect
        self._held: list[EventBatch] = []

    def drop_table_for_copy(self, schema: TableSchema) -> None:
        if self.defect != "keeps the old rows on a copy again":
            super().drop_table_for_copy(schema)

    def write_table_rows(self, schema: TableSchema, rows: Any) -> WriteResult:
        if self.defect == "creates no table for an empty copy" and rows.num_rows == 0:
            return WriteResult.DURABLE
        if self.defect == "drops the last copied row":
            rows = rows.slice(0, rows.num_rows - 1)
        return super().write_table_rows(schema, rows)

    def write_events(self, batch: EventBatch) -> WriteResult:
        if self.defect == "reports durable what it has not written":
            self._held.append(batch)
            return WriteResult.DURABLE
        return super().write_events(batch)

    def flush(self) -> None:
        for batch in self._held:
            super().write_events(batch)
        self._held.clear()

    def _apply(self, event: object) -> None:
        if self.defect == "applies replays again":
            self._forget_positions()
        if isinstance(event, TruncateEvent) and self.defect == "ignores truncates":
            return
        known = isinstance(event, RelationEvent) and event.schema.id in self._tables
        if known and self.defect == "ignores schema changes":
            return
        if known and self.defect == "takes replayed schema versions again":
            assert isinstance(event, RelationEvent)
            self._tables[event.schema.id].migrate(event.schema)
            return
        if isinstance(event, UpdateEvent) and event.old_row is not None:
            if self.defect == "keeps the old key of an update" and event.old_is_key:
                event = InsertEvent(event.start_lsn, event.commit_lsn, event.tx_ordinal, event.table_id, event.row)
            if self.defect == "deletes every equal row" and not event.old_is_key:
                table = self._tables[event.table_id]
                table.unkeyed.pop(event.old_row, None)
                event = InsertEvent(event.start_lsn, event.commit_lsn, event.tx_ordinal, event.table_id, event.row)
        if isinstance(event, UpdateEvent) and self.defect == "writes unchanged TOAST values as null":
            row = tuple(None if v is MISSING else v for v in event.row)
            event = UpdateEvent(
                event.start_lsn,
                event.commit_lsn,
                event.tx_ordinal,
                event.table_id,
                row,
                event.old_row,
                event.old_is_key,
            )
        super()._apply(event)

    def _forget_positions(self) -> None:
        for table in self._tables.values():
            table.position = (-1, -1)


DEFECTS = {
    "test_copy_writes_every_row": "drops the last copied row",
    "test_copy_of_an_empty_table_creates_it": "creates no table for an empty copy",
    "test_a_copy_again_replaces_the_table": "keeps the old rows on a copy again",
    "test_a_write_is_readable_once_durable": "reports durable what it has not written",
    "test_replayed_batches_change_nothing": "applies replays again",
    "test_truncate_empties_the_table": "ignores truncates",
    "test_schema_changes_between_changes": "ignores schema changes",
    "test_a_replayed_schema_change_changes_nothing": "takes replayed schema versions again",
    "test_an_update_can_change_the_key": "keeps the old key of an update",
    "test_a_table_without_a_key_keeps_equal_rows_apart": "deletes every equal row",
    "test_unchanged_toast_values_keep_the_stored_value": "writes unchanged TOAST values as null",
}


def checks() -> list[str]:
    return [name for name, _ in inspect.getmembers(DestinationContract, inspect.isfunction) if name.startswith("test_")]


def test_every_check_has_a_defect_that_breaks_it() -> None:
    assert sorted(DEFECTS) == checks()


@pytest.mark.parametrize("check", sorted(DEFECTS))
def test_a_check_fails_for_its_defect_and_passes_without(check: str) -> None:
    run: Callable[[Any], None] = getattr(DestinationContract(), check)
    run(MemoryDestination())
    with pytest.raises((AssertionError, KeyError)):  # KeyError: read_rows found no table
        run(Broken(DEFECTS[check]))
