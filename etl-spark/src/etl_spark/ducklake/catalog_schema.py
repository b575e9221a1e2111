"""The DuckLake 1.0 catalog tables, created the way DuckDB 1.5.5 creates them, plus this writer's state table.

In SQLite DuckDB stores BOOLEAN as BIGINT (0/1) and UUID and TIMESTAMPTZ as VARCHAR; in Postgres it
uses the native types. Creating the tables the same way keeps a lake bootstrapped here identical to
one DuckDB bootstrapped.
"""

from __future__ import annotations

from typing import Final

SPEC_VERSION: Final = "1.0"

# table -> "column TYPE, ..." in DuckDB's column order; TYPE is one of BIGINT, VARCHAR, BOOLEAN, UUID,
# TIMESTAMPTZ, optionally followed by PRIMARY KEY or NOT NULL.
TABLES: Final[dict[str, str]] = {
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
"""This writer's own table: which lake table holds a pipeline's source table, and the replication watermark."""

COLUMNS_TABLE: Final = "etl_ducklake_source_columns"
"""The source column each column of a lake table holds: its Postgres attribute number (``attnum``, a column's
identity across renames; NULL when unknown), type OID and type modifier."""

LEGACY_COLUMNS_TABLE: Final = "etl_ducklake_columns"
"""Attribute numbers only, as earlier versions of this writer recorded them; moved into ``COLUMNS_TABLE`` at open."""

STATE_DDL: Final = (
    f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} (pipeline_id BIGINT NOT NULL, source_table_id BIGINT NOT NULL,"
    " table_id BIGINT NOT NULL, commit_lsn BIGINT NOT NULL, tx_ordinal BIGINT NOT NULL,"
    " PRIMARY KEY (pipeline_id, source_table_id))",
    f"CREATE TABLE IF NOT EXISTS {COLUMNS_TABLE} (table_id BIGINT NOT NULL, column_id BIGINT NOT NULL,"
    " attnum BIGINT, type_oid BIGINT NOT NULL, type_modifier BIGINT NOT NULL, PRIMARY KEY (table_id, column_id))",
)
"""This writer's tables, created when missing (also in lakes it opens for the first time)."""

_SQLITE_TYPES: Final = {"BOOLEAN": "BIGINT", "UUID": "VARCHAR", "TIMESTAMPTZ": "VARCHAR"}
_QUOTED: Final = {"key", "value", "scope", "sql", "type", "transform"}


def create_statements(dialect: str) -> list[str]:
    """``CREATE TABLE`` statements for every catalog table, in the types DuckDB uses on ``dialect``."""
    statements = []
    for table, spec in TABLES.items():
        columns = []
        for column in spec.split(","):
            name, kind, *rest = column.split()
            if dialect == "sqlite":
                kind = _SQLITE_TYPES.get(kind, kind)
            columns.append(" ".join([f'"{name}"' if name in _QUOTED else name, kind, *rest]))
        statements.append(f"CREATE TABLE {table} ({', '.join(columns)})")
    return [*statements, *STATE_DDL]
