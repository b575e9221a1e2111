"""Registers the SQLite store with etl (entry point ``etl: sqlite``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from etl.plugins import hookimpl
from etl_store_sqlite.store import SqliteStore


@hookimpl
def etl_stores() -> Iterable[type[Any]]:
    return [SqliteStore]
