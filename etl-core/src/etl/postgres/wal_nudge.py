"""A commit that makes an idle source's walsender decode the WAL written so far.

A finished incremental copy ends once the stream is past the WAL position its last chunk read at (every
transaction that chunk saw committed has been streamed). On a source with no other traffic nothing takes the stream
there: the WAL after the last commit (the pruning of pages the chunk read, say) is flushed only when a WAL page
fills, and a logical walsender is woken by commits. The copy would wait for the next commit of someone else's, or
the next record of the server's own (tens of seconds on an idle server). A transaction of the engine's that takes a
transaction id writes a commit record: the WAL writer flushes up to it within ``wal_writer_delay`` (a commit that
wrote nothing else is asynchronous) and the walsender decodes it. It changes no row and needs no privilege. A
standby cannot write and needs none: its WAL position is the replay's.
"""

from __future__ import annotations

from typing import Any

import psycopg

from etl.lsn import Lsn


def nudge_decoding(conn: psycopg.Connection[Any]) -> Lsn:
    """Commit a transaction that holds only a transaction id; the WAL insert position just before its commit, which
    the stream passes once the WAL writer flushed it (``Lsn.ZERO`` on a standby, where there is nothing to do)."""
    row = conn.execute("SELECT pg_catalog.pg_is_in_recovery()").fetchone()
    if row is None or row[0]:
        return Lsn.ZERO
    with conn.transaction():
        conn.execute("SELECT pg_catalog.pg_current_xact_id()")
        inserted = conn.execute("SELECT pg_catalog.pg_current_wal_insert_lsn()::text").fetchone()
    assert inserted is not None
    return Lsn.parse(inserted[0])
