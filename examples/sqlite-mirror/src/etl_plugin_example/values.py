"""Values between Arrow columns and SQLite, and back to Python values like psycopg's.

SQLite has five storage classes (NULL, INTEGER, REAL, TEXT, BLOB), so most Postgres types are kept
as text that round-trips exactly. The mapping, by the Arrow type etl gives a column:

==========================  ===========  ====================================================
Arrow type (Postgres)       stored as    notes
==========================  ===========  ====================================================
bool                        INTEGER      0 / 1
int16/32/64                 INTEGER
float64                     REAL         NaN as the text ``'NaN'`` (SQLite turns a NaN REAL into NULL)
float32 (``real``)          REAL         the shortest decimal that reads back as the float32 (``1.1``)
decimal (``numeric(p,s)``)  TEXT         exact: ``'12.50'``
string                      TEXT         text, varchar, json, uuid, unconstrained numeric, enums, ...
binary (``bytea``)          BLOB
date32                      TEXT         ISO ``'2024-02-29'``; ``'infinity'``, ``'0044-03-15 BC'`` as in Postgres
timestamp[us]               TEXT         ``'2024-02-29 12:34:56.000001'`` (with ``+00:00`` for timestamptz)
time64[us]                  TEXT         ``'12:34:56.000001'``
month_day_nano_interval     TEXT         ``'14 months 3 days 14706789000 microseconds'`` (exact)
list<...> (arrays)          TEXT         JSON; elements as above (bytea as ``'\\x..'`` hex, NaN as ``"NaN"``)
==========================  ===========  ====================================================

Text-encoded dates and timestamps sort correctly as text for years 1-9999. ``decoder`` turns stored
values back into the Python values psycopg returns for the source column (``Decimal`` for every
``numeric``, ``timedelta`` for intervals with psycopg's 30-day months), so tests compare the mirror
with the source directly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from etl.api import BUILTIN_ARRAYS, NUMERIC_OID, ColumnSchema, arrow_type, python_values

SqliteValue = int | float | str | bytes | None
Decode = Callable[[Any], Any]

_NON_FINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def sqlite_type(column: ColumnSchema) -> str:
    """The declared SQLite type of a column; it fixes the column's affinity, which never converts our values."""
    kind = arrow_type(column)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind):
        return "INTEGER"
    if pa.types.is_floating(kind):
        return "REAL"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "BLOB"
    return "TEXT"


def value_kind(column: ColumnSchema) -> str:
    """Columns of one kind store and read their values alike: a type change within a kind needs no rewrite."""
    return _kind(arrow_type(column), column.type_oid)


def _kind(kind: pa.DataType, type_oid: int) -> str:
    if pa.types.is_integer(kind):
        return "integer"
    if pa.types.is_decimal(kind) or (pa.types.is_string(kind) and type_oid == NUMERIC_OID):
        return "decimal"
    if pa.types.is_string(kind):
        return "text"
    if pa.types.is_list(kind):
        return f"list<{_kind(kind.value_type, BUILTIN_ARRAYS.get(type_oid, 0))}>"
    return str(kind)


# -- Arrow -> SQLite -------------------------------------------------------------------------------------


