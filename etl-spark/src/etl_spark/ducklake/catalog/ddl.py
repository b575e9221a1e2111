"""The catalog's tables: DuckLake 1.0's, created the way DuckDB 1.5.5 creates them, and this writer's own.

Each table is defined once, as a column list. From it come the ``CREATE TABLE`` statement and the
SQLAlchemy ``Table`` every insert goes through, so inserts name their columns. In SQLite DuckDB stores
BOOLEAN as BIGINT (0/1) and UUID and TIMESTAMPTZ as VARCHAR (a timestamp as
``2026-11-21 13:43:24.006292+00``); in Postgres it uses the native types. The ``Table`` column types bind
values in those forms, and the statements create those types, so a lake bootstrapped and written here is
identical to one DuckDB bootstrapped and wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

SPEC_VERSION: Final = "1.0"

# table -> "column TYPE, ..." in DuckDB's column order; TYPE is one of BIGINT, VARCHAR, BOOLEAN, UUID,
# TIMESTAMPTZ, optionally followed by NOT NULL and/or PRIMARY KEY (several PRIMARY KEY columns make one key).
LAKE_COLUMNS: Final[dict[str, str]] = {
    "ducklake_metadata": "key VARCHAR NOT NULL, value VARCHAR NOT NULL, scope VARCHAR, scope_id BIGINT",
    "ducklake_snapshot": "snapshot_id BIGINT PRIMARY KEY, snapshot_time TIMESTAMPTZ, schema_version BIGINT,"
    " next_catalog_id BIGINT, next_file_id BIGINT",
    "ducklake_snapshot_changes": "snapshot_id BIGINT PRIMARY KEY, changes_made VARCHAR, author VARCHAR,"
    " commit_message VARCHAR, commit_extra_info VARCHAR",
    "ducklake_schema": "schema_id BIGINT PRIMARY KEY, schema_uuid UUID, begin_snapshot BIGINT, end_snapshot BIGINT,"
    " schema_name VARCHAR, path VARCHAR, path_is_relative BOOLEAN",
    "ducklake_table": "table_id BIGINT, table_uuid UUID, begin_snapshot BIGINT, end_snapshot BIGINT, schema_id BIGINT,"
    " table_name VARCHAR, path VARCHAR, path_is_relative BOOLEAN",
    "ducklake_view": "view_id BIGINT, view_uuid UUID, begin_snapshot BIGINT, end_snapshot BIGINT, schema_id BIGINT,"
    " view_name VARCHAR, dialect VARCHAR, sql VARCHAR, column_aliases VARCHAR",
    "ducklake_tag": "object_id BIGINT, begin_snapshot BIGINT, end_snapshot BIGINT, key VARCHAR, value VARCHAR",
    "ducklake_column_tag": "table_id BIGINT, column_id BIGINT, begin_snapshot BIGINT, end_snapshot BIGINT,"
    " key VARCHAR, value VARCHAR",
    "ducklake_data_file": "data_file_id BIGINT PRIMARY KEY, table_id BIGINT, begin_snapshot BIGINT,"
    " end_snapshot BIGINT, file_order BIGINT, path VARCHAR, path_is_relative BOOLEAN, file_format VARCHAR,"
    " record_count BIGINT, file_size_bytes BIGINT, footer_size BIGINT, row_id_start BIGINT, partition_id BIGINT,"
    " encryption_key VARCHAR, mapping_id BIGINT, partial_max BIGINT",
    "ducklake_file_column_stats": "data_file_id BIGINT, table_id BIGINT, column_id BIGINT, column_size_bytes BIGINT,"
    " value_count BIGINT, null_count BIGINT, min_value VARCHAR, max_value VARCHAR, contains_nan BOOLEAN,"
    " extra_stats VARCHAR",
    "ducklake_file_variant_stats": "data_file_id BIGINT, table_id BIGINT, column_id BIGINT, variant_path VARCHAR,"
    " shredded_type VARCHAR, column_size_bytes BIGINT, value_count BIGINT, null_count BIGINT, min_value VARCHAR,"
    " max_value VARCHAR, contains_nan BOOLEAN, extra_stats VARCHAR",
    "ducklake_delete_file": "delete_file_id BIGINT PRIMARY KEY, table_id BIGINT, begin_snapshot BIGINT,"
    " end_snapshot BIGINT, data_file_id BIGINT, path VARCHAR, path_is_relative BOOLEAN, format VARCHAR,"
    " delete_count BIGINT, file_size_bytes BIGINT, footer_size BIGINT, encryption_key VARCHAR, partial_max BIGINT",
    "ducklake_column": "column_id BIGINT, begin_snapshot BIGINT, end_snapshot BIGINT, table_id BIGINT,"
    " column_order BIGINT, column_name VARCHAR, column_type VARCHAR, initial_default VARCHAR, default_value VARCHAR,"
    " nulls_allowed BOOLEAN, parent_column BIGINT, default_value_type VARCHAR, default_value_dialect VARCHAR",
    "ducklake_table_stats": "table_id BIGINT, record_count BIGINT, next_row_id BIGINT, file_size_bytes BIGINT",
    "ducklake_table_column_stats": "table_id BIGINT, column_id BIGINT, contains_null BOOLEAN, contains_nan BOOLEAN,"
    " min_value VARCHAR, max_value VARCHAR, extra_stats VARCHAR",
    "ducklake_partition_info": "partition_id BIGINT, table_id BIGINT, begin_snapshot BIGINT, end_snapshot BIGINT",
    "ducklake_partition_column": "partition_id BIGINT, table_id BIGINT, partition_key_index BIGINT,"
    " column_id BIGINT, transform VARCHAR",
    "ducklake_file_partition_value": "data_file_id BIGINT, table_id BIGINT, partition_key_index BIGINT,"
    " partition_value VARCHAR",
    "ducklake_files_scheduled_for_deletion": "data_file_id BIGINT, path VARCHAR, path_is_relative BOOLEAN,"
    " schedule_start TIMESTAMPTZ",
    "ducklake_inlined_data_tables": "table_id BIGINT, table_name VARCHAR, schema_version BIGINT",
    "ducklake_column_mapping": "mapping_id BIGINT, table_id BIGINT, type VARCHAR",
    "ducklake_name_mapping": "mapping_id BIGINT, column_id BIGINT, source_name VARCHAR, target_field_id BIGINT,"
    " parent_column BIGINT, is_partition BOOLEAN",
    "ducklake_schema_versions": "begin_snapshot BIGINT, schema_version BIGINT, table_id BIGINT",
    "ducklake_macro": "schema_id BIGINT, macro_id BIGINT, macro_name VARCHAR, begin_snapshot BIGINT,"
    " end_snapshot BIGINT",
    "ducklake_macro_impl": "macro_id BIGINT, impl_id BIGINT, dialect VARCHAR, sql VARCHAR, type VARCHAR",
    "ducklake_macro_parameters": "macro_id BIGINT, impl_id BIGINT, column_id BIGINT, parameter_name VARCHAR,"
    " parameter_type VARCHAR, default_value VARCHAR, default_value_type VARCHAR",
    "ducklake_sort_info": "sort_id BIGINT, table_id BIGINT, begin_snapshot BIGINT, end_snapshot BIGINT",
    "ducklake_sort_expression": "sort_id BIGINT, table_id BIGINT, sort_key_index BIGINT, expression VARCHAR,"
    " dialect VARCHAR, sort_direction VARCHAR, null_order VARCHAR",
}

STATE_TABLE: Final = "etl_ducklake_tables"
"""Which lake table holds a pipeline's source table, the replication watermark, and whether the next copy of
the source table replaces that lake table (``replaced``: ``Catalog.mark_for_replacement``)."""

COLUMNS_TABLE: Final = "etl_ducklake_source_columns"
"""The source column each column of a lake table holds: its Postgres attribute number (``attnum``, a column's
identity across renames; NULL when unknown), type OID and type modifier."""

POSITION_TABLE: Final = "etl_ducklake_positions"
"""Per pipeline, the stream's position the lake stands at and the snapshot holding it (``positions``)."""

