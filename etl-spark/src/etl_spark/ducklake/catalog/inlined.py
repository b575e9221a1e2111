"""Inlined data: a table's rows kept in the catalog database itself, not in Parquet files.

DuckLake 1.0 ("Data Inlining"): the rows of table T inlined at its schema version V live in
``ducklake_inlined_data_T_V`` (``row_id``, ``begin_snapshot``, ``end_snapshot``, then the table's columns
by name), listed in ``ducklake_inlined_data_tables``. A row is visible from its begin snapshot until its
end snapshot, as a file is. Values are stored as DuckDB 1.5 stores them: in SQLite integers and booleans
as BIGINT, blobs as BLOB, all else as text; in Postgres in their own type where there is one, text as
bytea, dates and timestamps as text. That text is DuckDB's (``inlined_text``): infinities, BC and far years
included, so DuckDB reads a value inlined as it reads it from a data file.

A table is inlined only when every column has a stored form this writer writes and reads back exactly:
not lists, not intervals (``inlinable``). Values go in from, and come back out in, the Arrow forms of
``types`` (``Form``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from etl_spark.ducklake.catalog import inlined_text
from etl_spark.ducklake.catalog.ddl import quote
from etl_spark.ducklake.catalog.engine import one_of
from etl_spark.ducklake.catalog.model import LakeColumn
from etl_spark.ducklake.types import LIST, Form, arrow_of, convert

REGISTRY: Final = "ducklake_inlined_data_tables"


@dataclass(frozen=True)
class _Slot:
    """How a lake type is stored in an inlined table."""

    sqlite: str
    postgres: str
    passed: str
    """How values are bound: ``int``, ``bool``, ``bytes``, ``text``, or ``utf8`` (text in a Postgres bytea)."""


_INT: Final = {"int8": "smallint", "int16": "smallint", "int32": "integer", "int64": "bigint"}
_SLOTS: Final[dict[str, _Slot]] = {
    **{name: _Slot("BIGINT", pg, "int") for name, pg in _INT.items()},
    "boolean": _Slot("BIGINT", "boolean", "bool"),
    "float32": _Slot("VARCHAR", "real", "text"),
    "float64": _Slot("VARCHAR", "double precision", "text"),
    "date": _Slot("VARCHAR", "varchar", "text"),
    "timestamp": _Slot("VARCHAR", "varchar", "text"),
    "timestamptz": _Slot("VARCHAR", "varchar", "text"),
    "time": _Slot("VARCHAR", "time", "text"),
    "uuid": _Slot("VARCHAR", "uuid", "text"),
    "blob": _Slot("BLOB", "bytea", "bytes"),
    "varchar": _Slot("VARCHAR", "bytea", "utf8"),
    "json": _Slot("VARCHAR", "bytea", "utf8"),
}
_NATIVE_TEXT: Final = ("varchar", "bytea")
"""Postgres types a text value goes into without a cast."""
_TEMPORAL: Final = ("date", "timestamp", "timestamptz")
"""Lake types stored as DuckDB's text of them (``inlined_text``)."""


def _slot(column: LakeColumn) -> _Slot | None:
    if column.type.startswith("decimal("):
        return _Slot("VARCHAR", "numeric" + column.type[len("decimal") :], "text")
    return _SLOTS.get(column.type)


def inlinable(columns: Sequence[LakeColumn]) -> bool:
    """Whether rows of a table with these columns can be inlined (no list or interval column)."""
    return all(c.type != LIST and _slot(c) is not None for c in columns)


def table_name(table_id: int, schema_version: int) -> str:
    return f"ducklake_inlined_data_{table_id}_{schema_version}"


def _postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def _slots(columns: Sequence[LakeColumn]) -> list[_Slot]:
    slots = [_slot(c) for c in columns]
    if any(s is None for s in slots):
        raise ValueError("a table with list or interval columns is not inlined")
    return [s for s in slots if s is not None]


def registered(conn: Connection, table_ids: Sequence[int]) -> dict[int, dict[int, str]]:
    """Each table's inlined data tables by schema version (tables without any left out)."""
    member, ids = one_of(conn, "table_id", "t", table_ids)
    statement = sa.text(f"SELECT table_id, schema_version, table_name FROM {REGISTRY} WHERE {member}")
    rows = conn.execute(statement, {"t": ids})
    tables: dict[int, dict[int, str]] = {}
    for table_id, version, name in rows:
        tables.setdefault(int(table_id), {})[int(version)] = str(name)
    return tables


