"""The source-side DDL event trigger: every ``ALTER TABLE`` reports the table's new shape in the stream.

pgoutput's RELATION messages carry column names, types and key flags, but not nullability,
defaults or attribute numbers (so a rename looks like a drop plus an add). The event trigger
fills that gap: at ``ddl_command_end`` of ``ALTER TABLE`` it emits, for each changed table that
a publication publishes, a *transactional* logical message (``pg_logical_emit_message``) whose
content is the table's full column list as JSON. Being transactional, the message is decoded in
its transaction at the position of the DDL, before the table's following rows. ``ALTER SCHEMA``
fires it too, for each published table of the schema: a renamed schema renames its tables, and
pgoutput before Postgres 18 sends no RELATION message for that.

The trigger emits every live column and the published column names of each publication; the
engine keeps what its own publication publishes (``SchemaChange.table_schema``). Creating an event
trigger needs superuser; the SQL of ``install_sql()`` has no dependency on this package, so an
administrator can run it by hand.

Any role that may log in can call ``pg_logical_emit_message`` and put a message with this prefix in
the WAL. So the trigger also records the LSN of each message it emits, in the same transaction, in
``etl.schema_change_messages``, a table only its owner (the superuser who installed the trigger) can
write; the function runs as that owner (``SECURITY DEFINER``, with a fixed ``search_path``). The
engine acts on a message only when its LSN is recorded there (``schema_change_recorded``): a forged
message has an LSN the table never holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import psycopg
import structlog

from etl.errors import SourceError
from etl.lsn import Lsn
from etl.postgres.catalog import OWN_SCHEMA
from etl.schema import ColumnSchema, ReplicaIdentity, TableId, TableName, TableSchema

log = structlog.get_logger(__name__)

MESSAGE_PREFIX: Final = "etl.ddl"
"""Prefix of the logical messages the trigger emits."""
FORMAT_VERSION: Final = 1
"""Version of the message content (``"v"``); bumped when its shape changes incompatibly."""
TRIGGER_SCHEMA: Final = OWN_SCHEMA
FUNCTION_NAME: Final = f"{TRIGGER_SCHEMA}.emit_schema_change"
TRIGGER_NAME: Final = "etl_schema_change"
MESSAGES_TABLE: Final = f"{TRIGGER_SCHEMA}.schema_change_messages"
"""Where the trigger records the LSN of every message it emits (see the module docstring)."""
MIN_SERVER_VERSION: Final = 140000
"""Logical messages reach a pgoutput client from Postgres 14 on (the ``messages`` option)."""
MAX_MESSAGE_BYTES: Final = 4 << 20
"""The most a message of the engine's prefixes may have; the stream drops larger ones unread.

A trigger message of a table with the most columns Postgres allows (1600) is a few hundred KB, and
about 100 KB more per publication that lists its columns. Any role may emit messages of up to 1 GB.
"""

TRIGGER_TAGS: Final = ("ALTER SCHEMA", "ALTER TABLE")
"""The commands that fire the trigger: ``ALTER SCHEMA`` for its renames (every published table of the schema
gets a new name, and pgoutput before 18 sends no RELATION for it)."""
_TAGS_SQL: Final = "(" + ", ".join(f"'{tag}'" for tag in TRIGGER_TAGS) + ")"

# The function body. It runs as its owner (SECURITY DEFINER) so that it may record the message's
# LSN in MESSAGES_TABLE, which no other role may write. The message is emitted in the
# (sub)transaction of the DDL itself, never inside an EXCEPTION block: a subtransaction that holds
# nothing but a logical message is decoded after its parent's changes, out of order (seen on 15
# and 18). Only building the payload is guarded, so an unexpected catalog error never fails the
# user's DDL (the schema change is then still seen, with less detail, from RELATION messages).
_FUNCTION_BODY: Final = f"""
DECLARE
    rel oid;
    payload text;
    message_lsn pg_lsn;
