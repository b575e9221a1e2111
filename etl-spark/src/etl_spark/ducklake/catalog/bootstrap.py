"""A new lake's first rows (as DuckDB's ``ATTACH`` writes them), and the checks an existing lake must pass."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from etl.api import DestinationError
from etl_spark.ducklake.catalog.ddl import SPEC_VERSION, TABLES, create_statements, quote


def create_lake(conn: Connection, data_path: str, author: str) -> None:
    """Create the DuckLake tables and snapshot 0, which creates the ``main`` schema."""
    for statement in create_statements(conn.dialect.name):
        conn.exec_driver_sql(statement)
    metadata = {
        "version": SPEC_VERSION,
        "created_by": "etl-spark",
        "data_path": data_path,
        "encrypted": "false",
        "data_inlining_row_limit": "0",
    }
    conn.execute(sa.insert(TABLES["ducklake_metadata"]), [{"key": k, "value": v} for k, v in metadata.items()])
    conn.execute(
        sa.insert(TABLES["ducklake_snapshot"]).values(
            snapshot_id=0, snapshot_time=datetime.now(UTC), schema_version=0, next_catalog_id=1, next_file_id=0
        )
    )
    conn.execute(
        sa.insert(TABLES["ducklake_snapshot_changes"]).values(
            snapshot_id=0, changes_made=f"created_schema:{quote('main')}", author=author
        )
    )
    conn.execute(
        sa.insert(TABLES["ducklake_schema"]).values(
            schema_id=0,
            schema_uuid=str(uuid.uuid4()),
            begin_snapshot=0,
            schema_name="main",
            path="main/",
            path_is_relative=True,
        )
    )


def check_lake(conn: Connection, data_path: str, catalog: str) -> str:
    """Check the lake is an unencrypted DuckLake 1.0 lake whose data lives at ``data_path``; return its data path
    (ending in ``/``). A lake DuckDB created without ``data_inlining_row_limit`` gets it set to 0, since this
    writer's scans do not see inlined rows. ``catalog`` names the catalog in messages."""
    rows = conn.execute(sa.text("SELECT key, value FROM ducklake_metadata WHERE scope IS NULL")).all()
    metadata = {k: v for k, v in rows}
    version = metadata.get("version")
    if version != SPEC_VERSION:
        raise DestinationError(
            f"the DuckLake catalog {catalog} has specification version {version!r};"
            f" this writer supports {SPEC_VERSION!r} only",
            hint="migrate the lake with DuckDB 1.5 (ATTACH it once with the ducklake extension) or use a new catalog",
            transient=False,
        )
    if metadata.get("encrypted", "false") != "false":
        raise DestinationError(
            "the DuckLake lake is encrypted", hint="this writer supports unencrypted lakes only", transient=False
        )
    if "data_inlining_row_limit" not in metadata:
        conn.execute(sa.insert(TABLES["ducklake_metadata"]).values(key="data_inlining_row_limit", value="0"))
    found = metadata.get("data_path", data_path)
    if found.rstrip("/") != data_path.rstrip("/"):
        raise DestinationError(
            f"the DuckLake catalog keeps its data at {found}, but data_path is {data_path}",
            hint="set data_path to the lake's data path",
            transient=False,
        )
    return str(found) if found.endswith("/") else f"{found}/"
