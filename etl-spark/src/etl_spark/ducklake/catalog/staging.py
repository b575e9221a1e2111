"""The files a pipeline writes for a source transaction it has not committed yet.

A transaction larger than a batch is written part by part into files that no snapshot references
(``open_transaction``), and registered all at once when it commits. Before each write job its file name prefix
is recorded here, in a catalog transaction of its own, and so is a marker of the transaction before its first file.
The commit that registers the files removes the marker; the records go once the files no snapshot took are removed.
A pipeline that dies in between leaves files that only these records name, and its next start removes the ones
no snapshot references (``remove_staged``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from etl_spark.ducklake.catalog.ddl import STAGED_TABLE, TABLES


@dataclass(frozen=True)
class StagedPrefix:
    """The files of one write job for an open transaction: those named ``directory + prefix...``."""

    table_id: int
    directory: str
    prefix: str


def record(conn: Connection, pipeline_id: int, staged: StagedPrefix) -> None:
    row = {"pipeline_id": int(pipeline_id), "table_id": staged.table_id, "directory": staged.directory}
    conn.execute(sa.insert(TABLES[STAGED_TABLE]), {**row, "prefix": staged.prefix})


def recorded(conn: Connection, pipeline_id: int) -> list[StagedPrefix]:
    rows = conn.execute(
        sa.text(f"SELECT table_id, directory, prefix FROM {STAGED_TABLE} WHERE pipeline_id = :p ORDER BY prefix"),
        {"p": int(pipeline_id)},
    ).all()
    return [StagedPrefix(int(r.table_id), str(r.directory), str(r.prefix)) for r in rows]


def forget(conn: Connection, pipeline_id: int, prefix: str | None = None) -> int:
    """Forget the pipeline's records (``prefix``: that one only); how many there were."""
    where, params = "pipeline_id = :p", dict[str, object](p=int(pipeline_id))
    if prefix is not None:
        where, params["prefix"] = f"{where} AND prefix = :prefix", prefix
    return int(conn.execute(sa.text(f"DELETE FROM {STAGED_TABLE} WHERE {where}"), params).rowcount)
