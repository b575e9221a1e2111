"""Fixtures for etl-spark: one Spark session per test session, lakes on SQLite and Postgres catalogs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from etl.destination.base import DestinationContext
from etl.events import (
    COMMIT_LSN_COLUMN,
    MISSING,
    MISSING_COLUMN,
    OLD_COLUMN,
    OLD_IS_KEY_COLUMN,
    OP_COLUMN,
    TX_ORDINAL_COLUMN,
    DeleteEvent,
    Event,
    EventBatch,
    InsertEvent,
    RelationEvent,
    TableChanges,
    TruncateEvent,
    UpdateEvent,
)
from etl.lsn import Lsn
from etl.schema import ColumnSchema, TableSchema
from etl.store.memory import MemoryStore
from etl.testing.pytest_plugin import first_major_only
from etl_spark.ducklake.destination import SPARK_CONF, DuckLakeConfig, DuckLakeDestination
from etl_spark.ducklake.reader import connect_duckdb
from etl_spark.ducklake.types import numeric_precision_scale
from etl_spark.session import SparkSettings, get_spark, stop_spark


@dataclass
class Lake:
    """Where a test lake lives, and a real DuckDB (ducklake extension from PyPI, loaded offline) to read it."""

    url: str
    data_path: str
    duckdb_target: str

    def duckdb(self) -> duckdb.DuckDBPyConnection:
        con = self.duckdb_bare()
        con.execute(f"ATTACH 'ducklake:{self.duckdb_target}' AS lake")
        return con

    def duckdb_bare(self) -> duckdb.DuckDBPyConnection:
        """DuckDB with the ducklake, sqlite and postgres extensions loaded, nothing attached."""
        return connect_duckdb("sqlite", "postgres")

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        con = self.duckdb()
        try:
            return con.execute(sql, params or []).fetchall()
        finally:
            con.close()


SPARK = SparkSettings(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"})


@pytest.fixture(scope="session")
def _spark_session() -> Iterator[None]:
    yield
    stop_spark()


@pytest.fixture
def spark(_spark_session: None) -> Any:
    """The running Spark session, started when none runs: a test module of tests/ may have stopped the
    session to start one with another master (one session per process)."""
    return get_spark(SPARK, SPARK_CONF)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A SQLite-catalog case does not depend on the Postgres major: run it with the first major only."""
    first_major_only(config, items, lambda _, params: params.get("lake") == "sqlite")


