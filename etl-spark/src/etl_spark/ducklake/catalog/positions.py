"""Where the lake stands in a pipeline's stream: the source position each batch brought it to.

Every batch the pipeline writes moves the store's progress to the batch's end (the end of the last transaction
it holds) once the lake has it. The lake records that position too, in the same catalog transaction as the
batch's snapshot (or alone, for a batch that changes no table): in ``etl_ducklake_positions`` (the latest, per
pipeline, with the snapshot that holds it) and in the snapshot's ``commit_message`` and ``commit_extra_info``,
where ``ducklake_snapshots()`` shows them. So the lake's position is never behind the store's, and a lake that
is (a catalog restored from an older backup, say) is found at the start instead of having the changes between
skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from etl.api import DestinationError, Lsn
from etl_spark.ducklake.catalog.ddl import POSITION_TABLE, TABLES
from etl_spark.ducklake.catalog.engine import engine_for, masked, redacted


@dataclass(frozen=True)
class LakePosition:
    """A pipeline's position in the lake: the stream's end of the last batch written, and the latest snapshot
    that holds a change of it (every snapshot after it, up to the next one of this pipeline, stands there too)."""

    lsn: Lsn
    snapshot_id: int


def commit_info(pipeline_id: int, lsn: Lsn, consistent: bool = False) -> dict[str, str]:
    """The ``ducklake_snapshot_changes`` columns that say where a snapshot of a batch stands, and whether it holds a
    state the source had (``consistent``: every table of the pipeline ready, the batch ending at a commit)."""
    extra = {"pipeline_id": int(pipeline_id), "lsn": str(lsn), "lsn_int": int(lsn), "consistent": consistent}
    return {
        "commit_message": f"etl pipeline {int(pipeline_id)}: the source through {lsn}",
        "commit_extra_info": json.dumps(extra, separators=(",", ":")),
    }


def record(conn: Connection, pipeline_id: int, lsn: Lsn, snapshot_id: int | None) -> None:
    """Record ``lsn`` as the pipeline's position, unless it is past it already (a batch replayed after a crash
    may end earlier than the one it repeats); ``snapshot_id`` is the snapshot holding it, ``None`` to keep the one
    recorded (a batch that changed no table), else the latest."""
    now = recorded(conn, pipeline_id)
    if now is not None and now.lsn >= lsn:
        return
    snapshot = snapshot_id if snapshot_id is not None else now.snapshot_id if now is not None else None
    if snapshot is None:
        snapshot = int(conn.execute(sa.text("SELECT max(snapshot_id) FROM ducklake_snapshot")).scalar_one())
    row = {"pipeline_id": int(pipeline_id), "commit_lsn": int(lsn), "snapshot_id": int(snapshot)}
    if now is None:
        conn.execute(sa.insert(TABLES[POSITION_TABLE]), row)
    else:
        conn.execute(
            sa.text(
                f"UPDATE {POSITION_TABLE} SET commit_lsn = :commit_lsn, snapshot_id = :snapshot_id"
                " WHERE pipeline_id = :pipeline_id"
            ),
            row,
        )


def recorded(conn: Connection, pipeline_id: int) -> LakePosition | None:
    """The pipeline's recorded position; ``None`` before its first batch (or in a lake of an earlier release)."""
    row = conn.execute(
        sa.text(f"SELECT commit_lsn, snapshot_id FROM {POSITION_TABLE} WHERE pipeline_id = :p"),
        {"p": int(pipeline_id)},
    ).one_or_none()
    return None if row is None else LakePosition(Lsn(int(row.commit_lsn)), int(row.snapshot_id))


READ_TIMEOUT_S = 10
"""How long ``read_position`` waits for a Postgres catalog to answer a connection (``etl status``)."""


def read_position(url: str, pipeline_id: int) -> LakePosition | None:
    """The pipeline's recorded position in the catalog at ``url``, read without opening the lake (no migration, no
    file created); ``None`` when the catalog, its position table or the pipeline's row is not there yet."""
    engine = engine_for(url, connect_timeout=READ_TIMEOUT_S)
    try:
        if engine.dialect.name == "sqlite" and not Path(engine.url.database or "").is_file():
            return None
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(POSITION_TABLE):
                return None
            return recorded(conn, pipeline_id)
    except (sa.exc.SQLAlchemyError, OSError) as exc:
        raise DestinationError(
            f"cannot read the DuckLake catalog {redacted(url)}: {masked(str(getattr(exc, 'orig', None) or exc), url)}",
            hint="check that the catalog database exists and is reachable with these credentials",
        ) from None
    finally:
        engine.dispose()