def encode_column(values: pa.Array | pa.ChunkedArray) -> list[SqliteValue]:
    """One Arrow column as SQLite values, in row order."""
    kind = values.type
    if (
        pa.types.is_boolean(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_large_binary(kind)
    ):
        return values.to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_float64(kind):
        return [_float(v) for v in values.to_pylist()]
    if pa.types.is_decimal(kind):
        return pc.cast(values, pa.string()).to_pylist()  # type: ignore[no-any-return]  # exact text
    if pa.types.is_float32(kind):
        texts: list[str | None] = pc.cast(values, pa.string()).to_pylist()  # the shortest text of each float32
        return [None if t is None else _float(float(t)) for t in texts]
    prepared = _textual(values)
    return [_top_level(v, kind) for v in python_values(prepared)]


def _textual(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Cast float32 and decimal leaves of nested types to their exact text (the same forms as above)."""
    target = _text_leaves(values.type)
    return values if target == values.type else pc.cast(values, target)


def _text_leaves(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_float32(kind) or pa.types.is_decimal(kind):
        return pa.string()
    if pa.types.is_list(kind):
        return pa.list_(_text_leaves(kind.value_type))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _text_leaves(f.type)) for f in kind])
    return kind


def _top_level(value: Any, kind: pa.DataType) -> SqliteValue:
    if value is None:
        return None
    if pa.types.is_list(kind) or pa.types.is_struct(kind):
        return json.dumps(_json(value, kind), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    encoded: SqliteValue = _json(value, kind)
    return encoded


def _json(value: Any, kind: pa.DataType) -> Any:
    """A value of ``kind`` (from ``python_values`` of a ``_textual`` array) as a JSON-ready value."""
    if value is None:
        return None
    if pa.types.is_list(kind):
        return [_json(v, kind.value_type) for v in value]
    if pa.types.is_struct(kind):
        return {f.name: _json(value[f.name], f.type) for f in kind}
    if pa.types.is_float32(kind):
        return _float(float(value))
    if pa.types.is_floating(kind):
        return _float(value)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, time):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, pa.MonthDayNano):
        return f"{value.months} months {value.days} days {value.nanoseconds // 1000} microseconds"
    return value  # bool, int, str (including the text forms of decimals, infinities and BC dates)


def _float(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


# -- SQLite -> Python ----------------------------------------------------------------------------------


def decoder(column: ColumnSchema) -> Decode:
    """Turns a stored value of ``column`` into the Python value psycopg gives for the source's value."""
    kind = arrow_type(column)
    if pa.types.is_list(kind):
        element = _decoder(kind.value_type, BUILTIN_ARRAYS.get(column.type_oid, 0))

        def decode_list(value: Any) -> Any:
            return None if value is None else _map(json.loads(value), element)

        return decode_list
    return _decoder(kind, column.type_oid)


def _map(value: Any, element: Decode) -> Any:
    if isinstance(value, list):
        return [_map(v, element) for v in value]
    return element(value)


def _decoder(kind: pa.DataType, type_oid: int) -> Decode:
    if pa.types.is_list(kind):  # a nested dimension: elements decode alike
        return _decoder(kind.value_type, type_oid)
    if pa.types.is_boolean(kind):
        return _nullable(bool)
    if pa.types.is_floating(kind):
        return _nullable(lambda v: _NON_FINITE[v] if isinstance(v, str) else float(v))
    if pa.types.is_decimal(kind) or (pa.types.is_string(kind) and type_oid == NUMERIC_OID):
        return _nullable(Decimal)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return _nullable(lambda v: bytes.fromhex(v[2:]) if isinstance(v, str) else bytes(v))
    if pa.types.is_date32(kind):
        return _nullable(_or_text(date.fromisoformat))
    if pa.types.is_timestamp(kind):
        return _nullable(_or_text(datetime.fromisoformat))
    if pa.types.is_time64(kind):
        return _nullable(time.fromisoformat)
    if kind == pa.month_day_nano_interval():
        return _nullable(_or_text(_interval))
    return lambda v: v  # integers and text


def _nullable(decode: Decode) -> Decode:
    def run(value: Any) -> Any:
        return None if value is None else decode(value)

    return run


def _or_text(parse: Decode) -> Decode:
    """Values Python cannot hold (infinity, BC, years past 9999) stay in their Postgres text form."""

    def run(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, OverflowError):
            return text

    return run


def _interval(text: str) -> timedelta:
    """``'<m> months <d> days <us> microseconds'`` as psycopg reads an interval: a year is 365 days, a month 30."""
    months, _, days, _, micros, _ = text.split()
    total = int(months)
    years = abs(total) // 12 * (1 if total >= 0 else -1)
    return timedelta(days=365 * years + 30 * (total - 12 * years) + int(days), microseconds=int(micros))
