"""While streaming, every lake snapshot holds whole source transactions (issue 50): a reader of any snapshot sees a
state the source really had, across all its tables."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from etl.errors import DestinationError
from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.testing.pipelines import all_ready, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config
from etl.testing.workload import concurrent_transactions
from etl_spark.ducklake.catalog import engine_for
from etl_spark.ducklake.catalog.ddl import STAGED_TABLE
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
        marks = {s: info["consistent"] for s, info in _positioned(con).items()}
        latest = latest_consistent(con, 1)
        snapshots = [s for (s,) in con.execute("SELECT snapshot_id FROM ducklake_snapshots('lake')").fetchall()]
        streamed = [s for s in snapshots if s > copied]
        broken = _broken(con, streamed)
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


LARGE = 1_000_000
"""Changes of the large transaction: more than a hundred batches of ``max_bytes``."""


def large_transfer(db: TestDatabase) -> None:
    """One transaction of a million ledger rows (one unit each, between pairs of accounts), the branch's count of
    them and every account's balance moved to match: whole, it keeps the invariants; any part of it does not."""
    with db.connect() as conn, conn.transaction():
        conn.execute(
            f"INSERT INTO ledger (src, dst, amount) SELECT 1 + g % {ACCOUNTS}, 1 + (g * 7 + 3) % {ACCOUNTS}, 1"
            f" FROM generate_series(1, {LARGE}) g"
        )
        conn.execute(f"UPDATE branches SET moved = moved + {LARGE} WHERE id = 1")  # the transfers' lock order
        conn.execute(
            "UPDATE accounts a SET balance = a.balance + d.delta FROM (SELECT id, sum(delta) AS delta FROM"
            " (SELECT dst AS id, amount AS delta FROM ledger WHERE xid = txid_current()"
            " UNION ALL SELECT src, -amount FROM ledger WHERE xid = txid_current()) t GROUP BY id) d WHERE a.id = d.id"
        )


