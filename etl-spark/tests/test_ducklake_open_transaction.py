"""A transaction larger than a batch reaches the lake in one snapshot (issue 50): its parts are written where no
snapshot sees them, planned as if the parts before were committed, and registered together by the batch that
ends the transaction; a run that dies in between leaves nothing that its next start does not remove."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from etl.destination.memory import MemoryDestination, sort_rows
from etl.errors import DestinationError
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl_spark.ducklake.catalog.ddl import STAGED_TABLE
from etl_spark.ducklake.destination import DuckLakeDestination

pytestmark = pytest.mark.slow

NUMERIC_10_2 = ((10 << 16) | 2) + 4
ORDERS = TableSchema(
    16600,
    TableName("public", "orders"),
    (
        ColumnSchema("id", 23, nullable=False, primary_key=True, attnum=1),
        ColumnSchema("note", 25, attnum=2),
        ColumnSchema("qty", 23, attnum=3),
        ColumnSchema("amount", 1700, NUMERIC_10_2, attnum=4),
    ),
)
LOG = TableSchema(
    16601,
    TableName("public", "log"),
    (ColumnSchema("a", 25), ColumnSchema("b", 23)),
    replica_identity=ReplicaIdentity.FULL,
)


def order(i: int, qty: int | None = None, note: str | None = None) -> dict[str, Any]:
    return {"id": i, "note": note or f"note {i}", "qty": i if qty is None else qty, "amount": Decimal(f"{i}.50")}


def unregistered(lake: Any, destination: DuckLakeDestination) -> list[str]:
    """Parquet files under the data path that no snapshot of the catalog references."""
    with destination.catalog.engine.connect() as conn:  # every lake table, those a resync replaced too
        tables = [int(t) for (t,) in conn.execute(sa.text("SELECT DISTINCT table_id FROM ducklake_table"))]
    known = destination.catalog.known_files(tables)
    return sorted(str(p) for p in Path(lake.data_path).rglob("*.parquet") if str(p) not in known)


def staged_records(destination: DuckLakeDestination) -> int:
    with destination.catalog.engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {STAGED_TABLE}")).scalar_one())


def started(kit: Any, lake: Any, reference: MemoryDestination, **options: Any) -> DuckLakeDestination:
    """A lake whose orders (1-5) and log were copied, its rows in files; the same in ``reference``."""
    destination = kit.make_destination(lake, inline_row_limit=0, **options)
    log = [{"a": "x", "b": 1}, {"a": "x", "b": 1}, {"a": "y", "b": 2}]
    for target in (destination, reference):
        target.write_table_rows(ORDERS, kit.rows_table(ORDERS, [order(i) for i in range(1, 6)]))
        target.write_table_rows(LOG, kit.rows_table(LOG, log))
    return destination


def test_a_transaction_over_three_batches_is_one_snapshot(lake: Any, kit: Any) -> None:
    """Each part's changes find the rows the parts before wrote (updates, deletes, unchanged TOAST values, a
    keyless table's copies): the lake shows nothing of the transaction until its last batch, then all of it."""
    reference = MemoryDestination()
    destination = started(kit, lake, reference)
    b = kit.BatchBuilder()
    b.commit().update(ORDERS, order(1, qty=10))  # a whole transaction before the large one
    b.commit(at=b.lsn + 1)  # the large one: its commit record starts where the one before ends
    b.insert(ORDERS, order(6)).insert(ORDERS, order(7)).update(ORDERS, order(2, qty=20))
    b.delete(ORDERS, {"id": 3}).insert(LOG, {"a": "z", "b": 3})
    parts = [b.build(ends_in_transaction=True)]
    b.update(ORDERS, order(6, qty=60, note="six")).delete(ORDERS, {"id": 7})
    b.update(ORDERS, order(2, qty=21), missing=("note",))  # its note is the one the first part wrote
    b.delete(LOG, {"a": "z", "b": 3}).delete(LOG, {"a": "x", "b": 1}).insert(ORDERS, order(9))
    parts.append(b.build(ends_in_transaction=True))
    b.update(ORDERS, order(9, qty=90)).insert(LOG, {"a": "w", "b": 4})
    b.commit().update(ORDERS, order(4, qty=40))  # and one after it, in the same batch
    parts.append(b.build())

    before = lake.snapshot()
    destination.write_events(parts[0])
    reference.write_events(kit.BatchBuilder().commit().update(ORDERS, order(1, qty=10)).build())
    first = lake.snapshot()
    assert first == before + 1  # the transaction before, alone
    assert lake.rows(ORDERS) == reference.rows("public.orders")
    ran: list[str] = []
    step = partial(destination._unless_open, partial(ran.append, "step"))  # an upkeep step found due before the part
    destination.write_events(parts[1])
    assert destination.upkeep() == []  # upkeep waits for the transaction's commit
    step()
    assert ran == []  # and so does a step found due before it began
    assert destination.metrics.open_transaction_rows._value.get() == 7  # 6, 7, 2 and z; then 6, 2, 9
    assert lake.snapshot() == first  # nothing of the large transaction is visible
    assert lake.rows(ORDERS) == reference.rows("public.orders")
    assert staged_records(destination) > 0

    destination.write_events(parts[2])
    assert lake.snapshot() == first + 1
    expected = sort_rows(
        [order(1, qty=10), order(2, qty=21), order(4, qty=40), order(5), order(6, qty=60, note="six"), order(9, 90)]
    )
    assert lake.rows(ORDERS) == expected
    assert lake.rows(LOG) == sort_rows([{"a": "x", "b": 1}, {"a": "y", "b": 2}, {"a": "w", "b": 4}])
    assert lake.rows(ORDERS, version=first) == sort_rows([order(1, qty=10), *map(order, range(2, 6))])
    assert unregistered(lake, destination) == []  # the parts' own delete files went once they were committed
    assert staged_records(destination) == 0
    assert destination.metrics.large_transactions.labels("whole")._value.get() == 1
    assert destination.metrics.open_transaction_rows._value.get() == 0

    destination.write_events(parts[2])  # a replay of the last part changes nothing
    assert lake.snapshot() == first + 1