BEGIN
    FOR rel IN
        WITH RECURSIVE changed(relid) AS (
            SELECT c.objid FROM pg_event_trigger_ddl_commands() c
            WHERE c.classid = 'pg_catalog.pg_class'::regclass
          UNION
            SELECT t.oid FROM pg_event_trigger_ddl_commands() c JOIN pg_class t ON t.relnamespace = c.objid
            WHERE c.classid = 'pg_catalog.pg_namespace'::regclass
          UNION
            SELECT i.inhrelid FROM pg_inherits i JOIN changed ON i.inhparent = changed.relid
        )
        SELECT t.oid FROM changed JOIN pg_class t ON t.oid = changed.relid
        WHERE t.relkind IN ('r', 'p') AND t.relpersistence = 'p'
        ORDER BY t.oid
    LOOP
        BEGIN
            SELECT jsonb_build_object(
                       'v', {FORMAT_VERSION},
                       'server_version_num', current_setting('server_version_num')::int,
                       'oid', t.oid::bigint,
                       'schema', n.nspname,
                       'name', t.relname,
                       'replica_identity', t.relreplident,
                       'publications', pubs.map,
                       'columns', cols.list)::text
              INTO payload
              FROM pg_class t
              JOIN pg_namespace n ON n.oid = t.relnamespace
              CROSS JOIN LATERAL (
                  SELECT jsonb_object_agg(pt.pubname, to_jsonb(pt) -> 'attnames') AS map
                  FROM pg_publication_tables pt
                  WHERE pt.schemaname = n.nspname AND pt.tablename = t.relname) pubs
              CROSS JOIN LATERAL (
                  SELECT jsonb_agg(jsonb_build_object(
                             'attnum', a.attnum,
                             'name', a.attname,
                             'type_oid', a.atttypid::bigint,
                             'type_modifier', a.atttypmod,
                             'type_name', format_type(a.atttypid, a.atttypmod)
                                          || repeat('[]', greatest(a.attndims - 1, 0)),
                             'not_null', a.attnotnull,
                             'default', CASE WHEN a.attgenerated = '' THEN pg_get_expr(d.adbin, d.adrelid) END,
                             'missing', CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END,
                             'generated', a.attgenerated,
                             'key', EXISTS (
                                 SELECT 1 FROM pg_index i
                                 WHERE i.indrelid = t.oid AND a.attnum = ANY (i.indkey)
                                   AND CASE WHEN t.relreplident = 'i' THEN i.indisreplident
                                            ELSE i.indisprimary END))
                         ORDER BY a.attnum) AS list
                  FROM pg_attribute a
                  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                  WHERE a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped) cols
              WHERE t.oid = rel AND pubs.map IS NOT NULL;
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'etl: no schema change message for table %: %', rel::regclass, SQLERRM;
            payload := NULL;
        END;
        IF payload IS NOT NULL THEN
            message_lsn := pg_logical_emit_message(true, '{MESSAGE_PREFIX}', payload);
            INSERT INTO {MESSAGES_TABLE} (lsn, table_oid) VALUES (message_lsn, rel);
        END IF;
    END LOOP;
END;
"""


def install_sql() -> str:
    """The SQL that installs (or updates) the trigger; idempotent, needs superuser, no other dependency."""
    return f"""CREATE SCHEMA IF NOT EXISTS {TRIGGER_SCHEMA};