STAGED_TABLE: Final = "etl_ducklake_staged"
"""Per pipeline, the name prefixes of the files it writes for a transaction still open (``staging``)."""

VERSION_TABLE: Final = "etl_ducklake_version"
"""The migrations of this writer's tables applied to the catalog (``migrations``)."""

# This writer's tables in their current shape; the migrations create them and bring them to it.
OWN_COLUMNS: Final[dict[str, str]] = {
    STATE_TABLE: "pipeline_id BIGINT NOT NULL PRIMARY KEY, source_table_id BIGINT NOT NULL PRIMARY KEY,"
    " table_id BIGINT NOT NULL, commit_lsn BIGINT NOT NULL, tx_ordinal BIGINT NOT NULL, replaced BOOLEAN NOT NULL",
    COLUMNS_TABLE: "table_id BIGINT NOT NULL PRIMARY KEY, column_id BIGINT NOT NULL PRIMARY KEY, attnum BIGINT,"
    " type_oid BIGINT NOT NULL, type_modifier BIGINT NOT NULL",
    VERSION_TABLE: "version BIGINT PRIMARY KEY, description VARCHAR NOT NULL, applied_at TIMESTAMPTZ NOT NULL",
    POSITION_TABLE: "pipeline_id BIGINT NOT NULL PRIMARY KEY, commit_lsn BIGINT NOT NULL, snapshot_id BIGINT NOT NULL",
    STAGED_TABLE: "pipeline_id BIGINT NOT NULL, table_id BIGINT NOT NULL, directory VARCHAR NOT NULL,"
    " prefix VARCHAR NOT NULL PRIMARY KEY",
}

