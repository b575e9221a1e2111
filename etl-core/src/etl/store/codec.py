"""Lossless text forms of stored values, shared by every durable store.

LSNs are unsigned 64-bit; as 16 upper-case hex digits they keep the full range and sort as text in
the same order as numbers, in any database. Table schemas and destination-private metadata are
stored as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from etl.lsn import Lsn
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl.store.base import TableActivity

SCHEMA_FORMAT = 1
"""Version of the JSON layout of a stored table schema."""


def check_lsn(value: int) -> Lsn:
    """``value`` as an ``Lsn``; ``ValueError`` when it is not an unsigned 64-bit integer."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= Lsn.MAX:
        raise ValueError(f"not an LSN (an unsigned 64-bit integer): {value!r}")
    return value if type(value) is Lsn else Lsn(value)


def lsn_to_text(lsn: int) -> str:
    return f"{check_lsn(lsn):016X}"


def lsn_from_text(text: str) -> Lsn:
    if len(text) != 16:
        raise ValueError(f"not a stored LSN: {text!r}")
    return Lsn(int(text, 16))


def schema_to_obj(schema: TableSchema) -> dict[str, Any]:
    """A table schema as plain JSON values."""
    return {
        "format": SCHEMA_FORMAT,
        "id": schema.id,
        "name": {"schema": schema.name.schema, "name": schema.name.name},
        "columns": [
            {
                "name": c.name,
                "type_oid": c.type_oid,
                "type_modifier": c.type_modifier,
                "nullable": c.nullable,
                "primary_key": c.primary_key,
                "type_name": c.type_name,
                "attnum": c.attnum,
                "default": c.default,
                "missing_value": c.missing_value,
            }
            for c in schema.columns
        ],
        "replica_identity": schema.replica_identity.value,
        "snapshot_lsn": lsn_to_text(schema.snapshot_lsn),
        "partitions": None if schema.partitions is None else list(schema.partitions),
        "attachments": None if schema.attachments is None else [list(a) for a in schema.attachments],
    }


def schema_from_obj(data: Any) -> TableSchema:
    """Parse what ``schema_to_obj`` made; ``ValueError`` for anything else."""
    try:
        if data["format"] != SCHEMA_FORMAT:
            raise ValueError(f"unknown table schema format {data['format']!r}")
        return TableSchema(
            id=int(data["id"]),
            name=TableName(data["name"]["schema"], data["name"]["name"]),
            columns=tuple(
                ColumnSchema(
                    name=c["name"],
                    type_oid=int(c["type_oid"]),
                    type_modifier=int(c["type_modifier"]),
                    nullable=bool(c["nullable"]),
                    primary_key=bool(c["primary_key"]),
                    type_name=c["type_name"],
                    attnum=c.get("attnum"),  # absent in versions stored before these keys existed
                    default=c.get("default"),
                    missing_value=c.get("missing_value"),
                )
                for c in data["columns"]
            ),
            replica_identity=ReplicaIdentity(data["replica_identity"]),
            snapshot_lsn=lsn_from_text(data["snapshot_lsn"]),
            partitions=None if data.get("partitions") is None else tuple(int(p) for p in data["partitions"]),
            attachments=None
            if data.get("attachments") is None
            else tuple((int(oid), int(xid)) for oid, xid in data["attachments"]),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a stored table schema: {type(exc).__name__}: {exc}") from None


def schema_to_json(schema: TableSchema) -> str:
    return json.dumps(schema_to_obj(schema), separators=(",", ":"))


def schema_from_json(text: str) -> TableSchema:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not a stored table schema: {exc}") from None
    return schema_from_obj(data)


def extra_to_json(extra: Mapping[str, Any]) -> str:
    """Destination-private metadata as JSON; ``ValueError`` when it is not JSON-serialisable."""
    try:
        return json.dumps(extra, default=_mapping_as_dict, allow_nan=False, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"destination metadata 'extra' must be JSON-serialisable: {exc}") from None


def extra_from_json(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"stored destination metadata 'extra' is not a JSON object: {text[:80]!r}")
    return value


def _mapping_as_dict(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def activity_to_obj(activity: TableActivity) -> dict[str, Any]:
    """A table's activity as JSON values (the snapshot stores' documents, ``etl status --format json``)."""
    return {
        "inserts": activity.inserts,
        "updates": activity.updates,
        "deletes": activity.deletes,
        "truncates": activity.truncates,
        "since": activity.since.isoformat(),
        "last_write_at": activity.last_write_at.isoformat(),
    }


def activity_from_obj(obj: Mapping[str, Any]) -> TableActivity:
    return TableActivity(
        int(obj["inserts"]),
        int(obj["updates"]),
        int(obj["deletes"]),
        int(obj["truncates"]),
        datetime.fromisoformat(obj["since"]),
        datetime.fromisoformat(obj["last_write_at"]),
    )