def test_a_run_that_dies_between_parts_leaves_nothing_after_the_next_start(lake: Any, kit: Any) -> None:
    """The files of the parts written before a crash are visible nowhere, and the next start removes them; the
    transaction, replayed from its start, lands whole."""
    reference = MemoryDestination()
    dead = started(kit, lake, reference)
    b = kit.BatchBuilder()
    b.commit().update(ORDERS, order(1, qty=10)).insert(ORDERS, order(6)).delete(LOG, {"a": "y", "b": 2})
    first = b.build(ends_in_transaction=True)
    b.update(ORDERS, order(6, qty=60)).delete(ORDERS, {"id": 2})
    second = b.build(ends_in_transaction=True)
    b.insert(ORDERS, order(7))
    last = b.build()
    before = lake.snapshot()
    dead.write_events(first)
    dead.write_events(second)
    assert unregistered(lake, dead)  # the parts' files, in no snapshot
    # The run dies here: nothing of it is tidied up (its shutdown comes after the test).

    again = kit.make_destination(lake, inline_row_limit=0)
    assert unregistered(lake, again) == []
    assert staged_records(again) == 0
    assert lake.snapshot() == before
    assert lake.rows(ORDERS) == reference.rows("public.orders")

    for batch in (first, second, last):
        again.write_events(batch)
        reference.write_events(batch)
    assert lake.snapshot() == before + 1
    assert lake.rows(ORDERS) == reference.rows("public.orders")
    assert lake.rows(LOG) == sort_rows(reference.rows("public.log"))
    assert unregistered(lake, again) == []


def test_a_truncate_inside_the_transaction_drops_the_parts_before_it(lake: Any, kit: Any) -> None:
    reference = MemoryDestination()
    destination = started(kit, lake, reference)
    b = kit.BatchBuilder()
    b.commit().insert(ORDERS, order(6)).update(ORDERS, order(1, qty=10))
    batches = [b.build(ends_in_transaction=True)]
    b.truncate(ORDERS).insert(ORDERS, order(7))
    batches.append(b.build(ends_in_transaction=True))
    b.update(ORDERS, order(7, qty=70)).insert(ORDERS, order(8))
    batches.append(b.build())
    before = lake.snapshot()
    for batch in batches:
        destination.write_events(batch)
        reference.write_events(batch)
    assert lake.snapshot() == before + 1
    assert lake.rows(ORDERS) == sort_rows([order(7, qty=70), order(8)])
    assert lake.rows(ORDERS) == reference.rows("public.orders")
    assert unregistered(lake, destination) == []


def test_a_part_that_changes_a_tables_columns_splits_the_transaction_there(lake: Any, kit: Any) -> None:
    """DDL inside a transaction larger than a batch: the parts before it commit in a snapshot of their own, and the
    lake still ends equal."""
    reference = MemoryDestination()
    destination = started(kit, lake, reference)
    altered = TableSchema(ORDERS.id, ORDERS.name, (*ORDERS.columns, ColumnSchema("extra", 25, attnum=5)))
    b = kit.BatchBuilder()
    b.commit().insert(ORDERS, order(6)).update(ORDERS, order(1, qty=10))
    batches = [b.build(ends_in_transaction=True)]
    b.update(altered, {**order(6, qty=60), "extra": "e"})
    batches.append(b.build(ends_in_transaction=True))
    b.insert(altered, {**order(7), "extra": None})
    batches.append(b.build())
    before = lake.snapshot()
    for batch in batches:
        destination.write_events(batch)
        reference.write_events(batch)
    assert lake.snapshot() > before + 1
    assert destination.metrics.large_transactions.labels("split")._value.get() == 1
    assert lake.rows(altered) == reference.rows("public.orders")
    assert unregistered(lake, destination) == []


