"""Registers the Postgres store with etl (entry point ``etl: postgres``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from etl.plugins import hookimpl
from etl_store_postgres.store import PostgresStore


@hookimpl
def etl_stores() -> Iterable[type[Any]]:
    return [PostgresStore]
