"""``nudge_decoding``: the engine's one commit that flushes the WAL written so far on an idle source, so that the
stream of a logical walsender gets past the last read of a finished incremental copy."""

from __future__ import annotations

from etl.lsn import Lsn
from etl.postgres.wal_nudge import nudge_decoding
from etl.testing.pipelines import poll
from etl.testing.pytest_plugin import TestDatabase


def test_a_nudge_commits_a_transaction_of_its_own_and_flushes_the_wal_before_it(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with pg_database.connect(autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")  # the WAL writer, not the commit, flushes what follows
        conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
        (before,) = conn.execute("SELECT pg_catalog.pg_current_wal_insert_lsn()::text").fetchone() or ("",)
        (commits,) = conn.execute(
            "SELECT xact_commit FROM pg_catalog.pg_stat_database WHERE datname = current_database()"
        ).fetchone() or (0,)
        nudged = nudge_decoding(conn)
        poll(
            lambda: Lsn.parse(
                (conn.execute("SELECT pg_catalog.pg_current_wal_flush_lsn()::text").fetchone() or ("",))[0]
            ),
            "the WAL writer to flush the nudge's commit",
            until=lambda flushed: flushed > nudged,
            timeout=10,
        )
        assert Lsn.parse(before) <= nudged  # past everything written before it (and flushed, above)
        conn.execute("SELECT pg_catalog.pg_stat_force_next_flush()")
        (after,) = conn.execute(
            "SELECT xact_commit FROM pg_catalog.pg_stat_database WHERE datname = current_database()"
        ).fetchone() or (0,)
        rows = conn.execute("SELECT count(*) FROM t").fetchone()
    assert after > commits  # a commit of its own
    assert rows == (100,)  # and no row changed
