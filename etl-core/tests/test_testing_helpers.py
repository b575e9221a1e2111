"""The end-to-end test helpers of etl.testing: config files for ``etl run`` and background workloads."""

from __future__ import annotations

import datetime as dt
import random
import select
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from etl.config import load_config
from etl.destination.memory import sort_rows
from etl.pipeline import Pipeline
from etl.testing.compare import source_rows
from etl.testing.pipelines import pipeline_config, poll
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import difference, write_config
from etl.testing.workload import churn, concurrent_transactions, create_items_and_ledger


def test_write_config_reads_back_as_the_same_config(pg_database: TestDatabase, tmp_path: Path) -> None:
    config = pipeline_config(
        pg_database,
        pipeline_id=9,
        pipeline={"install_ddl_trigger": False},
        copy={"connections": 3, "skip": ["public.a"]},
        source={"password": 'p"w\\ é ${HOME} $$'},
        batch={"max_fill_ms": 250},
        store={"type": "sqlite", "path": str(tmp_path / "state dir" / "state.sqlite")},
        destination={
            "type": "ducklake",
            "catalog": "sqlite:////var/lake/c.sqlite",
            "ratio": 0.5,
            "tags": ["a", "b\n"],
            "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        },
    )
    path = write_config(tmp_path / "pipeline.toml", config)
    read = load_config(path, environ={"HOME": "/root"})
    assert read == config
    assert read.source.password is not None
    assert read.source.password.get_secret_value() == 'p"w\\ é ${HOME} $$'  # written as given, no interpolation


def test_concurrent_transactions_commit_them_all(pg_database: TestDatabase) -> None:
    create_items_and_ledger(pg_database, items=100, ledger=50)
    with concurrent_transactions(pg_database, churn, count=20, pause=0):
        pass
    # ids 51 to 70 inserted; 1, 8, ..., 57 deleted (a delete of an id not inserted yet deletes nothing)
    assert pg_database.execute("SELECT count(*), max(id) FROM ledger") == [(61, 70)]
    assert pg_database.execute("SELECT sum(qty) - (SELECT sum(g % 100) FROM generate_series(1, 100) g) FROM items") == [
        (20,)
    ]


def test_concurrent_transactions_end_early_after_a_few_more(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (i int)")

    def insert(conn: psycopg.Connection[Any], i: int) -> None:
        conn.execute("INSERT INTO t VALUES (%s)", (i,))

    with concurrent_transactions(pg_database, insert, count=1000, pause=0.01) as workload:
        while workload.committed < 3:
            time.sleep(0.01)
        workload.finish(after=2)
        seen = workload.committed
    assert seen <= workload.committed <= seen + 2
    assert pg_database.execute("SELECT count(*), max(i) FROM t") == [(workload.committed, workload.committed - 1)]


def test_concurrent_transactions_raise_what_a_transaction_raised(pg_database: TestDatabase) -> None:
    def failing(conn: psycopg.Connection[Any], i: int) -> None:
        conn.execute("SELECT 1 / %s", (3 - i,))  # the fourth transaction divides by zero

    with pytest.raises(psycopg.errors.DivisionByZero), concurrent_transactions(pg_database, failing, count=10, pause=0):
        pass


def test_a_failed_wait_says_which_rows_differ() -> None:
    expected = {"public.t": [{"id": 1}, {"id": 2}, {"id": 2}], "public.u": [{"id": 9}]}
    actual = {"public.t": [{"id": 2}, {"id": 3}], "public.u": [{"id": 9}]}
    one, two, three = repr({"id": 1}), repr({"id": 2}), repr({"id": 3})
    assert difference(expected, actual) == (
        f"public.t: 3 rows expected, 2 read; missing {[one, two]}; unexpected {[three]}"
    )


@pytest.mark.parametrize(
    "rows",
    [
        [{"id": i, "name": f"n{i}", "at": None if i % 2 else dt.date(2026, 1, i + 1)} for i in range(9)],
        [{"a": i % 3, "b": None if i % 4 else i} for i in range(12)],  # repeated first values, None beside them
        [{"a": None if i % 2 else i, "b": "x"} for i in range(6)],  # None among the first values
        [{"x": Decimal("NaN") if i == 2 else Decimal(i)} for i in range(5)],
        [{"x": float("nan") if i == 1 else float(i)} for i in range(5)],
        [{"tags": [i, None], "n": i} for i in range(5)],  # unhashable first values
        [{"at": dt.datetime(2026, 1, 1 + i, tzinfo=dt.UTC if i % 2 else None)} for i in range(4)],
    ],
    ids=["key", "repeated", "none", "decimal-nan", "float-nan", "lists", "aware-and-naive"],
)
def test_sort_rows_gives_one_order_for_the_same_rows_in_any_order(rows: list[dict[str, Any]]) -> None:
    """Comparing two tables row for row needs an order of the rows that depends on their values only."""
    orders = {repr(sort_rows(random.Random(seed).sample(rows, len(rows)))) for seed in range(20)}
    assert len(orders) == 1
    assert len(sort_rows(rows)) == len(rows)


def test_source_rows_reads_a_table_again_only_when_it_changed(pg_database: TestDatabase) -> None:
    """Polls read the source until a destination matches it: an unchanged table is not read again, and any
    change (a value, a row, a column's name) is."""
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    with pg_database.connect() as conn:
        first = source_rows(conn, "public.t")
        again = source_rows(conn, "public.t")
        assert again == first and again[0] is first[0], "an unchanged table was read again"
        again.clear()  # a caller's list is its own
        assert source_rows(conn, "public.t") == first
        pg_database.execute("UPDATE t SET v = 'c' WHERE id = 2")
        assert source_rows(conn, "public.t") == [{"id": 1, "v": "a"}, {"id": 2, "v": "c"}]
        pg_database.execute("ALTER TABLE t RENAME COLUMN v TO w")
        assert source_rows(conn, "public.t") == [{"id": 1, "w": "a"}, {"id": 2, "w": "c"}]
        pg_database.execute("DELETE FROM t WHERE id = 1")
        assert source_rows(conn, "public.t") == [{"id": 2, "w": "c"}]
        with conn.transaction():  # inside a caller's transaction: read as it sees the table
            conn.execute("INSERT INTO t VALUES (3, 'd')")
            assert source_rows(conn, "public.t") == [{"id": 2, "w": "c"}, {"id": 3, "w": "d"}]
        assert source_rows(conn, "public.t") == [{"id": 2, "w": "c"}, {"id": 3, "w": "d"}]


def test_a_kept_connection_serves_each_thread_and_is_replaced_once_unusable(pg_database: TestDatabase) -> None:
    db = pg_database
    kept = db.kept_connection()
    pid = kept.info.backend_pid
    assert db.execute("SELECT pg_backend_pid()") == db.execute("SELECT pg_backend_pid()") == [(pid,)]
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(db.execute("SELECT pg_backend_pid()")[0][0]))
    thread.start()
    thread.join()
    assert other and other[0] != pid, "each thread has a connection of its own"

    with db.connect() as admin:  # the server ends the kept connection's backend, as a restart would
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    assert select.select([kept.fileno()], [], [], 10)[0], "the terminated backend's connection never ended"
    replaced = db.execute("SELECT pg_backend_pid()")[0][0]
    assert replaced != pid

    db.execute("BEGIN")  # a statement that leaves a transaction open: the next call does not run inside it
    assert db.execute("SELECT now() = statement_timestamp()") == [(True,)]
    assert db.execute("SELECT pg_backend_pid()")[0][0] != replaced


def test_dropping_a_database_closes_its_kept_connections(pg_database: TestDatabase) -> None:
    cluster, name = pg_database.cluster, f"{pg_database.name}_kept"
    cluster.create_database(name)
    kept = TestDatabase(cluster, name).kept_connection()
    cluster.drop_database(name)
    assert kept.closed
    assert pg_database.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)) == [(0,)]


