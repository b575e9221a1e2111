"""Copy plans of test databases' tables, for tests of destinations that copy tables themselves (``TableCopier``)."""

from __future__ import annotations

from etl.copy_plan import CopyPlan
from etl.postgres.catalog import publication_tables, table_schema
from etl.postgres.connection import connect
from etl.postgres.copy import plan_copy
from etl.testing.pytest_plugin import TestDatabase


def published_plan(db: TestDatabase, setup: str, parts: int, publication: str = "pub") -> CopyPlan:
    """Run ``setup`` (SQL that makes a table and ``publication`` of it), then plan the table's copy in up to
    ``parts`` ranges per source table (per leaf of a partitioned one), without a snapshot."""
    db.execute(setup)
    with connect(db.connection()) as conn:
        (table,) = publication_tables(conn, publication)
        schema = table_schema(conn, table.id, table.column_list)
    return plan_copy(db.connection(), schema, table, None, parts)
