"""What the store contract's tests write: table ids, schemas, states, metadata, copy progress and activity."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from etl.lsn import Lsn
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl.store.base import (
    CopyProgress,
    DestinationSchemaStatus,
    DestinationTableMetadata,
    RetryKind,
    Store,
    TableActivity,
    TableState,
    TableStateKind,
)

MakeStore = Callable[..., Store]
"""``make_store(pipeline_id: int = 1) -> Store``."""

T1, T2, T3 = 16384, 16390, 4_294_967_295  # table ids (relation OIDs; the last is the largest OID)


def make_schema(table_id: int, lsn: int, *, columns: int = 2, name: str = "items") -> TableSchema:
    """A schema version whose every field differs from its default."""
    cols = [
        ColumnSchema(
            "id",
            20,
            -1,
            nullable=False,
            primary_key=True,
            type_name="bigint",
            attnum=1,
            default="nextval('s'::regclass)",
        )
    ]
    cols += [
        ColumnSchema(
            f"c{i}",
            1043,
            68,
            nullable=bool(i % 2),
            primary_key=False,
            type_name="character varying(64)",
            attnum=i + 2,
            default=f"'d{i}'::character varying" if i % 2 else None,
        )
        for i in range(1, columns)
    ]
    return TableSchema(table_id, TableName("sales", f"{name}_{table_id}"), tuple(cols), ReplicaIdentity.FULL, Lsn(lsn))


def sample_states() -> dict[int, TableState]:
    """One state of each shape: plain, with an LSN, errored with every field."""
    return {
        T1: TableState(TableStateKind.DATA_SYNC),
        T2: TableState(TableStateKind.SYNC_DONE, Lsn(0xFFFF_FFFF_0000_0001)),
        T3: TableState.errored(
            "value out of range in column c1",
            hint="widen the column, then run `etl resync`",
            retry=RetryKind.TIMED,
            retry_at=datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2))),
        ),
    }


def sample_metadata() -> DestinationTableMetadata:
    return DestinationTableMetadata(
        "sales_items",
        Lsn(0x1_0000_0000),
        DestinationSchemaStatus.APPLYING,
        {"columns": {"id": 1, "c1": 2}, "files": ["a.parquet", "b.parquet"], "ratio": 0.5, "note": "ü", "none": None},
    )


RESUME_AFTER = '{"after": 9223372036854775807, "position": "FFFFFFFF/FFFFFFFE", "ordinal": 1099511627776}'
"""An incremental copy's position (JSON text; the store keeps it as given)."""


def sample_copy_progress(rows: int = 1234, *, finished: bool = False) -> CopyProgress:
    """A copy's progress with times in a zone other than UTC (stores give them back in UTC), and an incremental
    copy's position."""
    started = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=-5)))
    recorded = started + timedelta(seconds=61, microseconds=5)
    return CopyProgress(rows, 2**40 + 7, started, recorded, finished, RESUME_AFTER)


def sample_activity(inserts: int = 5, *, truncates: int = 0) -> TableActivity:
    """A table's activity with times in a zone other than UTC (stores give them back in UTC)."""
    since = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    return TableActivity(inserts, 2**40, 0, truncates, since, since + timedelta(minutes=5, microseconds=3))