def create(conn: Connection, table_id: int, schema_version: int, columns: Sequence[LakeColumn]) -> str:
    """Create the inlined data table of a table at a schema version, and register it."""
    name = table_name(table_id, schema_version)
    postgres = _postgres(conn)
    body = ", ".join(
        f"{quote(c.name)} {s.postgres if postgres else s.sqlite}" for c, s in zip(columns, _slots(columns), strict=True)
    )
    conn.execute(
        sa.text(f"CREATE TABLE {quote(name)} (row_id BIGINT, begin_snapshot BIGINT, end_snapshot BIGINT, {body})")
    )
    conn.execute(
        sa.text(f"INSERT INTO {REGISTRY} (table_id, table_name, schema_version) VALUES (:t, :n, :v)"),
        {"t": table_id, "n": name, "v": schema_version},
    )
    return name


def insert(
    conn: Connection, name: str, columns: Sequence[LakeColumn], rows: pa.Table, *, row_id_start: int, snapshot: int
) -> None:
    """Insert rows (in either value form, columns named as ``columns``) with consecutive row ids.

    Through the driver's own ``executemany`` with positional parameters: SQLAlchemy's per-row parameter
    processing cost more than the database's work (measured: most of a batch of 20 tables' time).
    """
    if rows.num_rows == 0:
        return
    postgres = _postgres(conn)
    slots = _slots(columns)
    values = [_encode(convert(rows[c.name], c, Form.SPARK), s, postgres) for c, s in zip(columns, slots, strict=True)]
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"

    def escaped(text: str) -> str:  # "%" is the driver's own marker with psycopg
        return text if mark == "?" else text.replace("%", "%%")

    targets = ", ".join(escaped(quote(c.name)) for c in columns)
    placeholders = ", ".join(_bind(mark, s, postgres) for s in slots)
    statement = (
        f"INSERT INTO {escaped(quote(name))} (row_id, begin_snapshot, end_snapshot, {targets})"
        f" VALUES ({mark}, {mark}, NULL, {placeholders})"
    )
    ids = range(row_id_start, row_id_start + rows.num_rows)
    conn.exec_driver_sql(statement, list(zip(ids, itertools.repeat(snapshot, rows.num_rows), *values, strict=True)))


def _bind(mark: str, slot: _Slot, postgres: bool) -> str:
    if postgres and slot.passed == "text" and slot.postgres not in _NATIVE_TEXT:
        return f"CAST({mark} AS {slot.postgres})"
    return mark


def _encode(values: pa.ChunkedArray | pa.Array, slot: _Slot, postgres: bool) -> list[Any]:
    """A column in ``Form.SPARK`` as the values to bind."""
    if slot.passed in ("int", "bool", "bytes"):
        return list(values.to_pylist())
    if slot.passed == "utf8" and postgres:
        return list(pc.cast(values, pa.binary()).to_pylist())
    if pa.types.is_timestamp(values.type) or pa.types.is_date32(values.type):
        return list(inlined_text.to_text(values).to_pylist())
    return list(pc.cast(values, pa.string()).to_pylist())


def end(conn: Connection, name: str, row_ids: Sequence[int], snapshot: int) -> int:
    """End the live rows of these row ids in ``snapshot``; how many it ended."""
    member, ids = one_of(conn, "row_id", "ids", row_ids)
    statement = sa.text(f"UPDATE {quote(name)} SET end_snapshot = :s WHERE end_snapshot IS NULL AND {member}")
    return conn.execute(statement, {"s": snapshot, "ids": ids}).rowcount


def end_all(conn: Connection, name: str, snapshot: int) -> int:
    """End every live row (a truncate); how many it ended."""
    return conn.execute(
        sa.text(f"UPDATE {quote(name)} SET end_snapshot = :s WHERE end_snapshot IS NULL"), {"s": snapshot}
    ).rowcount


def column_names(conn: Connection, name: str) -> list[str]:
    """The names of the table columns an inlined data table holds."""
    return [str(c["name"]) for c in sa.inspect(conn).get_columns(name)][3:]