def test_poll_returns_the_first_value_that_satisfies_until() -> None:
    values = iter(range(10))
    assert poll(lambda: next(values), "three", until=lambda n: n >= 3, timeout=0.3, least=0) == 3
    assert next(values) == 4  # no call after the one that satisfied it
    assert poll(lambda: "x", "anything") == "x"  # by default, the first truthy value


def test_poll_fails_on_timeout_with_what_and_the_last_value() -> None:
    values = iter(range(1_000_000))
    with pytest.raises(AssertionError, match=r"timed out after 0.3s waiting for the thing; last value \d+$"):
        poll(lambda: next(values), "the thing", until=lambda n: n < 0, timeout=0.3, least=0.01)
    with pytest.raises(AssertionError) as info:
        poll(lambda: list(range(1000)), "a short list", until=lambda rows: len(rows) < 10, timeout=0.1)
    message = str(info.value)
    assert "last value [0, 1, 2" in message and "998, 999]" in message and len(message) < 500


def test_poll_retries_the_exceptions_it_is_told_of_and_shows_the_last() -> None:
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise KeyError("not yet")
        return len(calls)

    assert poll(flaky, "a value", retry_on=(KeyError,), timeout=0.3, least=0) == 3

    def missing() -> int:
        raise KeyError("no table t")

    with pytest.raises(AssertionError, match=r"a table; no value, last exception KeyError\('no table t'\)$"):
        poll(missing, "a table", retry_on=(LookupError,), timeout=0.1)


def test_poll_lets_other_exceptions_through_at_once() -> None:
    calls: list[int] = []

    def broken() -> int:
        calls.append(1)
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        poll(broken, "a value", retry_on=(KeyError,), timeout=0.3)
    assert calls == [1]


def test_poll_fails_at_once_when_the_pipeline_stopped() -> None:
    class Stopped:
        def wait(self, timeout: float) -> bool:
            return True

    began = time.monotonic()
    with pytest.raises(AssertionError, match="the pipeline stopped while waiting for a value"):
        poll(lambda: 0, "a value", pipeline=cast(Pipeline, Stopped()), timeout=30)
    assert time.monotonic() - began < 1
