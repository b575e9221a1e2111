"""Copy plans of test databases' tables, for tests of destinations that copy tables themselves (``TableCopier``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from etl.copy_plan import CopyPlan, CopyStopped
from etl.postgres.catalog import publication_tables, table_schema
from etl.postgres.connection import connect
from etl.postgres.copy import plan_copy
from etl.testing.pytest_plugin import TestDatabase


def published_plan(db: TestDatabase, setup: str, parts: int, publication: str = "pub") -> CopyPlan:
    """Run ``setup`` (SQL that makes a table and ``publication`` of it), then plan the table's copy in up to
    ``parts`` ranges per source table (per leaf of a partitioned one), without a snapshot."""
    db.execute(setup)
    with connect(db.connection()) as conn:
        (table,) = publication_tables(conn, publication)
        schema = table_schema(conn, table.id, table.column_list)
    return plan_copy(db.connection(), schema, table, None, parts)


def stop_while_tasks_wait(db: TestDatabase, table: str, copy: Callable[[threading.Event], object], tasks: int) -> None:
    """Run ``copy(stop)`` (a destination's copy of ``table``) while another session locks the table, set ``stop``
    once ``tasks`` of its reads wait for the lock (its tasks are running then), and check that it raises
    ``CopyStopped``. The lock is released only after the copy returned: reads that outlived the stop would go on
    then, so a check after this sees what they left."""
    stop = threading.Event()

    def stop_once_tasks_wait() -> None:
        with db.connect() as watcher:
            while not stop.is_set():
                waiting = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'COPY%'"
                ).fetchone()
                if waiting and waiting[0] >= tasks:
                    stop.set()
                stop.wait(0.1)

    with db.connect() as locker:
        locker.execute("BEGIN")
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        watcher = threading.Thread(target=stop_once_tasks_wait, daemon=True)
        watcher.start()
        try:
            with pytest.raises(CopyStopped):
                copy(stop)
        finally:
            stop.set()
            watcher.join()
            locker.execute("ROLLBACK")
