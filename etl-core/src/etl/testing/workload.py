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


class Workload:
    """The running transactions of ``concurrent_transactions``, which a test may end early."""

    def __init__(self, count: int) -> None:
        self._lock = threading.Lock()
        self._limit = count
        self.committed = 0

    def finish(self, after: int = 0) -> None:
        """Commit at most ``after`` more transactions (fewer when ``count`` comes first), then stop: for a test
        that has seen what it waited for and wants only a few more changes before it goes on."""
        with self._lock:
            self._limit = min(self._limit, self.committed + after)

    def _next(self) -> int | None:
        with self._lock:
            return self.committed if self.committed < self._limit else None

    def _done(self) -> None:
        with self._lock:
            self.committed += 1


@contextmanager
def concurrent_transactions(
    db: TestDatabase, transaction: Transaction, count: int, pause: float = 0.01, timeout: float = 300
) -> Iterator[Workload]:
    """Commit ``count`` transactions, ``transaction(conn, i)`` each, on a thread while the block runs.

    Leaving the block waits for the last commit; it fails when a transaction raised or they did not
    all commit within ``timeout`` seconds. ``Workload.finish`` ends them early.
    """
    errors: list[BaseException] = []
    workload = Workload(count)

    def run() -> None:
        try:
            with db.connect() as conn:
                while (i := workload._next()) is not None:
                    with conn.transaction():
                        transaction(conn, i)
                    workload._done()
                    time.sleep(pause)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    writer = threading.Thread(target=run, name="source-workload", daemon=True)
    writer.start()
    try:
        yield workload
    except BaseException:
        workload.finish()  # the block failed: the rest of the transactions would only delay its report
        raise
    finally:
        writer.join(timeout)
    if errors:
        raise errors[0]
    assert not writer.is_alive(), f"the workload did not commit its transactions within {timeout:.0f}s"
