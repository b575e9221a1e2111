"""A durable etl state store in a schema of a Postgres database."""

from etl_store_postgres.store import PostgresStore, PostgresStoreConfig

__all__ = ["PostgresStore", "PostgresStoreConfig"]
