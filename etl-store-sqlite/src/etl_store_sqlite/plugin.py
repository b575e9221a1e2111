"""Registers the SQLite store with etl (entry point ``etl: sqlite``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from etl.api import hookimpl
from etl_store_sqlite.store import SqliteStore

if TYPE_CHECKING:
    from etl.api import StoreFactory


@hookimpl
def etl_stores() -> Iterable[type[StoreFactory]]:
    return [SqliteStore]
