"""Registers the Postgres store with etl (entry point ``etl: postgres``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from etl.api import hookimpl
from etl_store_postgres.store import PostgresStore

if TYPE_CHECKING:
    from etl.api import StoreFactory


@hookimpl
def etl_stores() -> Iterable[type[StoreFactory]]:
    return [PostgresStore]
