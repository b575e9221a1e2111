"""A durable etl state store in one SQLite file."""

from etl_store_sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
