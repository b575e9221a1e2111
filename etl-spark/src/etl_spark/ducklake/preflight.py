"""``etl check``'s lines for the DuckLake destination: the catalog, the data path and Java, as the run opens them.

Nothing is created: a SQLite catalog's directory is checked, a Postgres catalog is connected to, and a local
data path gets a probe file written and removed. A remote data path (``s3://``...) is left to the run.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from etl.preflight import Check, file_to_create, writable_directory
from etl_spark.ducklake.catalog.engine import masked, redacted
from etl_spark.session import java_check

CONNECT_TIMEOUT_S = 10


def catalog_check(url: str) -> Check:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return file_to_create("ducklake catalog", Path(parsed.database or ""))
    libpq = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(libpq, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return Check(
            "ducklake catalog",
            False,
            f"cannot connect to {redacted(url)}: {masked(str(exc).strip(), url)}",
            "check the catalog URL (host, port, database, user, password) and that the server is running",
        )
    return Check("ducklake catalog", True, f"{redacted(url)} is reachable")


def data_path_checks(data_path: str) -> list[Check]:
    if data_path.startswith("file://"):
        data_path = data_path.removeprefix("file://")
    elif "://" in data_path:
        return []
    return [writable_directory("ducklake data path", Path(data_path))]


def preflight(catalog: str, data_path: str) -> list[Check]:
    return [catalog_check(catalog), *data_path_checks(data_path), java_check()]
