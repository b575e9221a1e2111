"""Reading a source table back in the shape the memory destination returns, for comparisons."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader

from etl.destination.memory import sort_rows
from etl.schema import TableName

TEXT_TYPES = ("json", "jsonb", "uuid", "inet", "cidr", "macaddr", "macaddr8", "money", "timetz")


def source_rows(conn: psycopg.Connection[Any], table: TableName | str) -> list[dict[str, Any]]:
    """Every row of a source table as dicts (psycopg's Python values), sorted like ``MemoryDestination.rows``."""
    name = TableName.parse(table) if isinstance(table, str) else table
    with conn.cursor(row_factory=dict_row) as cur:
        for type_name in TEXT_TYPES:  # the types the Arrow mapping keeps as their text form
            cur.adapters.register_loader(type_name, TextLoader)
        rows = cur.execute(f"SELECT * FROM {name.quoted()}").fetchall()
    return sort_rows(rows)
