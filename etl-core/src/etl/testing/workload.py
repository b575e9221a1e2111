"""Source tables and write workloads for end-to-end pipeline tests (crash and restart tests above all).

``items`` (keyed, several types) and ``ledger`` (identity key) are two tables of any size; ``churn`` is
one transaction of inserts, updates and deletes on them; ``concurrent_transactions`` keeps committing
such transactions on a thread while a test kills and restarts a pipeline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from etl.testing.pytest_plugin import TestDatabase

Transaction = Callable[[psycopg.Connection[Any], int], object]
"""The statements of the ``i``-th transaction, run inside it."""


def create_items_and_ledger(db: TestDatabase, items: int, ledger: int) -> None:
    """Create and fill ``items`` (``items`` rows) and ``ledger`` (``ledger`` rows); no publication."""
    db.execute(
        f"""
        CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int, updated timestamptz);
        INSERT INTO items SELECT g, 'item ' || g, g % 100, timestamptz '2026-01-01 00:00+00' + g * interval '1 s'
            FROM generate_series(1, {int(items)}) g;
        CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item bigint, delta int);
        INSERT INTO ledger (item, delta) SELECT g % 1000, g % 7 - 3 FROM generate_series(1, {int(ledger)}) g;
        """
    )


def churn(conn: psycopg.Connection[Any], i: int, *, key_updates: bool = False) -> None:
    """The ``i``-th transaction's changes to ``items`` and ``ledger``: an insert, updates and a delete.

    With ``key_updates`` it also moves an ``items`` row to a new key (from ``i + 1000`` to ``i + 101000``).
    """
    conn.execute("INSERT INTO ledger (item, delta) VALUES (%s, 1)", (i,))
    conn.execute("UPDATE items SET qty = qty + 1, name = name || '+' WHERE id = %s", (i % 50 + 1,))
    if key_updates:
        conn.execute("UPDATE items SET id = id + 100000 WHERE id = %s", (i + 1000,))
    conn.execute("DELETE FROM ledger WHERE id = %s", (i * 7 + 1,))


@contextmanager
def concurrent_transactions(
    db: TestDatabase, transaction: Transaction, count: int, pause: float = 0.01, timeout: float = 300
) -> Iterator[None]:
    """Commit ``count`` transactions, ``transaction(conn, i)`` each, on a thread while the block runs.

    Leaving the block waits for the last commit; it fails when a transaction raised or they did not
    all commit within ``timeout`` seconds.
    """
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with db.connect() as conn:
                for i in range(count):
                    with conn.transaction():
                        transaction(conn, i)
                    time.sleep(pause)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    writer = threading.Thread(target=run, name="source-workload", daemon=True)
    writer.start()
    try:
        yield
    finally:
        writer.join(timeout)
    if errors:
        raise errors[0]
    assert not writer.is_alive(), f"the workload did not commit {count} transactions within {timeout:.0f}s"
