"""Names of the replication slots a pipeline owns."""

from __future__ import annotations

from etl.schema import TableId


def apply_slot(pipeline_id: int) -> str:
    return f"etl_apply_{pipeline_id}"


def table_sync_slot(pipeline_id: int, table_id: TableId) -> str:
    return f"etl_sync_{pipeline_id}_{table_id}"


def slot_prefix(pipeline_id: int) -> tuple[str, str]:
    """Prefixes that identify every slot of a pipeline (for cleanup and ``etl status``)."""
    return f"etl_apply_{pipeline_id}", f"etl_sync_{pipeline_id}_"
