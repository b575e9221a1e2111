"""The plugin API: every name a destination or store plugin needs, in one place.

Plugins import from here (``etl.api``; ``etl.api.sql`` for stores built on SQLAlchemy) and from ``etl.testing``
for the test kits, and from nothing else of ``etl``: the other modules are the engine's, free to change in any
release. A contract in the test suite (import-linter, ``pyproject.toml``) holds this repository's plugins to it.
docs/plugins.md lists these names and says what they promise; the CHANGELOG says how their versions change.

Each name is imported from its home module when first used (PEP 562), so a plugin loads only what it uses: a
store does not pay for pyarrow, nor ``etl status`` for the copy's libpq code. Type checkers read the imports
below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl.config import Integer, PipelineConfig, PostgresConnection
    from etl.config_validation import validate
    from etl.copy_plan import (
        RANGES_PER_CONNECTION,
        CopyPlan,
        CopyRange,
        CopyStopped,
        CtidRange,
    )
    from etl.destination.base import (
        Destination,
        DestinationContext,
        DestinationFactory,
        InProcessDestination,
        Paced,
        PreviewableDestination,
        TableCopier,
        TablePreview,
        WriteResult,
    )
    from etl.errors import (
        ConfigError,
        DestinationError,
        EtlError,
        PipelineLockedError,
        PluginError,
        RuntimeSetupError,
        SourceError,
        StoreError,
        TableError,
        TableErrors,
        TransientError,
        TypeChangeError,
        naming_table,
    )
    from etl.events import (
        COMMIT_LSN_COLUMN,
        MISSING,
        MISSING_COLUMN,
        OLD_COLUMN,
        OLD_IS_KEY_COLUMN,
        OP_COLUMN,
        TX_ORDINAL_COLUMN,
        BeginEvent,
        CommitEvent,
        DeleteEvent,
        Event,
        EventBatch,
        InsertEvent,
        RelationEvent,
        TableChanges,
        TruncateEvent,
        UpdateEvent,
    )
    from etl.filelock import FileLock
    from etl.hookspecs import PluginFactory
    from etl.lsn import Lsn
    from etl.metrics import LATENCY_BUCKETS, MetricsHolder
    from etl.plugins import hookimpl
    from etl.postgres.codecs import (
        BUILTIN_ARRAYS,
        NUMERIC_OID,
        arrow_field,
        arrow_type,
        python_values,
    )
    from etl.postgres.connection import connect
    from etl.postgres.copy import read_ranges
    from etl.preflight import Check, file_to_create, writable_directory
    from etl.schema import (
        ColumnSchema,
        ReplicaIdentity,
        TableId,
        TableName,
        TableNameError,
        TableSchema,
        match_columns,
        quote_ident,
        quote_literal,
        renamed_in_place,
    )
    from etl.store.base import (
        APPLY_WORKER,
        CopyProgress,
        DestinationSchemaStatus,
        DestinationTableMetadata,
        RetryKind,
        Store,
        StoreFactory,
        TableActivity,
        TableState,
        TableStateKind,
        merged_request,
        table_sync_worker,
    )
    from etl.store.cached import CachedStore, StateRow
    from etl.store.codec import (
        lsn_from_text,
        lsn_to_text,
        schema_from_json,
        schema_from_obj,
        schema_to_json,
        schema_to_obj,
    )
    from etl.store.snapshot import SnapshotStore

_HOMES: dict[str, str] = {
    "Integer": "etl.config",
    "PipelineConfig": "etl.config",
    "PostgresConnection": "etl.config",
    "validate": "etl.config_validation",
    "RANGES_PER_CONNECTION": "etl.copy_plan",
    "CopyPlan": "etl.copy_plan",
    "CopyRange": "etl.copy_plan",
    "CopyStopped": "etl.copy_plan",
    "CtidRange": "etl.copy_plan",
    "Destination": "etl.destination.base",
    "DestinationContext": "etl.destination.base",
    "DestinationFactory": "etl.destination.base",
    "InProcessDestination": "etl.destination.base",
    "Paced": "etl.destination.base",
    "PreviewableDestination": "etl.destination.base",
    "TableCopier": "etl.destination.base",
    "TablePreview": "etl.destination.base",
    "WriteResult": "etl.destination.base",
    "ConfigError": "etl.errors",
    "DestinationError": "etl.errors",
    "EtlError": "etl.errors",
    "PipelineLockedError": "etl.errors",
    "PluginError": "etl.errors",
    "RuntimeSetupError": "etl.errors",
    "SourceError": "etl.errors",
    "StoreError": "etl.errors",
    "TableError": "etl.errors",
    "TableErrors": "etl.errors",
    "TransientError": "etl.errors",
    "TypeChangeError": "etl.errors",
    "naming_table": "etl.errors",
    "COMMIT_LSN_COLUMN": "etl.events",
    "MISSING": "etl.events",
    "MISSING_COLUMN": "etl.events",
    "OLD_COLUMN": "etl.events",
    "OLD_IS_KEY_COLUMN": "etl.events",
    "OP_COLUMN": "etl.events",
    "TX_ORDINAL_COLUMN": "etl.events",
    "BeginEvent": "etl.events",
    "CommitEvent": "etl.events",
    "DeleteEvent": "etl.events",
    "Event": "etl.events",
    "EventBatch": "etl.events",
    "InsertEvent": "etl.events",
    "RelationEvent": "etl.events",
    "TableChanges": "etl.events",
    "TruncateEvent": "etl.events",
    "UpdateEvent": "etl.events",
    "FileLock": "etl.filelock",
    "PluginFactory": "etl.hookspecs",
    "Lsn": "etl.lsn",
    "LATENCY_BUCKETS": "etl.metrics",
    "MetricsHolder": "etl.metrics",
    "hookimpl": "etl.plugins",
    "BUILTIN_ARRAYS": "etl.postgres.codecs",
    "NUMERIC_OID": "etl.postgres.codecs",
    "arrow_field": "etl.postgres.codecs",
    "arrow_type": "etl.postgres.codecs",
    "python_values": "etl.postgres.codecs",
    "connect": "etl.postgres.connection",
    "read_ranges": "etl.postgres.copy",
    "Check": "etl.preflight",
    "file_to_create": "etl.preflight",
    "writable_directory": "etl.preflight",
    "ColumnSchema": "etl.schema",
    "ReplicaIdentity": "etl.schema",
    "TableId": "etl.schema",
    "TableName": "etl.schema",
    "TableNameError": "etl.schema",
    "TableSchema": "etl.schema",
    "match_columns": "etl.schema",
    "quote_ident": "etl.schema",
    "quote_literal": "etl.schema",
    "renamed_in_place": "etl.schema",
    "APPLY_WORKER": "etl.store.base",
    "CopyProgress": "etl.store.base",
    "DestinationSchemaStatus": "etl.store.base",
    "DestinationTableMetadata": "etl.store.base",
    "RetryKind": "etl.store.base",
    "Store": "etl.store.base",
    "StoreFactory": "etl.store.base",
    "TableActivity": "etl.store.base",
    "TableState": "etl.store.base",
    "TableStateKind": "etl.store.base",
    "merged_request": "etl.store.base",
    "table_sync_worker": "etl.store.base",
    "CachedStore": "etl.store.cached",
    "StateRow": "etl.store.cached",
    "lsn_from_text": "etl.store.codec",
    "lsn_to_text": "etl.store.codec",
    "schema_from_json": "etl.store.codec",
    "schema_from_obj": "etl.store.codec",
    "schema_to_json": "etl.store.codec",
    "schema_to_obj": "etl.store.codec",
    "SnapshotStore": "etl.store.snapshot",
}
"""Where each name of the API lives."""

__all__ = [
    "APPLY_WORKER",
    "BUILTIN_ARRAYS",
    "COMMIT_LSN_COLUMN",
    "LATENCY_BUCKETS",
    "MISSING",
    "MISSING_COLUMN",
    "NUMERIC_OID",
    "OLD_COLUMN",
    "OLD_IS_KEY_COLUMN",
    "OP_COLUMN",
    "RANGES_PER_CONNECTION",
    "TX_ORDINAL_COLUMN",
    "BeginEvent",
    "CachedStore",
    "Check",
    "ColumnSchema",
    "CommitEvent",
    "ConfigError",
    "CopyPlan",
    "CopyProgress",
    "CopyRange",
    "CopyStopped",
    "CtidRange",
    "DeleteEvent",
    "Destination",
    "DestinationContext",
    "DestinationError",
    "DestinationFactory",
    "DestinationSchemaStatus",
    "DestinationTableMetadata",
    "EtlError",
    "Event",
    "EventBatch",
    "FileLock",
    "InProcessDestination",
    "InsertEvent",
    "Integer",
    "Lsn",
    "MetricsHolder",
    "Paced",
    "PipelineConfig",
    "PipelineLockedError",
    "PluginError",
    "PluginFactory",
    "PostgresConnection",
    "PreviewableDestination",
    "RelationEvent",
    "ReplicaIdentity",
    "RetryKind",
    "RuntimeSetupError",
    "SnapshotStore",
    "SourceError",
    "StateRow",
    "Store",
    "StoreError",
    "StoreFactory",
    "TableActivity",
    "TableChanges",
    "TableCopier",
    "TableError",
    "TableErrors",
    "TableId",
    "TableName",
    "TableNameError",
    "TablePreview",
    "TableSchema",
    "TableState",
    "TableStateKind",
    "TransientError",
    "TruncateEvent",
    "TypeChangeError",
    "UpdateEvent",
    "WriteResult",
    "arrow_field",
    "arrow_type",
    "connect",
    "file_to_create",
    "hookimpl",
    "lsn_from_text",
    "lsn_to_text",
    "match_columns",
    "merged_request",
    "naming_table",
    "python_values",
    "quote_ident",
    "quote_literal",
    "read_ranges",
    "renamed_in_place",
    "schema_from_json",
    "schema_from_obj",
    "schema_to_json",
    "schema_to_obj",
    "table_sync_worker",
    "validate",
    "writable_directory",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later look-ups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
