"""While streaming, every lake snapshot holds whole source transactions (issue 50): a reader of any snapshot sees a
state the source really had, across all its tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.testing.pipelines import all_ready, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.workload import concurrent_transactions
from etl_spark.ducklake.reader import latest_consistent, open_lake
from etl_spark.testing import lake_matches, latest_snapshot

pytestmark = pytest.mark.slow

ACCOUNTS, OPENING, TRANSFERS, LEGS = 50, 1000, 100, 100
SPARK = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}}


def transfer(conn: psycopg.Connection[Any], i: int) -> None:
    """Move amounts between pairs of accounts, write each in the ledger and count them at the branch: at each commit
    the balances sum to what they opened with, and the branch's total is the ledger's. Several hundred messages a
    transaction, so that the stream's reads end inside transactions."""
    legs = [((i + k) % ACCOUNTS + 1, (i * 7 + k + 3) % ACCOUNTS + 1, (i + k) % 13 + 1) for k in range(LEGS)]
    # The branch first: its row lock orders the clients' transactions, so their account updates never deadlock.
    conn.execute("UPDATE branches SET moved = moved + %s WHERE id = 1", (sum(a for _, _, a in legs),))
    with conn.cursor() as cur:
        cur.executemany("UPDATE accounts SET balance = balance - %s WHERE id = %s", [(a, s) for s, _, a in legs])
        cur.executemany("UPDATE accounts SET balance = balance + %s WHERE id = %s", [(a, d) for _, d, a in legs])
        cur.executemany("INSERT INTO ledger (src, dst, amount) VALUES (%s, %s, %s)", legs)


def test_every_snapshot_while_streaming_holds_whole_transactions(pg_database: TestDatabase, tmp_path: Path) -> None:
    """Two clients commit transfers that each change three tables, into batches due every 5 ms: every snapshot the
    stream commits keeps the transfers' invariants, as DuckDB reads it by time travel."""
    db = pg_database
    db.execute(
        f"""
        CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
        CREATE TABLE branches (id int PRIMARY KEY, moved bigint NOT NULL);
        CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, src int, dst int, amount bigint);
        INSERT INTO accounts SELECT g, {OPENING} FROM generate_series(1, {ACCOUNTS}) g;
        INSERT INTO branches VALUES (1, 0);
        CREATE PUBLICATION pub FOR TABLE accounts, branches, ledger;
        """
    )
    catalog = f"sqlite:///{tmp_path}/catalog.sqlite"
    config = pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={"type": "ducklake", "catalog": catalog, "data_path": f"{tmp_path}/data/", "spark": SPARK},
        batch={"max_fill_ms": 5},
    )
    store = build_store(config, "test")
    pipeline = Pipeline(config, store, build_destination(config, store, "test"))
    pipeline.start()
    try:
        wait_until(lambda: all_ready(pipeline, 3), "the copies", pipeline, timeout=180)
        con = open_lake(catalog)
        try:
            copied = latest_snapshot(con)
        finally:
            con.close()
        with (
            concurrent_transactions(db, transfer, TRANSFERS, pause=0),
            concurrent_transactions(db, lambda conn, i: transfer(conn, i + TRANSFERS), TRANSFERS, pause=0),
        ):
            pass

        def equal() -> bool:
            with db.connect() as conn:
                return all(
                    lake_matches(conn, catalog, t) for t in ("public.accounts", "public.branches", "public.ledger")
                )

        wait_until(equal, "the lake equal to the source", pipeline, timeout=180)
    finally:
        pipeline.shutdown()

    con = open_lake(catalog)
    try:
        marks = {
            int(s): json.loads(info)["consistent"]
            for s, info in con.execute(
                "SELECT snapshot_id, commit_extra_info FROM ducklake_snapshots('lake')"
            ).fetchall()
            if info is not None
        }
        latest = latest_consistent(con, 1)
        snapshots = [s for (s,) in con.execute("SELECT snapshot_id FROM ducklake_snapshots('lake')").fetchall()]
        streamed = [s for s in snapshots if s > copied]
        broken = []
        for s in streamed:
            at = f"AT (VERSION => {int(s)})"
            ((total, moved, ledger),) = con.execute(
                f"SELECT (SELECT sum(balance) FROM lake.public.accounts {at}),"
                f" (SELECT moved FROM lake.public.branches {at}),"
                f" (SELECT coalesce(sum(amount), 0) FROM lake.public.ledger {at})"
            ).fetchall()
            if (total, moved) != (ACCOUNTS * OPENING, ledger):
                broken.append((s, total, moved, ledger))
    finally:
        con.close()
    assert len(streamed) >= 10, f"only {len(streamed)} snapshots: too few batches to tell"
    assert not broken, f"{len(broken)} of {len(streamed)} snapshots hold part of a transaction: {broken[:5]}"
    # Each streamed batch's snapshot says it is a state the source had; none before every table was ready does
    # (the copies' snapshots record no position, the catch-ups' batches say false).
    streamed_marks = {s: m for s, m in marks.items() if s > copied}
    assert len(streamed_marks) >= 10 and all(streamed_marks.values()), streamed_marks
    assert not any(m for s, m in marks.items() if s <= copied), marks
    assert latest == max(streamed_marks)
