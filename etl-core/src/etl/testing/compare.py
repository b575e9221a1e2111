"""Reading a source table back in the shape the memory destination returns, for comparisons."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader

from etl.destination.memory import sort_rows

__all__ = ["sort_rows", "source_rows"]
from etl.schema import TableName

TEXT_TYPES = ("json", "jsonb", "uuid", "inet", "cidr", "macaddr", "macaddr8", "money", "timetz")

Rows = list[dict[str, Any]]

_last: dict[tuple[str, str, Callable[[Rows], Rows]], tuple[tuple[Any, ...], Rows]] = {}
"""The last read of each table of the last database read, by table and shape, with the fingerprint then."""
_last_lock = threading.Lock()


def source_rows(
    conn: psycopg.Connection[Any], table: TableName | str, shape: Callable[[Rows], Rows] = sort_rows
) -> Rows:
    """Every row of a source table as dicts (psycopg's Python values), put in order by ``shape`` (by default as
    ``MemoryDestination.rows`` orders them).

    Tests poll this until a destination equals the source, often long after the source stopped changing. So
    a table is read again only when its fingerprint (columns, row count and a sum of row hashes, worked out
    by Postgres in the same snapshot as the read) differs from the last read's; otherwise the result is a
    new list of the last read's rows.
    """
    name = TableName.parse(table) if isinstance(table, str) else table
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:  # no snapshot of our own to tie them together
        return shape(_read(conn, name))
    key = (conn.info.dsn, str(name), shape)
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        found = conn.execute(  # oid = oid: no operator a role planted outmatches pg_catalog's
            "SELECT (SELECT string_agg(attname || ' ' || atttypid, ',' ORDER BY attnum) FROM pg_catalog.pg_attribute"
            "  WHERE attrelid = %s::regclass::oid AND attnum > 0 AND NOT attisdropped),"
            f" count(*), sum(hashtextextended(t::text, 0)) FROM {name.quoted()} t",
            (name.quoted(),),
        ).fetchone()
        fingerprint = tuple(found or ())
        with _last_lock:
            last = _last.get(key)
        if last is not None and last[0] == fingerprint:
            return list(last[1])
        rows = shape(_read(conn, name))
    with _last_lock:
        for other in [k for k in _last if k[0] != key[0]]:  # a test reads one database: keep no other's rows
            del _last[other]
        _last[key] = (fingerprint, rows)
    return list(rows)


def _read(conn: psycopg.Connection[Any], name: TableName) -> Rows:
    with conn.cursor(row_factory=dict_row) as cur:
        for type_name in TEXT_TYPES:  # the types the Arrow mapping keeps as their text form
            cur.adapters.register_loader(type_name, TextLoader)
        return cur.execute(f"SELECT * FROM {name.quoted()}").fetchall()
