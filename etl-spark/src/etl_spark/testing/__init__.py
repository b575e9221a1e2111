"""Test kits of the Spark destinations, not part of the destinations themselves.

This module: helpers for tests of pipelines into DuckLake (read a lake's tables with real DuckDB, compare with
the source; ``etl.testing.copies`` plans a table's copy). ``bigquery_emulator``: a local BigQuery server in its
own virtualenv. ``fault_proxy``: an HTTP proxy that fails chosen requests to it.

Rows come back as dicts sorted like ``etl.testing.compare.source_rows``, with timestamps with a time
zone in UTC and uuids as text on both sides, so a lake table and its source table compare with ``==``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any

from etl.api import TableName
from etl.testing.compare import sort_rows, source_rows

if TYPE_CHECKING:
    import duckdb
    import psycopg


def comparable(value: Any) -> Any:
    """``value`` in the form both sides agree on: aware datetimes in UTC, uuids as text, also in lists."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sort_rows({c: comparable(v) for c, v in row.items()} for row in rows)


def duckdb_rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    """A query's rows as dicts, through Arrow (Python's own time zones, no pytz), sorted for comparison."""
    return sorted_rows(con.execute(sql).to_arrow_table().to_pylist())


def lake_rows(
    con: duckdb.DuckDBPyConnection, table: TableName | str, *, version: int | None = None, alias: str = "lake"
) -> list[dict[str, Any]]:
    """Every row of a lake table as DuckDB reads it (at snapshot ``version`` when given)."""
    name = TableName.parse(table) if isinstance(table, str) else table
    at = f" AT (VERSION => {int(version)})" if version is not None else ""
    return duckdb_rows(con, f"SELECT * FROM {alias}.{name.quoted()}{at}")


def comparable_source_rows(conn: psycopg.Connection[Any], table: TableName | str) -> list[dict[str, Any]]:
    """``source_rows`` with values in ``comparable`` form."""
    return source_rows(conn, table, sorted_rows)


def lake_matches(source: psycopg.Connection[Any], catalog: str, table: TableName | str) -> bool:
    """Whether DuckDB reads ``table`` in the lake of ``catalog`` (read-only) equal to the source's, row for row."""
    from etl_spark.ducklake.reader import open_lake

    expected = comparable_source_rows(source, table)
    con = open_lake(catalog, read_only=True)
    try:
        return lake_rows(con, table) == expected
    finally:
        con.close()


def latest_snapshot(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> int:
    row = con.execute(f"SELECT max(snapshot_id) FROM ducklake_snapshots('{alias}')").fetchone()
    return int(row[0]) if row else 0
