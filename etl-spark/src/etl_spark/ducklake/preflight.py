"""``etl check``'s lines for the DuckLake destination: the catalog, the data path and Java, as the run opens them.

Nothing is created: a SQLite catalog's directory is checked, a Postgres catalog is connected to, and a local
data path gets a probe file written and removed. A remote data path (``s3://``...) gets its probe with
``etl check --deep``, which also runs a Spark job.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from etl.api import Check, file_to_create, writable_directory
from etl_spark.ducklake.catalog.engine import masked, redacted
from etl_spark.ducklake.parquet_files import filesystem
from etl_spark.session import SparkSettings, java_check, spark_check

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


def remote_data_path_check(data_path: str) -> list[Check]:
    """A probe file written under a remote data path (``s3://``...) and removed, with pyarrow's file system and
    the credentials of the environment, as the run writes there; nothing for a local path (``preflight``)."""
    if "://" not in data_path or data_path.startswith("file://"):
        return []
    try:
        fs, root = filesystem(data_path)
        probe = f"{root}_etl_check_{uuid.uuid4().hex}"
        with fs.open_output_stream(probe) as out:
            out.write(b"")
        fs.delete_file(probe)
    except Exception as exc:
        return [
            Check(
                "ducklake data path write",
                False,
                f"cannot write into {data_path}: {type(exc).__name__}: {exc}",
                "check the bucket and the credentials in the environment (AWS_*, GOOGLE_APPLICATION_CREDENTIALS...)",
            )
        ]
    return [Check("ducklake data path write", True, f"wrote and removed a probe in {data_path}")]


def deep_preflight(data_path: str, spark: SparkSettings, extra: dict[str, str]) -> list[Check]:
    return [spark_check(spark, extra), *remote_data_path_check(data_path)]