@pytest.fixture(params=["sqlite", "postgres"])
def lake(request: pytest.FixtureRequest, tmp_path: Path, spark: Any, pg_major: int) -> Iterator[Lake]:
    """A lake location: catalog URL (SQLite file or a fresh Postgres database) and a data directory."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/catalog.sqlite"
        duckdb_target = f"sqlite:{tmp_path}/catalog.sqlite"
    else:
        db = request.getfixturevalue("pg_database")
        conn = db.connection()
        url = f"postgresql://{conn.user}@{conn.host}:{conn.port}/{conn.database}"
        duckdb_target = f"postgres:host={conn.host} port={conn.port} dbname={conn.database} user={conn.user}"
    yield Lake(url, str(tmp_path / "data") + "/", duckdb_target)


_STARTED: list[DuckLakeDestination] = []


def make_destination(lake: Lake, pipeline_id: int = 1, **options: Any) -> DuckLakeDestination:
    """A started destination; the end of the test shuts it down (its upkeep thread, planners, catalog)."""
    base = {"catalog": lake.url, "data_path": lake.data_path, "spark": SPARK.model_dump()}
    config = DuckLakeConfig.model_validate({**base, **options})
    destination = DuckLakeDestination.from_config(config, DestinationContext(pipeline_id, MemoryStore(pipeline_id)))
    destination.startup()
    _STARTED.append(destination)
    return destination


@pytest.fixture(autouse=True)
def _shut_destinations_down() -> Iterator[None]:
    yield
    while _STARTED:
        _STARTED.pop().shutdown()


# Arrow types the engine's codecs produce per Postgres type OID (etl/postgres/codecs.py).
ARROW_BY_OID: dict[int, pa.DataType] = {
    16: pa.bool_(),
    21: pa.int16(),
    23: pa.int32(),
    20: pa.int64(),
    701: pa.float64(),
    25: pa.string(),
    1082: pa.date32(),
    1083: pa.time64("us"),
    1114: pa.timestamp("us"),
    1184: pa.timestamp("us", tz="UTC"),
    1186: pa.month_day_nano_interval(),
    17: pa.binary(),
    3802: pa.string(),
    2950: pa.string(),
    1007: pa.list_(pa.int32()),
    1009: pa.list_(pa.string()),
    2951: pa.list_(pa.string()),
}


def arrow_type(column: ColumnSchema) -> pa.DataType:
    if column.type_oid == 1700:
        precision, scale = numeric_precision_scale(column.type_modifier)
        return pa.decimal128(precision, scale) if precision is not None else pa.string()
    return ARROW_BY_OID[column.type_oid]


def rows_table(schema: TableSchema, rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table(
        {c.name: pa.array([r.get(c.name) for r in rows], arrow_type(c)) for c in schema.columns},
    )


class BatchBuilder:
    """Builds an EventBatch twice over, as the engine does: Arrow change tables and the matching events."""

    def __init__(self, lsn: int = 0x1000) -> None:
        self.lsn = lsn
        self.ordinal = 0
        self._changes: list[tuple[TableSchema, dict[str, Any] | None]] = []
        self._events: list[Event] = []
        self._relation: dict[int, TableSchema] = {}

    def commit(self) -> BatchBuilder:
        """Start the next transaction."""
        self.lsn += 0x100
        self.ordinal = 0
        return self

    def _position(self) -> dict[str, Any]:
        self.ordinal += 1
        return {"start_lsn": Lsn(self.lsn), "commit_lsn": Lsn(self.lsn), "tx_ordinal": self.ordinal}

    def _add(
        self,
        schema: TableSchema,
        *,
        op: str,
        row: dict[str, Any],
        old: dict[str, Any] | None,
        old_is_key: bool,
        missing: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        if self._relation.get(schema.id) != schema:
            self._relation[schema.id] = schema
            self._events.append(RelationEvent(**self._position(), schema=schema))
            self.ordinal -= 1
        position = self._position()
        self._changes.append(
            (schema, {"op": op, "row": row, "old": old, "old_is_key": old_is_key, "missing": list(missing), **position})
        )
        return position

    def relation(self, schema: TableSchema) -> BatchBuilder:
        """A schema version with no change of its own in the batch (the DDL trigger reports one at the DDL)."""
        self._relation[schema.id] = schema
        self._events.append(RelationEvent(**self._position(), schema=schema))
        self.ordinal -= 1
        self._changes.append((schema, None))
        return self

    def insert(self, schema: TableSchema, row: dict[str, Any]) -> BatchBuilder:
        position = self._add(schema, op="I", row=row, old=None, old_is_key=False)
        self._events.append(InsertEvent(**position, table_id=schema.id, row=_tuple(schema, row)))
        return self

    def update(
        self, schema: TableSchema, row: dict[str, Any], old: dict[str, Any] | None = None, missing: tuple[str, ...] = ()
    ) -> BatchBuilder:
        old_is_key = old is not None and set(old) <= {c.name for c in schema.key_columns}
        position = self._add(
            schema,
            op="U",
            row={k: v for k, v in row.items() if k not in missing},
            old=old,
            old_is_key=old_is_key,
            missing=missing,
        )
        new = tuple(MISSING if c.name in missing else row.get(c.name) for c in schema.columns)
        self._events.append(
            UpdateEvent(
                **position,
                table_id=schema.id,
                row=new,
                old_row=_tuple(schema, old) if old else None,
                old_is_key=old_is_key,
            )
        )
        return self

    def delete(self, schema: TableSchema, old: dict[str, Any]) -> BatchBuilder:
        old_is_key = set(old) <= {c.name for c in schema.key_columns}
        position = self._add(schema, op="D", row=old, old=None, old_is_key=old_is_key)
        self._events.append(
            DeleteEvent(**position, table_id=schema.id, old_row=_tuple(schema, old), old_is_key=old_is_key)
        )
        return self

    def truncate(self, schema: TableSchema) -> BatchBuilder:
        position = self._add(schema, op="T", row={}, old=None, old_is_key=False)
        self._events.append(TruncateEvent(**position, table_ids=(schema.id,), cascade=False, restart_identity=False))
        return self

    def build(self) -> EventBatch:
        changes: dict[int, list[TableChanges]] = {}
        segments: list[tuple[TableSchema, list[dict[str, Any]]]] = []
        current: dict[int, tuple[TableSchema, list[dict[str, Any]]]] = {}
        for schema, change in self._changes:
            segment = current.get(schema.id)
            if segment is None or segment[0] != schema:
                segment = (schema, [])
                current[schema.id] = segment
                segments.append(segment)
            if change is not None:
                segment[1].append(change)
        for schema, items in segments:
            changes.setdefault(schema.id, []).append(TableChanges(schema, _change_table(schema, items)))
        events = list(self._events)
        stamps = {int(c["commit_lsn"]): commit_time(int(c["commit_lsn"])) for _, c in self._changes if c is not None}
        self._changes, self._events = [], []
        return EventBatch(changes, lambda: iter(events), Lsn(self.lsn), commit_timestamps=stamps)


def commit_time(lsn: int) -> dt.datetime:
    """The commit time the kit gives the transaction at ``lsn``: a second per 0x100 of LSN after 2026-01-01."""
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=lsn / 0x100)


def _tuple(schema: TableSchema, row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(c.name) for c in schema.columns)


def _change_table(schema: TableSchema, items: list[dict[str, Any]]) -> pa.Table:
    rows = rows_table(schema, [i["row"] for i in items])
    old_type = pa.struct([pa.field(c.name, arrow_type(c)) for c in schema.columns])
    old = pa.array([i["old"] for i in items], old_type)
    return (
        rows.append_column(OP_COLUMN, pa.array([i["op"] for i in items], pa.string()))
        .append_column(COMMIT_LSN_COLUMN, pa.array([int(i["commit_lsn"]) for i in items], pa.uint64()))
        .append_column(TX_ORDINAL_COLUMN, pa.array([i["tx_ordinal"] for i in items], pa.int64()))
        .append_column(MISSING_COLUMN, pa.array([i["missing"] for i in items], pa.list_(pa.string())))
        .append_column(OLD_COLUMN, old)
        .append_column(OLD_IS_KEY_COLUMN, pa.array([i["old_is_key"] for i in items], pa.bool_()))
    )


class Kit:
    """The helpers above, for test modules (conftest cannot be imported under --import-mode=importlib)."""

    BatchBuilder = BatchBuilder
    commit_time = staticmethod(commit_time)
    rows_table = staticmethod(rows_table)
    make_destination = staticmethod(make_destination)


@pytest.fixture
def kit() -> type[Kit]:
    return Kit