REVOKE CREATE ON SCHEMA {TRIGGER_SCHEMA} FROM PUBLIC;
GRANT USAGE ON SCHEMA {TRIGGER_SCHEMA} TO PUBLIC;
CREATE TABLE IF NOT EXISTS {MESSAGES_TABLE} (
    lsn pg_lsn PRIMARY KEY,
    table_oid oid NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON TABLE {MESSAGES_TABLE} FROM PUBLIC;
GRANT SELECT ON TABLE {MESSAGES_TABLE} TO PUBLIC;
CREATE OR REPLACE FUNCTION {FUNCTION_NAME}() RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, MDY'
SET IntervalStyle = 'postgres'
SET TimeZone = 'UTC'
SET extra_float_digits = 3
SET bytea_output = 'hex'
AS $etl$
{_FUNCTION_BODY.strip()}
$etl$;
DROP EVENT TRIGGER IF EXISTS {TRIGGER_NAME};
CREATE EVENT TRIGGER {TRIGGER_NAME} ON ddl_command_end WHEN TAG IN {_TAGS_SQL}
    EXECUTE FUNCTION {FUNCTION_NAME}();
"""


def uninstall_sql() -> str:
    """The SQL that removes the trigger and its function (and the schema when nothing else is in it)."""
    return f"""DROP EVENT TRIGGER IF EXISTS {TRIGGER_NAME};
DROP FUNCTION IF EXISTS {FUNCTION_NAME}();
DROP TABLE IF EXISTS {MESSAGES_TABLE};
DO $etl$ BEGIN
    DROP SCHEMA IF EXISTS {TRIGGER_SCHEMA};
EXCEPTION WHEN dependent_objects_still_exist THEN NULL;
END $etl$;
"""


@dataclass(frozen=True)
class InstallResult:
    """Whether the trigger is in place; ``reason`` says why not (or how it got there). True-ish when installed."""

    installed: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.installed


def install_ddl_trigger(conn: psycopg.Connection[Any]) -> InstallResult:
    """Install or update the trigger when the connected role may (superuser, on a primary).

    A role that may not still gets ``installed=True`` when a superuser already installed the
    current version (by hand, with ``install_sql()``).
    """
    if conn.info.server_version < MIN_SERVER_VERSION:
        return InstallResult(False, f"Postgres {conn.info.server_version // 10000} cannot send logical messages")
    row = conn.execute(
        "SELECT rolsuper, pg_catalog.pg_is_in_recovery() FROM pg_catalog.pg_roles WHERE rolname = current_user"
    ).fetchone()
    superuser, standby = bool(row and row[0]), bool(row and row[1])
    if standby or not superuser:
        if ddl_trigger_installed(conn):  # a standby has what was installed on its primary
            return InstallResult(True, "installed on the primary" if standby else "already installed by a superuser")
        earlier = "an earlier version of the trigger is installed; " if ddl_trigger_outdated(conn) else ""
        if standby:
            return InstallResult(False, f"{earlier}the source is a standby; install the trigger on the primary")
        return InstallResult(
            False, f"{earlier}role {conn.info.user!r} is not a superuser (CREATE EVENT TRIGGER needs one)"
        )
    try:
        with conn.transaction():
            conn.execute(install_sql())
    except psycopg.errors.InsufficientPrivilege as exc:  # e.g. the schema belongs to another role
        return InstallResult(False, f"not permitted: {exc.diag.message_primary or exc}")
    log.info("DDL event trigger installed", trigger=TRIGGER_NAME, function=FUNCTION_NAME)
    return InstallResult(True, "installed")


def uninstall_ddl_trigger(conn: psycopg.Connection[Any]) -> None:
    """Remove the trigger and its function (a superuser, or the trigger's owner, must run it)."""
    with conn.transaction():
        conn.execute(uninstall_sql())
    log.info("DDL event trigger removed", trigger=TRIGGER_NAME)


def ddl_trigger_installed(conn: psycopg.Connection[Any]) -> bool:
    """True when the trigger exists, is enabled and calls the current version of the function."""
    row = conn.execute(
        """SELECT p.prosrc, e.evttags
           FROM pg_catalog.pg_event_trigger e JOIN pg_catalog.pg_proc p ON p.oid = e.evtfoid
           WHERE e.evtname = %s AND e.evtenabled <> 'D' AND e.evtevent = 'ddl_command_end'""",
        (TRIGGER_NAME,),
    ).fetchone()
    return row is not None and str(row[0]).strip() == _FUNCTION_BODY.strip() and sorted(row[1]) == list(TRIGGER_TAGS)


def ddl_trigger_outdated(conn: psycopg.Connection[Any]) -> bool:
    """True when the trigger exists but is not the current version (installed by an earlier release): it may miss
    what this version reports (``ALTER SCHEMA`` renames, the record of its messages); install it again."""
    row = conn.execute("SELECT EXISTS (SELECT FROM pg_catalog.pg_event_trigger WHERE evtname = %s)", (TRIGGER_NAME,))
    return bool(row.fetchone() == (True,)) and not ddl_trigger_installed(conn)


def schema_change_recorded(conn: psycopg.Connection[Any], lsn: Lsn) -> bool:
    """True when the trigger recorded a message at ``lsn``: the message is the trigger's, not a forgery.

    False also when the table is missing (a trigger of an earlier version, which records nothing).
    """
    try:
        with conn.transaction():
            row = conn.execute(
                f"SELECT EXISTS (SELECT FROM {MESSAGES_TABLE} WHERE lsn = %s::pg_lsn)", (str(lsn),)
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        return False
    return bool(row and row[0])


# -- the message ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TriggerColumn:
    column: ColumnSchema
    generated: str
    """``attgenerated``: empty for a plain column, ``s`` stored, ``v`` virtual (Postgres 18)."""


@dataclass(frozen=True)
class SchemaChange:
    """The content of one trigger message: a table's shape right after an ``ALTER TABLE``."""

    table_id: TableId
    name: TableName
    replica_identity: ReplicaIdentity
    columns: tuple[TriggerColumn, ...]
    """Every live column in attnum order, generated ones included."""
    publications: Mapping[str, tuple[str, ...] | None]
    """The publications that publish the table, with the column names each publishes (``None``: before 15)."""
    server_version: int

    def table_schema(self, publication: str | None, lsn: Lsn) -> TableSchema | None:
        """The schema as ``publication`` publishes it (``None`` when it does not publish the table).

        Without a publication every column that logical replication can send is kept. Generated
        columns are kept only where Postgres 18 publishes them (a stored column the publication lists).
        """
        if publication is None:
            names: tuple[str, ...] | None = None
        elif publication in self.publications:
            names = self.publications[publication]
        else:
            return None
        gen_ok = ("", "s") if self.server_version >= 180000 and names is not None else ("",)
        kept = tuple(
            c.column for c in self.columns if c.generated in gen_ok and (names is None or c.column.name in names)
        )
        return TableSchema(self.table_id, self.name, kept, self.replica_identity, lsn)


def parse_schema_change(content: bytes) -> SchemaChange:
    """Parse a trigger message; ``SourceError`` when it is not one this version understands.

    Whatever the content (it reaches the parser only once the trigger's record vouches for it, but a
    trigger of another version, or a server whose encoding is not UTF-8, may still send what this version
    cannot read), the only exception raised is ``SourceError``: no nesting, number or encoding gets past it.
    """
    if len(content) > MAX_MESSAGE_BYTES:
        raise SourceError(
            f"schema change message of {len(content)} bytes, more than the {MAX_MESSAGE_BYTES} a trigger message"
            " may have",
            hint="the DDL trigger on the source is not the one this version of etl installs; reinstall it",
        )
    try:
        doc = _object(json.loads(content.decode("utf-8")))
        version = doc.get("v")
        if version != FORMAT_VERSION:
            raise SourceError(
                f"schema change message of format {version!r}; this version of etl reads format {FORMAT_VERSION}",
                hint="reinstall the DDL trigger with this version of etl (or run its install SQL again)",
            )
        columns = tuple(_column(_object(c)) for c in _list(doc["columns"]))
        publications = {
            _text(pub): None if names is None else tuple(map(_text, _list(names)))
            for pub, names in _object(doc["publications"]).items()
        }
        return SchemaChange(
            table_id=_int(doc["oid"], 1, _MAX_OID),
            name=TableName(_text(doc["schema"]), _text(doc["name"])),
            replica_identity=ReplicaIdentity(_text(doc["replica_identity"])),
            columns=columns,
            publications=publications,
            server_version=_int(doc["server_version_num"], 0, _MAX_INT32),
        )
    except SourceError:
        raise
    except Exception as exc:  # any content: deep nesting (RecursionError), 1e999 (OverflowError), bad UTF-8, ...
        raise SourceError(
            f"malformed schema change message ({type(exc).__name__}: {str(exc)[:200]})",
            hint="the DDL trigger on the source is not the one this version of etl installs; reinstall it",
        ) from None


_MAX_OID: Final = 2**32 - 1
_MAX_INT32: Final = 2**31 - 1
_GENERATED: Final = frozenset({"", "s", "v"})


def _column(c: dict[str, Any]) -> TriggerColumn:
    generated = _text(c["generated"])
    if generated not in _GENERATED:
        raise ValueError(f"unknown attgenerated {generated!r}")
    return TriggerColumn(
        ColumnSchema(
            name=_text(c["name"]),
            type_oid=_int(c["type_oid"], 1, _MAX_OID),
            type_modifier=_int(c["type_modifier"], -1, _MAX_INT32),
            nullable=not _bool(c["not_null"]),
            primary_key=_bool(c["key"]),
            type_name=_text(c["type_name"]),
            attnum=_int(c["attnum"], 1, 2**15 - 1),
            default=None if c["default"] is None else _text(c["default"]),
            missing_value=None if c.get("missing") is None else _text(c["missing"]),  # absent from earlier triggers
        ),
        generated,
    )


def _object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a JSON array, got {type(value).__name__}")
    return value


def _text(value: object) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, got {type(value).__name__}")
    value.encode()  # a lone surrogate (JSON "\ud800") is valid JSON but no text a store or destination can hold
    return value


def _int(value: object, low: int, high: int) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"integer out of range [{low}, {high}]")
    return value


def _bool(value: object) -> bool:
    if type(value) is not bool:
        raise TypeError(f"expected true or false, got {type(value).__name__}")
    return value