_SQLITE_TYPES: Final = {"BOOLEAN": "BIGINT", "UUID": "VARCHAR", "TIMESTAMPTZ": "VARCHAR"}
_SQLITE_TIMESTAMP: Final = "%Y-%m-%d %H:%M:%S.%f+00"
_QUOTED: Final = {"key", "value", "scope", "sql", "type", "transform"}


def quote(name: str) -> str:
    """A double-quoted identifier (also the form DuckLake's change tokens name schemas and tables in)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class _Column:
    name: str
    kind: str
    not_null: bool
    primary_key: bool


def _columns(spec: str) -> list[_Column]:
    columns = []
    for column in spec.split(","):
        name, kind, *rest = column.split()
        constraints = " ".join(rest)
        if constraints.replace("NOT NULL", "").replace("PRIMARY KEY", "").strip():
            raise ValueError(f"unknown constraint in column {column.strip()!r}")
        columns.append(_Column(name, kind, "NOT NULL" in constraints, "PRIMARY KEY" in constraints))
    return columns


def column_ddl(column: str, dialect: str) -> str:
    """One column (``name TYPE [NOT NULL]``) as ``CREATE``/``ALTER TABLE`` writes it on ``dialect``."""
    (parsed,) = _columns(column)
    return _render(parsed, dialect, inline_key=False)


def _render(column: _Column, dialect: str, *, inline_key: bool) -> str:
    kind = _SQLITE_TYPES.get(column.kind, column.kind) if dialect == "sqlite" else column.kind
    words = [quote(column.name) if column.name in _QUOTED else column.name, kind]
    if column.not_null:
        words.append("NOT NULL")
    if column.primary_key and inline_key:
        words.append("PRIMARY KEY")
    return " ".join(words)


def create_statement(table: str, spec: str, dialect: str, *, if_not_exists: bool = False) -> str:
    """``CREATE TABLE`` for a column list, in the types DuckDB uses on ``dialect``."""
    columns = _columns(spec)
    keys = [c.name for c in columns if c.primary_key]
    parts = [_render(c, dialect, inline_key=len(keys) == 1) for c in columns]
    if len(keys) > 1:
        parts.append(f"PRIMARY KEY ({', '.join(keys)})")
    exists = "IF NOT EXISTS " if if_not_exists else ""
    return f"CREATE TABLE {exists}{table} ({', '.join(parts)})"


def create_statements(dialect: str) -> list[str]:
    """``CREATE TABLE`` statements for every DuckLake table, in the types DuckDB uses on ``dialect``."""
    return [create_statement(table, spec, dialect) for table, spec in LAKE_COLUMNS.items()]


class _Boolean(sa.types.TypeDecorator[bool]):
    """BOOLEAN in Postgres; BIGINT 0/1 in SQLite."""

    impl = sa.Boolean
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        return dialect.type_descriptor(sa.BigInteger() if dialect.name == "sqlite" else sa.Boolean())

    def process_bind_param(self, value: bool | None, dialect: Dialect) -> int | bool | None:
        if value is None:
            return None
        return int(bool(value)) if dialect.name == "sqlite" else bool(value)


class _Uuid(sa.types.TypeDecorator[str]):
    """UUID in Postgres; its text (``8-4-4-4-12`` hex digits) in SQLite."""

    impl = sa.String
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        return dialect.type_descriptor(sa.String() if dialect.name == "sqlite" else postgresql.UUID(as_uuid=False))

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else str(value)  # also a uuid.UUID read back from Postgres


class _Timestamp(sa.types.TypeDecorator[datetime]):
    """TIMESTAMPTZ in Postgres; in SQLite the text ``2026-11-21 13:43:24.006292+00`` (UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        return dialect.type_descriptor(sa.String() if dialect.name == "sqlite" else sa.DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | str | None:
        if value is None or dialect.name != "sqlite":
            return value
        return value.astimezone(UTC).strftime(_SQLITE_TIMESTAMP)


_TYPES: Final[dict[str, type[sa.types.TypeEngine[Any]]]] = {
    "BIGINT": sa.BigInteger,
    "VARCHAR": sa.String,
    "BOOLEAN": _Boolean,
    "UUID": _Uuid,
    "TIMESTAMPTZ": _Timestamp,
}


def _table(metadata: sa.MetaData, name: str, spec: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        *(
            sa.Column(c.name, _TYPES[c.kind](), primary_key=c.primary_key, nullable=not c.not_null, autoincrement=False)
            for c in _columns(spec)
        ),
    )


_METADATA: Final = sa.MetaData()
TABLES: Final[dict[str, sa.Table]] = {
    name: _table(_METADATA, name, spec) for name, spec in {**LAKE_COLUMNS, **OWN_COLUMNS}.items()
}
"""Every catalog table by name, for inserts that name their columns (``sa.insert(TABLES[name])``)."""
