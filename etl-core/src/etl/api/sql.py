"""The plugin API for stores kept in a SQL database through SQLAlchemy (``etl-core[sql]``): the store that
``etl-store-sqlite`` and ``etl-store-postgres`` build on, its migrations, the runner that applies
numbered migrations (the DuckLake catalog's too), and the migrations' error text."""

from etl.store.migrations import MIGRATIONS, Migration, apply_migrations, driver_message
from etl.store.sql import SqlStore

__all__ = ["MIGRATIONS", "Migration", "SqlStore", "apply_migrations", "driver_message"]
