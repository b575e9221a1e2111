"""Snapshot expiry and the files it frees, in the catalog (as DuckDB's ``ducklake_expire_snapshots`` and
``ducklake_cleanup_old_files`` keep them).

Expiring removes the snapshots older than a time, the latest always kept, and the catalog rows only
they could read: data and delete files ended by the oldest snapshot kept (with their statistics), and
inlined rows it no longer sees. Their files go to ``ducklake_files_scheduled_for_deletion``, which
cleanup empties once they have waited there long enough. Neither makes a snapshot: what any kept
snapshot reads does not change. Catalog entries of ended tables, columns and schemas are kept (a few
rows each).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from etl_spark.ducklake.catalog import inlined
from etl_spark.ducklake.catalog.ddl import TABLES, quote
from etl_spark.ducklake.catalog.model import table_directory

_ENDED = "end_snapshot IS NOT NULL AND end_snapshot <= :k"
_CHUNK = 500


def instant(value: Any) -> datetime:
    """A catalog timestamp (a ``datetime``, or the text SQLite holds: DuckDB's or SQLAlchemy's) in UTC."""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def expiring(conn: Connection, before: datetime) -> bool:
    """Whether a snapshot (not the latest) was taken before ``before``."""
    oldest = conn.execute(
        sa.text(
            "SELECT snapshot_time FROM ducklake_snapshot WHERE snapshot_id = (SELECT min(snapshot_id)"
            " FROM ducklake_snapshot) AND snapshot_id < (SELECT max(snapshot_id) FROM ducklake_snapshot)"
        )
    ).scalar()
    return oldest is not None and instant(oldest) < before


def expire_snapshots(conn: Connection, data_path: str, before: datetime) -> int:
    """Expire the snapshots taken before ``before`` (never the latest); how many expired."""
    times = conn.execute(sa.text("SELECT snapshot_id, snapshot_time FROM ducklake_snapshot")).all()
    if not times:
        return 0
    latest = max(int(s) for s, _ in times)
    keep = min(int(s) for s, at in times if int(s) == latest or instant(at) >= before)
    expired = sum(1 for s, _ in times if int(s) < keep)
    if not expired:
        return 0
    k = {"k": keep}
    directories = table_directories(conn, data_path)
    freed = [
        (int(r.file_id), directories.get(int(r.table_id), "") + r.path if r.path_is_relative else r.path)
        for r in conn.execute(
            sa.text(
                "SELECT data_file_id AS file_id, table_id, path, path_is_relative FROM ducklake_data_file"
                f" WHERE {_ENDED}"
                " UNION ALL SELECT delete_file_id, table_id, path, path_is_relative FROM ducklake_delete_file"
                f" WHERE {_ENDED} OR data_file_id IN (SELECT data_file_id FROM ducklake_data_file WHERE {_ENDED})"
            ),
            k,
        )
    ]
    schedule(conn, data_path, freed)
    ended_files = f"(SELECT data_file_id FROM ducklake_data_file WHERE {_ENDED})"
    conn.execute(sa.text(f"DELETE FROM ducklake_delete_file WHERE {_ENDED} OR data_file_id IN {ended_files}"), k)
    conn.execute(sa.text(f"DELETE FROM ducklake_file_column_stats WHERE data_file_id IN {ended_files}"), k)
    conn.execute(sa.text(f"DELETE FROM ducklake_data_file WHERE {_ENDED}"), k)
    for (name,) in conn.execute(sa.text(f"SELECT table_name FROM {inlined.REGISTRY}")).all():
        conn.execute(sa.text(f"DELETE FROM {quote(name)} WHERE {_ENDED}"), k)
    for table in ("ducklake_snapshot_changes", "ducklake_snapshot"):
        conn.execute(sa.text(f"DELETE FROM {table} WHERE snapshot_id < :k"), k)
    return expired


def table_directories(conn: Connection, data_path: str) -> dict[int, str]:
    """Every table's directory, dropped tables' too, by table id (absolute, ending in ``/``)."""
    rows = conn.execute(
        sa.text(
            "SELECT t.table_id, t.path, t.path_is_relative, s.path AS spath, s.path_is_relative AS srel"
            " FROM ducklake_table t JOIN ducklake_schema s ON s.schema_id = t.schema_id ORDER BY t.begin_snapshot"
        )
    ).all()
    return {int(r.table_id): table_directory(data_path, r.spath, r.srel, r.path, r.path_is_relative) for r in rows}


def schedule(conn: Connection, data_path: str, files: Iterable[tuple[int, str]]) -> None:
    """Schedule files (id, absolute path) for deletion, with paths under the data path recorded relative to it."""
    now = datetime.now(UTC)
    rows = [
        {
            "data_file_id": file_id,
            "path": path.removeprefix(data_path),
            "path_is_relative": path.startswith(data_path),
            "schedule_start": now,
        }
        for file_id, path in files
    ]
    if rows:
        conn.execute(sa.insert(TABLES["ducklake_files_scheduled_for_deletion"]), rows)


def scheduled(conn: Connection, data_path: str, before: datetime) -> list[tuple[int, str]]:
    """The files scheduled for deletion before ``before``: id and absolute path."""
    rows = conn.execute(
        sa.text(
            "SELECT data_file_id, path, path_is_relative, schedule_start FROM ducklake_files_scheduled_for_deletion"
        )
    ).all()
    return [
        (int(r.data_file_id), data_path + r.path if r.path_is_relative else r.path)
        for r in rows
        if instant(r.schedule_start) < before
    ]


def unschedule(conn: Connection, file_ids: Sequence[int]) -> None:
    """Forget scheduled files (deleted)."""
    for start in range(0, len(file_ids), _CHUNK):
        chunk = list(file_ids[start : start + _CHUNK])
        conn.execute(
            sa.text("DELETE FROM ducklake_files_scheduled_for_deletion WHERE data_file_id IN :ids").bindparams(
                sa.bindparam("ids", expanding=True)
            ),
            {"ids": chunk},
        )


def known_files(conn: Connection, data_path: str, table_ids: Sequence[int]) -> set[str]:
    """The absolute paths of the files the catalog knows of these tables (data and delete files of any
    snapshot), and of every file scheduled for deletion."""
    directories = table_directories(conn, data_path)
    known = {
        directories.get(int(r.table_id), "") + r.path if r.path_is_relative else r.path
        for r in conn.execute(
            sa.text(
                "SELECT table_id, path, path_is_relative FROM ducklake_data_file WHERE table_id IN :t"
                " UNION ALL SELECT table_id, path, path_is_relative FROM ducklake_delete_file WHERE table_id IN :t"
            ).bindparams(sa.bindparam("t", expanding=True)),
            {"t": list(table_ids)},
        )
    }
    known.update(path for _, path in scheduled(conn, data_path, datetime.max.replace(tzinfo=UTC)))
    return known