HOLDING_PROBES: Final = 200
"""Inlined data tables probed by one statement (SQLite allows 500 terms in a compound SELECT)."""


def holding_rows(conn: Connection, names: Sequence[str]) -> set[str]:
    """Those of the inlined data tables that hold any row, live or ended (found without counting them)."""
    holding: set[str] = set()
    for start in range(0, len(names), HOLDING_PROBES):
        chunk = names[start : start + HOLDING_PROBES]
        probes = " UNION ALL ".join(
            f"SELECT {i} WHERE EXISTS (SELECT 1 FROM {quote(name)})" for i, name in enumerate(chunk)
        )
        holding.update(chunk[int(i)] for (i,) in conn.execute(sa.text(probes)))
    return holding


def shape(conn: Connection, name: str, last_row_id: int | None = None) -> tuple[int, int]:
    """Rows, and ended rows (of row ids up to ``last_row_id``)."""
    where = "" if last_row_id is None else " WHERE row_id <= :last"
    row = conn.execute(
        sa.text(f"SELECT count(*), count(end_snapshot) FROM {quote(name)}{where}"), {"last": last_row_id}
    ).one()
    return int(row[0]), int(row[1])


def read(
    conn: Connection,
    name: str,
    columns: Sequence[LakeColumn],
    form: Form,
    *,
    live: bool,
    keys: tuple[str, Sequence[int]] | None = None,
    up_to: int | None = None,
) -> pa.Table:
    """Rows with ``row_id``, ``begin_snapshot``, ``end_snapshot`` and ``columns`` (values in ``form``), by row id;
    only the live ones with ``live``, with ``keys`` (an integer column's name and values) those holding one
    of the values there, and with ``up_to`` those of row ids up to it."""
    postgres = _postgres(conn)
    slots = _slots(columns)
    selected = ", ".join(_select(c, s, postgres) for c, s in zip(columns, slots, strict=True))
    conditions = ["end_snapshot IS NULL"] if live else []
    parameters: dict[str, Any] = {}
    if keys is not None:
        member, parameters["keys"] = one_of(conn, quote(keys[0]), "keys", keys[1])
        conditions.append(member)
    if up_to is not None:
        conditions.append("row_id <= :up_to")
        parameters["up_to"] = up_to
    statement = sa.text(
        f"SELECT row_id, begin_snapshot, end_snapshot{', ' if selected else ''}{selected} FROM {quote(name)}"
        + (" WHERE " + " AND ".join(conditions) if conditions else "")
        + " ORDER BY row_id"
    )
    rows = conn.execute(statement, parameters).all()
    stored = list(zip(*rows, strict=True)) if rows else [()] * (3 + len(columns))
    arrays = [pa.array(stored[i], pa.int64()) for i in range(3)]
    arrays += [_decode(list(v), c, s, form) for v, c, s in zip(stored[3:], columns, slots, strict=True)]
    return pa.table(arrays, names=["row_id", "begin_snapshot", "end_snapshot", *(c.name for c in columns)])


def _select(column: LakeColumn, slot: _Slot, postgres: bool) -> str:
    name = quote(column.name)
    if postgres and slot.passed == "utf8":
        return f"convert_from({name}, 'UTF8')"
    if postgres and slot.passed == "text" and slot.postgres not in _NATIVE_TEXT:
        return f"CAST({name} AS text)"
    return name


def _decode(values: list[Any], column: LakeColumn, slot: _Slot, form: Form) -> pa.Array:
    if slot.passed == "int":
        stored = pa.array(values, pa.int64())
    elif slot.passed == "bool":
        stored = pa.array([None if v is None else bool(v) for v in values], pa.bool_())
    elif slot.passed == "bytes":
        stored = pa.array([None if v is None else bytes(v) for v in values], pa.binary())
    else:
        stored = pa.array(values, pa.string())
        if column.type in _TEMPORAL:
            stored = inlined_text.from_text(stored, arrow_of(column, form))
    return convert(stored, column, form)


def remove(conn: Connection, name: str, last_row_id: int) -> int:
    """Delete the rows of row ids up to ``last_row_id`` (they were flushed to a data file); how many."""
    return conn.execute(sa.text(f"DELETE FROM {quote(name)} WHERE row_id <= :last"), {"last": last_row_id}).rowcount
