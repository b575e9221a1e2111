"""Test kits of the Spark destinations, not part of the destinations themselves.

This module: helpers for tests of pipelines into DuckLake (plan a table's copy, read a lake's tables with real
DuckDB, compare with the source). ``bigquery_emulator``: a local BigQuery server in its own virtualenv.
``fault_proxy``: an HTTP proxy that fails chosen requests to it.

Rows come back as dicts sorted like ``etl.testing.compare.source_rows``, with timestamps with a time
zone in UTC and uuids as text on both sides, so a lake table and its source table compare with ``==``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any

from etl.destination.memory import sort_rows
from etl.postgres.catalog import publication_tables, table_schema
from etl.postgres.connection import connect
from etl.postgres.copy import CopyPlan, plan_copy
from etl.schema import TableName
from etl.testing.compare import source_rows

if TYPE_CHECKING:
    import duckdb
    import psycopg

    from etl.testing.pytest_plugin import TestDatabase


def published_plan(db: TestDatabase, setup: str, parts: int, publication: str = "pub") -> CopyPlan:
    """Run ``setup`` (SQL that makes a table and ``publication`` of it), then plan the table's copy in up to
    ``parts`` ranges per source table (per leaf of a partitioned one), without a snapshot."""
    db.execute(setup)
    with connect(db.connection()) as conn:
        (table,) = publication_tables(conn, publication)
        schema = table_schema(conn, table.id, table.column_list)
    return plan_copy(db.connection(), schema, table, None, parts)


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


def latest_snapshot(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> int:
    row = con.execute(f"SELECT max(snapshot_id) FROM ducklake_snapshots('{alias}')").fetchone()
    return int(row[0]) if row else 0
