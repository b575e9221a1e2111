"""The plugin API for stores kept in a SQL database through SQLAlchemy (``etl-core[sql]``): the store that
``etl-store-sqlite`` and ``etl-store-postgres`` build on, and its migrations' error text."""

from etl.store.migrations import MIGRATIONS, Migration, driver_message
from etl.store.sql import SqlStore

__all__ = ["MIGRATIONS", "Migration", "SqlStore", "driver_message"]
