"""Names of the replication slots a pipeline owns."""

from __future__ import annotations

from typing import Any

import psycopg

from etl.schema import TableId


def apply_slot(pipeline_id: int) -> str:
    return f"etl_apply_{pipeline_id}"


def table_sync_slot(pipeline_id: int, table_id: TableId) -> str:
    return f"etl_sync_{pipeline_id}_{table_id}"


def slot_prefix(pipeline_id: int) -> tuple[str, str]:
    """Prefixes that identify every slot of a pipeline (for cleanup and ``etl status``)."""
    return f"etl_apply_{pipeline_id}", f"etl_sync_{pipeline_id}_"


def pipeline_slots(conn: psycopg.Connection[Any], pipeline_id: int) -> list[str]:
    """The names of the pipeline's slots on the source (``starts_with``: ``_`` is a wildcard to ``LIKE``)."""
    apply_name, sync_prefix = slot_prefix(pipeline_id)
    rows = conn.execute(
        "SELECT slot_name FROM pg_catalog.pg_replication_slots WHERE slot_name = %s OR starts_with(slot_name, %s)"
        " ORDER BY 1",
        (apply_name, sync_prefix),
    ).fetchall()
    return [str(row[0]) for row in rows]