def test_a_million_change_transaction_is_one_snapshot_across_kills(pg_database: TestDatabase, tmp_path: Path) -> None:
    """A transaction of a million changes among small transfers, ``etl run`` killed while the transaction's parts
    are written: no snapshot shows part of it (DuckDB reads the invariants true at every one), each snapshot's
    recorded LSN is a commit of the source at which the source held exactly the ledger rows the snapshot holds,
    and nothing the killed run wrote is left in the lake."""
    db = pg_database
    db.execute(
        f"""
        CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
        CREATE TABLE branches (id int PRIMARY KEY, moved bigint NOT NULL);
        CREATE TABLE ledger (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, src int, dst int, amount bigint,
            xid bigint NOT NULL DEFAULT txid_current()
        );
        INSERT INTO accounts SELECT g, {OPENING} FROM generate_series(1, {ACCOUNTS}) g;
        INSERT INTO branches VALUES (1, 0);
        CREATE PUBLICATION pub FOR TABLE accounts, branches, ledger;
        """
    )
    catalog = f"sqlite:///{tmp_path}/catalog.sqlite"
    data = tmp_path / "data"
    config = pipeline_config(
        db,
        pipeline_id=3,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={"type": "ducklake", "catalog": catalog, "data_path": f"{data}/", "spark": SPARK},
        batch={"max_fill_ms": 5, "max_bytes": 1024 * 1024, "busy_max_bytes": 2 * 1024 * 1024},
    )
    run = PipelineProcess(write_config(tmp_path / "pipeline.toml", config), log_level="info")
    engine = engine_for(catalog)

    summary = (
        "SELECT (SELECT list(balance ORDER BY id)::text FROM {p}accounts), (SELECT max(moved) FROM {p}branches),"
        " (SELECT count(*) || ' ' || sum(id) || ' ' || sum(amount) || ' ' || sum(xid) FROM {p}ledger)"
    )

    def source() -> tuple[Any, ...]:
        with db.connect() as conn:
            query = summary.format(p="").replace("list(balance ORDER BY id)::text", "array_agg(balance ORDER BY id)")
            row = conn.execute(query).fetchone()
        assert row is not None
        return (str(list(row[0])).replace(" ", ""), row[1], row[2])

    def lake() -> tuple[Any, ...]:
        con = open_lake(catalog)
        try:
            row = con.execute(summary.format(p="lake.public.")).fetchone()
        finally:
            con.close()
        assert row is not None
        return (str(row[0]).replace(" ", ""), row[1], row[2])

    def staged() -> set[str]:
        with engine.connect() as conn:
            return {prefix for (prefix,) in conn.execute(sa.text(f"SELECT prefix FROM {STAGED_TABLE}"))}

    db.execute("SELECT pg_create_logical_replication_slot('lsns', 'test_decoding')")
    try:
        run.start()
        run.wait_equal(source, lake, not_yet=(duckdb.Error, DBAPIError, DestinationError))
        copied = _latest(catalog)
        large = threading.Thread(target=large_transfer, args=(db,), name="large-transfer")
        with concurrent_transactions(db, transfer, TRANSFERS, pause=0.01):
            large.start()
            run.kill_mid_write(staged, timeout=300)  # while its parts are in files no snapshot references
            large.join()
            con = open_lake(catalog)
            try:
                assert not _broken(con, [_latest(catalog)]), "the killed run left part of a transaction visible"
            finally:
                con.close()
            run.start()
        run.wait_equal(source, lake, not_yet=(duckdb.Error, DBAPIError, DestinationError), timeout=600)
        run.stop(timeout=120)
        with db.connect() as conn:
            commits = {
                int(lsn): int(xid)
                for lsn, xid in conn.execute(
                    "SELECT (lsn - '0/0'::pg_lsn)::bigint, xid::text::bigint FROM pg_logical_slot_peek_changes('lsns',"
                    " NULL, NULL, 'include-xids', '1', 'skip-empty-xacts', '0') WHERE data LIKE 'COMMIT%'"
                )
            }
            rows_of = {int(x): int(n) for x, n in conn.execute("SELECT xid, count(*) FROM ledger GROUP BY xid")}
    finally:
        run.stop(timeout=120)
        engine.dispose()
        db.execute("SELECT pg_drop_replication_slot('lsns')")

    known = _known(catalog)
    leftovers = [p for p in data.rglob("*.parquet") if p.name not in known]
    assert not leftovers, f"files in no snapshot are left in the lake: {leftovers[:5]}"
    con = open_lake(catalog)
    try:
        positions = {s: info["lsn_int"] for s, info in _positioned(con).items() if s > copied}
        assert len(positions) >= 10, f"only {len(positions)} snapshots: too few batches to tell"
        assert not _broken(con, positions), "snapshots hold part of a transaction"
        for snapshot, lsn in positions.items():
            assert lsn in commits, f"snapshot {snapshot} stands at {lsn}, where no transaction of the source ends"
            at = f"AT (VERSION => {snapshot})"
            held = Counter(
                dict(con.execute(f"SELECT xid, count(*) FROM lake.public.ledger {at} GROUP BY xid").fetchall())
            )
            wanted = Counter({xid: rows_of[xid] for end, xid in commits.items() if end <= lsn and xid in rows_of})
            assert held == wanted, f"snapshot {snapshot} at {lsn} holds other ledger rows than the source had there"
        assert any(n == LARGE for n in rows_of.values())
    finally:
        con.close()


def _positioned(con: duckdb.DuckDBPyConnection) -> dict[int, dict[str, Any]]:
    """The pipeline's record of each snapshot that stands at a position of the stream (``commit_extra_info``)."""
    rows = con.execute("SELECT snapshot_id, commit_extra_info FROM ducklake_snapshots('lake')").fetchall()
    return {int(s): json.loads(info) for s, info in rows if info is not None}


def _latest(catalog: str) -> int:
    con = open_lake(catalog)
    try:
        return latest_snapshot(con)
    finally:
        con.close()


def _known(catalog: str) -> set[str]:
    """The name of every file the catalog knows, registered or scheduled for deletion."""
    engine = engine_for(catalog)
    try:
        with engine.connect() as conn:
            names = conn.execute(
                sa.text(
                    "SELECT path FROM ducklake_data_file UNION ALL SELECT path FROM ducklake_delete_file"
                    " UNION ALL SELECT path FROM ducklake_files_scheduled_for_deletion"
                )
            )
            return {str(p).rsplit("/", 1)[-1] for (p,) in names}
    finally:
        engine.dispose()


def _broken(con: duckdb.DuckDBPyConnection, snapshots: Any) -> list[tuple[int, Any, Any, Any]]:
    """The snapshots at which the transfers' invariants do not hold: a state the source never had."""
    broken = []
    for s in snapshots:
        at = f"AT (VERSION => {int(s)})"
        ((total, moved, ledger),) = con.execute(
            f"SELECT (SELECT sum(balance) FROM lake.public.accounts {at}),"
            f" (SELECT moved FROM lake.public.branches {at}),"
            f" (SELECT coalesce(sum(amount), 0) FROM lake.public.ledger {at})"
        ).fetchall()
        if (total, moved) != (ACCOUNTS * OPENING, ledger):
            broken.append((int(s), total, moved, ledger))
    return broken
