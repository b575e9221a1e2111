"""A column's codec, from its type: the Arrow type and field that hold it, and decoding its text values."""

from __future__ import annotations

from functools import lru_cache
from typing import Final

import pyarrow as pa

from etl.errors import TableError
from etl.postgres.codecs.arrays import array_codec
from etl.postgres.codecs.base import BadValue, Codec
from etl.postgres.codecs.scalars import scalar_codec
from etl.schema import ColumnSchema

# Built-in types of pg_catalog (base, range and multirange types; OIDs are stable across versions).
BUILTIN_TYPES: Final[dict[int, str]] = {
    16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 22: "int2vector", 23: "int4",
    24: "regproc", 25: "text", 26: "oid", 27: "tid", 28: "xid", 29: "cid", 30: "oidvector", 114: "json",
    142: "xml", 194: "pg_node_tree", 600: "point", 601: "lseg", 602: "path", 603: "box", 604: "polygon",
    628: "line", 650: "cidr", 700: "float4", 701: "float8", 718: "circle", 774: "macaddr8", 790: "money",
    829: "macaddr", 869: "inet", 1033: "aclitem", 1042: "bpchar", 1043: "varchar", 1082: "date", 1083: "time",
    1114: "timestamp", 1184: "timestamptz", 1186: "interval", 1266: "timetz", 1560: "bit", 1562: "varbit",
    1700: "numeric", 1790: "refcursor", 2202: "regprocedure", 2203: "regoper", 2204: "regoperator",
    2205: "regclass", 2206: "regtype", 2950: "uuid", 2970: "txid_snapshot", 3220: "pg_lsn", 3361: "pg_ndistinct",
    3402: "pg_dependencies", 3614: "tsvector", 3615: "tsquery", 3642: "gtsvector", 3734: "regconfig",
    3769: "regdictionary", 3802: "jsonb", 3904: "int4range", 3906: "numrange", 3908: "tsrange",
    3910: "tstzrange", 3912: "daterange", 3926: "int8range", 4072: "jsonpath", 4089: "regnamespace",
    4096: "regrole", 4191: "regcollation", 4451: "int4multirange", 4532: "nummultirange", 4533: "tsmultirange",
    4534: "tstzmultirange", 4535: "datemultirange", 4536: "int8multirange", 4600: "pg_brin_bloom_summary",
    4601: "pg_brin_minmax_multi_summary", 5017: "pg_mcv_list", 5038: "pg_snapshot", 5069: "xid8",
}  # fmt: skip

# Built-in array types: array type OID -> element type OID (the array's name is "_" + the element's).
BUILTIN_ARRAYS: Final[dict[int, int]] = {
    143: 142, 199: 114, 271: 5069, 629: 628, 651: 650, 719: 718, 775: 774, 791: 790, 1000: 16, 1001: 17,
    1002: 18, 1003: 19, 1005: 21, 1006: 22, 1007: 23, 1008: 24, 1009: 25, 1010: 27, 1011: 28, 1012: 29,
    1013: 30, 1014: 1042, 1015: 1043, 1016: 20, 1017: 600, 1018: 601, 1019: 602, 1020: 603, 1021: 700,
    1022: 701, 1027: 604, 1028: 26, 1034: 1033, 1040: 829, 1041: 869, 1115: 1114, 1182: 1082, 1183: 1083,
    1185: 1184, 1187: 1186, 1231: 1700, 1270: 1266, 1561: 1560, 1563: 1562, 2201: 1790, 2207: 2202,
    2208: 2203, 2209: 2204, 2210: 2205, 2211: 2206, 2949: 2970, 2951: 2950, 3221: 3220, 3643: 3614,
    3644: 3642, 3645: 3615, 3735: 3734, 3770: 3769, 3807: 3802, 3905: 3904, 3907: 3906, 3909: 3908,
    3911: 3910, 3913: 3912, 3927: 3926, 4073: 4072, 4090: 4089, 4097: 4096, 4192: 4191, 5039: 5038,
    6150: 4451, 6151: 4532, 6152: 4533, 6153: 4534, 6155: 4535, 6157: 4536,
}  # fmt: skip

_BOX_ARRAY: Final = 1020  # the only built-in array whose elements are separated by ';'

_SETTINGS_HINT: Final = (
    "values are parsed in the text forms of the session settings every source connection pins"
    " (TimeZone=UTC, DateStyle=ISO, IntervalStyle=postgres, extra_float_digits=3, bytea_output=hex)"
)


def arrow_type(column: ColumnSchema) -> pa.DataType:
    """The Arrow type that holds the column's values."""
    return _codec_of(column).type


def arrow_field(column: ColumnSchema) -> pa.Field:
    """The column as a (nullable) Arrow field carrying its Postgres type in metadata.

    Metadata keys: ``pg.type_oid``, ``pg.type_name`` and ``pg.typmod``. Fields are always nullable:
    change tables hold deletes with key columns only and truncate rows; ``ColumnSchema.nullable``
    tells whether the source column is NOT NULL.
    """
    metadata = {
        b"pg.type_oid": str(column.type_oid).encode(),
        b"pg.type_name": type_name(column).encode(),
        b"pg.typmod": str(column.type_modifier).encode(),
    }
    return pa.field(column.name, arrow_type(column), nullable=True, metadata=metadata)


def type_name(column: ColumnSchema) -> str:
    """The column's type name: its ``type_name`` when known, else the built-in ``pg_type`` name, else ``""``."""
    if column.type_name:
        return column.type_name
    if column.type_oid in BUILTIN_ARRAYS:
        return "_" + BUILTIN_TYPES[BUILTIN_ARRAYS[column.type_oid]]
    return BUILTIN_TYPES.get(column.type_oid, "")


def decode_text_column(column: ColumnSchema, values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Convert a string array of Postgres text values (nulls are SQL NULL) to ``arrow_type(column)``.

    Raises ``TableError`` naming the column when a value cannot be represented.
    """
    codec = _codec_of(column)
    try:
        if isinstance(values, pa.ChunkedArray):
            return pa.chunked_array([codec.decode(_as_string(chunk)) for chunk in values.chunks], type=codec.type)
        return codec.decode(_as_string(values))
    except BadValue as exc:
        raise TableError(
            f"column {column.name!r} ({type_name(column) or column.type_oid}): {exc}",
            hint=exc.hint or _SETTINGS_HINT,
        ) from None


def _as_string(chunk: pa.Array) -> pa.Array:
    return chunk if chunk.type == pa.string() else chunk.cast(pa.string())


def _codec_of(column: ColumnSchema) -> Codec:
    return _codec_for(column.type_oid, column.type_modifier, column.type_name)


@lru_cache(maxsize=1024)
def _codec_for(type_oid: int, typmod: int, type_name: str) -> Codec:
    depth = _array_depth(type_oid, type_name)
    if depth:
        delimiter = ";" if type_oid == _BOX_ARRAY else ","
        return array_codec(scalar_codec(BUILTIN_ARRAYS.get(type_oid, 0), typmod), depth, delimiter)
    return scalar_codec(type_oid, typmod)


def _array_depth(type_oid: int, type_name: str) -> int:
    """Dimensions of an array column: the ``[]`` in its type name (one when absent), 0 for non-arrays."""
    brackets = type_name.count("[]")
    if type_oid in BUILTIN_ARRAYS:
        return max(brackets, 1)
    return brackets if type_name.endswith("[]") else 0
