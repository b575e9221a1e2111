"""Capture real pgoutput payloads for tests through the SQL decoding functions (test-only; the engine never polls)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import psycopg

from etl.testing.pytest_plugin import TestDatabase

_counter = itertools.count()

Workload = Callable[[psycopg.Connection[Any]], object]  # what it returns is ignored


def capture(
    database: TestDatabase, workload: Workload, *, proto_version: int = 1, streaming: bool = False, setup: str = ""
) -> list[bytes]:
    """Run ``workload`` on a fresh slot of ``database`` (the ``pg_database`` fixture) and return the payloads.

    ``setup`` runs before the slot exists (DDL, publication ``p`` must be created there or here by default).
    With ``streaming``, large transactions are streamed: ``logical_decoding_work_mem`` is 64kB, and on
    Postgres 16+ every change is streamed at once so that already-aborted transactions still stream
    (newer servers skip streaming a transaction they know has aborted).
    """
    slot = f"capture_{next(_counter)}"
    with database.connect(options="-c synchronous_commit=on") as conn:
        if setup:
            conn.execute(setup)
        if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = 'p'").fetchone():
            conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            workload(conn)
            # Abort records are not flushed and decoding stops at the flushed WAL: a synchronous
            # commit that writes WAL (a temp table is never published) flushes everything before it.
            conn.execute(f"CREATE TEMP TABLE wal_flush_{slot} ()")
            options = ["proto_version", str(proto_version), "publication_names", "p", "messages", "true"]
            if streaming:
                options += ["streaming", "on"]
                conn.execute("SET logical_decoding_work_mem = '64kB'")
                if database.major >= 16:
                    conn.execute("SET debug_logical_replication_streaming = immediate")
            rows = conn.execute(
                "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, VARIADIC %s::text[])",
                (slot, options),
            ).fetchall()
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return [bytes(row[0]) for row in rows]