def test_another_writer_changing_a_table_under_the_parts_stops_the_pipeline(lake: Any, kit: Any) -> None:
    """DuckDB compacts the table between two parts: the parts' deletes were found in the files it replaced, so the
    commit refuses (no retry could mend them), shows nothing of the transaction, and a replay lands it whole."""
    reference = MemoryDestination()
    destination = started(kit, lake, reference)
    more = [order(i) for i in range(10, 13)]
    for target in (destination, reference):
        target.write_table_rows(ORDERS, kit.rows_table(ORDERS, more))  # a second small file to merge with
    b = kit.BatchBuilder()
    b.commit().update(ORDERS, order(1, qty=10)).insert(ORDERS, order(6))
    first = b.build(ends_in_transaction=True)
    b.update(ORDERS, order(11, qty=110)).delete(ORDERS, {"id": 2})
    last = b.build()
    destination.write_events(first)
    con = lake.duckdb()
    try:
        con.execute("CALL ducklake_merge_adjacent_files('lake')")
    finally:
        con.close()
    before = lake.snapshot()
    with pytest.raises(DestinationError, match="changed by another writer") as raised:
        destination.write_events(last)
    assert not raised.value.transient
    assert lake.snapshot() == before
    assert lake.rows(ORDERS) == reference.rows("public.orders")

    destination.shutdown()  # the pipeline stops; the next run replays the transaction
    again = kit.make_destination(lake, inline_row_limit=0)
    for batch in (first, last):
        again.write_events(batch)
        reference.write_events(batch)
    assert lake.rows(ORDERS) == reference.rows("public.orders")
    assert unregistered(lake, again) == []


def test_a_table_copied_again_while_the_transaction_is_open_drops_its_parts(lake: Any, kit: Any) -> None:
    """A resync replaces the lake table between two parts: the copy brings its rows, the parts planned on the old
    table are left out, and a transaction left with no table ends (the next one is held as any)."""
    reference = MemoryDestination()
    destination = started(kit, lake, reference)
    b = kit.BatchBuilder()
    b.commit().update(ORDERS, order(1, qty=10)).insert(ORDERS, order(6))
    first = b.build(ends_in_transaction=True)
    b.delete(ORDERS, {"id": 2})
    last = b.build()
    destination.write_events(first)
    copied = [order(1, qty=10), order(6), *map(order, range(3, 6))]
    destination.drop_table_for_copy(ORDERS)
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, copied))  # the copy, past the transaction
    destination.write_events(last)
    assert lake.rows(ORDERS) == sort_rows(copied)
    assert destination.metrics.open_transaction_rows._value.get() == 0
    assert unregistered(lake, destination) == []

    b.commit().insert(ORDERS, order(7))  # the next large transaction is held, not committed by its first part
    before = lake.snapshot()
    destination.write_events(b.build(ends_in_transaction=True))
    destination.write_events(b.build(ends_in_transaction=True))
    assert lake.snapshot() == before
    destination.write_events(b.insert(ORDERS, order(8)).build())
    assert lake.snapshot() == before + 1
    assert lake.rows(ORDERS) == sort_rows([*copied, order(7), order(8)])


def test_a_schema_change_after_the_transaction_in_its_last_batch_does_not_split_it(lake: Any, kit: Any) -> None:
    """The batch that ends the transaction also holds later ones, one of which adds a column: the transaction still
    commits whole, in a snapshot before theirs."""
    reference = MemoryDestination()
    destination = started(kit, lake, reference)
    altered = replace(LOG, columns=(*LOG.columns, ColumnSchema("c", 25)))
    b = kit.BatchBuilder()
    b.commit().update(ORDERS, order(1, qty=10)).insert(LOG, {"a": "t", "b": 5})
    batches = [b.build(ends_in_transaction=True)]
    b.insert(ORDERS, order(6))
    b.commit().insert(LOG, {"a": "u", "b": 6})
    b.commit().insert(altered, {"a": "v", "b": 7, "c": "new"})
    batches.append(b.build())
    for batch in batches:
        destination.write_events(batch)
        reference.write_events(batch)
    assert destination.metrics.large_transactions.labels("whole")._value.get() == 1
    assert destination.metrics.large_transactions.labels("split")._value.get() == 0
    assert lake.rows(ORDERS) == reference.rows("public.orders")
    assert lake.rows(altered) == reference.rows("public.log")
    assert unregistered(lake, destination) == []


def test_the_records_of_an_open_transaction_removed_behind_its_back_stop_the_pipeline(lake: Any, kit: Any) -> None:
    """Something else removes the pipeline's records of its open transaction (another process of the pipeline
    starting, a hand): the commit that ends the transaction cannot tell its parts from files a crash left, so it
    stops, shows nothing of the transaction, and does not move the lake's position past it."""
    reference = MemoryDestination()
    destination = started(kit, lake, reference)
    b = kit.BatchBuilder()
    b.commit().update(ORDERS, order(1, qty=10)).insert(ORDERS, order(6))
    first = b.build(ends_in_transaction=True)
    b.delete(ORDERS, {"id": 2})
    last = b.build()
    destination.write_events(first)
    with destination.catalog.engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {STAGED_TABLE}"))
    before, position = lake.snapshot(), destination.catalog.position()
    with pytest.raises(DestinationError, match="etl_ducklake_staged") as raised:
        destination.write_events(last)
    assert not raised.value.transient
    assert lake.snapshot() == before
    assert destination.catalog.position() == position
    assert lake.rows(ORDERS) == reference.rows("public.orders")
