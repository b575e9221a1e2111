"""Pre-flight checks of a source database, each with a pass/fail verdict and the fix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import psycopg

from etl.config import PipelineConfig, PluginSection
from etl.errors import EtlError
from etl.factory import build_store, validate_plugin
from etl.pipeline import apply_slot_lost, copy_names_error, slot_lost_error
from etl.plugins import Registry, load_registry
from etl.postgres.connection import connect
from etl.postgres.ddl import ddl_trigger_installed, ddl_trigger_outdated
from etl.postgres.key_order import snapshot_copy_reason
from etl.postgres.slot_state import slot_state
from etl.preflight import Check, DeepPreflighted, Preflighted
from etl.replication.slots import apply_slot
from etl.schema import TableName


def run_checks(
    config: PipelineConfig, source: str = "config", registry: Registry | None = None, *, deep: bool = False
) -> list[Check]:
    """Every check, in order: the source (the rest of its checks are skipped when it cannot be reached), then
    the store and destination sections (with ``deep``, their slower checks too), then the apply slot against the
    store's progress. ``source`` names the config file in messages."""
    plugins = _plugin_checks(config, source, registry, deep)
    try:
        conn = connect(config.source)
    except EtlError as exc:
        return [Check("source reachable", False, exc.message, exc.hint), *plugins]
    with conn:
        checks = [
            Check("source reachable", True, f"connected to {config.source.describe()}"),
            *_checks(conn, config),
            *plugins,
        ]
        if not any(c.failed for c in plugins):
            checks.append(_apply_slot_check(conn, config, source, registry))
        return checks


def _apply_slot_check(
    conn: psycopg.Connection[Any], config: PipelineConfig, source: str, registry: Registry | None
) -> Check:
    """The apply slot is on the source whenever the store holds progress that only it can continue from (it is
    missing after a failover to a standby without a synced copy, or once dropped by hand)."""
    slot = apply_slot(config.pipeline.id)
    state = slot_state(conn, slot)
    if state.exists and not state.invalidated:
        return Check("apply slot", True, f"{slot} is here" + (", a failover slot" if state.failover else ""))
    try:
        store = build_store(config, source, registry)
    except EtlError as exc:
        return Check(
            "apply slot", False, f"{slot} is not usable, and the store could not be read: {exc.message}", exc.hint
        )
    try:
        lost = apply_slot_lost(state, store)
    finally:
        store.close()
    if not lost:
        return Check("apply slot", True, f"{slot} is made by the first `etl run`")
    error = slot_lost_error(slot, state, source)
    return Check("apply slot", False, error.message, error.hint)


_GUIDES = {
    ("destination", "ducklake"): "docs/destinations/ducklake.md",
    ("destination", "bigquery"): "docs/destinations/bigquery.md",
    ("destination", "memory"): "docs/configuration.md",
    ("destination", "null"): "docs/configuration.md",
}
"""The guides of the plugins this project ships; the others are documented by their own packages."""


def _guide(kind: Literal["store", "destination"], name: str) -> str:
    if (kind, name) in _GUIDES:
        return _GUIDES[kind, name]
    if kind == "store":
        return "docs/stores.md"
    return f"the documentation of the package that provides the {name!r} destination (etl plugins names it)"


def _plugin_checks(config: PipelineConfig, source: str, registry: Registry | None, deep: bool) -> list[Check]:
    """The store and destination sections name installed plugins and hold options those accept; then each
    plugin's own ``preflight`` checks (``etl.preflight``), when it has them, without creating anything, and with
    ``deep`` its ``deep_preflight`` checks once the others passed.
    """
    try:
        registry = registry or load_registry()
    except EtlError as exc:
        return [Check("plugins", False, exc.message, exc.hint)]
    checks = []
    sections: tuple[tuple[Literal["store", "destination"], PluginSection], ...] = (
        ("store", config.store),
        ("destination", config.destination),
    )
    for kind, section in sections:
        try:
            cls, options = validate_plugin(registry, kind, section, source)
        except EtlError as exc:
            checks.append(
                Check(kind, False, exc.message, exc.hint or f"fix the section, see {_guide(kind, section.type)}")
            )
            continue
        checks.append(Check(kind, True, f"{kind} '{section.type}': the options are valid"))
        own: list[Check] = []
        try:
            if isinstance(cls, Preflighted):
                own += cls.preflight(options)
            if deep and isinstance(cls, DeepPreflighted) and not any(c.failed for c in own):
                own += cls.deep_preflight(options)
        except EtlError as exc:
            own.append(Check(f"{kind} '{section.type}'", False, exc.message, exc.hint))
        checks += own
    return checks


def _one(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    return row[0] if row else None


def _checks(conn: psycopg.Connection[Any], config: PipelineConfig) -> Iterator[Check]:
    wal_level = _one(conn, "SHOW wal_level")
    yield Check(
        "wal_level",
        wal_level == "logical",
        f"wal_level is '{wal_level}'" + ("" if wal_level == "logical" else ", logical replication needs 'logical'"),
        "ALTER SYSTEM SET wal_level = logical; then restart Postgres",
    )

    yield from _standby_checks(conn)

    user = config.source.user
    may_replicate = _one(conn, "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user")
    yield Check(
        "replication privilege",
        bool(may_replicate),
        f"role '{user}' " + ("may replicate" if may_replicate else "has neither REPLICATION nor SUPERUSER"),
        f'ALTER ROLE "{user}" WITH REPLICATION;',
    )

    pub = config.pipeline.publication
    exists = _one(conn, "SELECT count(*) FROM pg_publication WHERE pubname = %s", (pub,))
    tables = conn.execute(
        """
        SELECT c.oid, format('%%I.%%I', n.nspname, c.relname), c.relreplident,
               EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
               EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident),
               has_table_privilege(c.oid, 'SELECT'), row_security_active(c.oid)
        FROM pg_publication_tables pt
        JOIN pg_namespace n ON n.nspname = pt.schemaname
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
        WHERE pt.pubname = %s ORDER BY 2
        """,
        (pub,),
    ).fetchall()
    if not exists:
        yield Check(
            "publication", False, f"publication '{pub}' does not exist", f"CREATE PUBLICATION {pub} FOR TABLE ...;"
        )
    elif not tables:
        yield Check(
            "publication", False, f"publication '{pub}' has no tables", f"ALTER PUBLICATION {pub} ADD TABLE ...;"
        )
    else:
        yield Check("publication", True, f"publication '{pub}' has {len(tables)} table(s)")
        unpublished = config.copy_.unpublished({TableName.parse(name) for _, name, *_ in tables})
        if unpublished:
            error = copy_names_error(pub, unpublished)
            yield Check("copy tables", False, error.message, error.hint)

    unusable = []
    unreadable = []
    filtered = []  # by row-level security: the role is neither the owner, nor BYPASSRLS, nor a superuser
    for _oid, name, ident, has_pk, has_ident_index, readable, policed in tables:
        usable = ident == "f" or (ident == "d" and has_pk) or (ident == "i" and has_ident_index)
        if not usable:
            unusable.append(name)
        if not readable:
            unreadable.append(name)
        if policed:
            filtered.append(name)
    if tables:
        yield Check(
            "replica identity",
            not unusable,
            "every published table has a usable replica identity"
            if not unusable
            else f"updates and deletes cannot be replicated for: {', '.join(unusable)} (no primary key and no"
            " replica identity)",
            "add a primary key, or ALTER TABLE <table> REPLICA IDENTITY FULL;",
        )
        yield Check(
            "table privileges",
            not unreadable,
            "the role may read every published table"
            if not unreadable
            else f"role '{user}' may not SELECT from: {', '.join(unreadable)}",
            f'GRANT SELECT ON <table> TO "{user}";',
        )
        yield Check(
            "row-level security",
            not filtered,
            "no published table hides rows from the role by row-level security"
            if not filtered
            else f"row-level security hides rows of {', '.join(filtered)} from role '{user}' (the stream has every"
            " row, a copy would not): their copies fail",
            f'ALTER ROLE "{user}" BYPASSRLS; (as a superuser), or ALTER TABLE <table> DISABLE ROW LEVEL SECURITY;',
        )

    if tables and config.copy_.method == "incremental":
        by_snapshot = [f"{name} ({why})" for oid, name, *_ in tables if (why := snapshot_copy_reason(conn, oid))]
        yield Check(
            "incremental copy",
            not by_snapshot,
            "every published table has a key to copy in chunks by"
            if not by_snapshot
            else f"copied by snapshot instead: {'; '.join(by_snapshot)}",
            "give the table a primary key (or REPLICA IDENTITY USING INDEX on a unique index of not-null columns)",
            advisory=True,
        )

    if config.pipeline.install_ddl_trigger:
        installed = ddl_trigger_installed(conn)
        outdated = not installed and ddl_trigger_outdated(conn)
        may_install = bool(
            _one(conn, "SELECT rolsuper AND NOT pg_is_in_recovery() FROM pg_roles WHERE rolname = current_user")
        )
        yield Check(
            "schema change trigger",
            installed or may_install,
            "installed"
            if installed
            else f"will be {'updated' if outdated else 'installed'} when the pipeline starts"
            if may_install
            else "an earlier version is installed, and the pipeline may not update it (a standby, or a role that is"
            " not a superuser): it may miss what this version reports (ALTER SCHEMA renames)"
            if outdated
            else "not installed, and the pipeline may not install it (a standby, or a role that is not a superuser):"
            " nullability, defaults and renames of columns are not seen",
            "have a superuser run what `etl ddl-trigger --print-sql` prints on the primary (pipe it into psql), or"
            " set [pipeline] install_ddl_trigger = false",
            advisory=True,
        )

    needed_slots = 1 + config.pipeline.table_sync_workers
    slot_exists = _one(
        conn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (apply_slot(config.pipeline.id),)
    )
    max_slots = int(_one(conn, "SHOW max_replication_slots"))
    used_slots = int(_one(conn, "SELECT count(*) FROM pg_replication_slots"))
    free_slots = max_slots - used_slots + (1 if slot_exists else 0)
    yield Check(
        "replication slots",
        free_slots >= needed_slots,
        f"{free_slots} of {max_slots} slots free; the pipeline needs up to {needed_slots} (1 + table_sync_workers)",
        f"raise max_replication_slots to at least {used_slots + needed_slots} and restart Postgres, or lower"
        " [pipeline] table_sync_workers",
    )

    max_senders = int(_one(conn, "SHOW max_wal_senders"))
    used_senders = int(_one(conn, "SELECT count(*) FROM pg_stat_replication"))
    free_senders = max_senders - used_senders
    yield Check(
        "wal senders",
        free_senders >= needed_slots,
        f"{free_senders} of {max_senders} WAL senders free; the pipeline needs up to {needed_slots}",
        f"raise max_wal_senders to at least {used_senders + needed_slots} and restart Postgres",
    )


def _standby_checks(conn: psycopg.Connection[Any]) -> Iterator[Check]:
    """A standby can be the source from Postgres 16 on, and keeps its slots valid only with feedback to the
    primary."""
    if not _one(conn, "SELECT pg_is_in_recovery()"):
        return
    major = conn.info.server_version // 10000
    yield Check(
        "standby",
        major >= 16,
        f"the source is a standby of Postgres {major}"
        + (
            ": the slots live here (making one waits for the primary's next WAL write); the publication and the"
            " schema change trigger are made on the primary"
            if major >= 16
            else ", and logical decoding on a standby needs Postgres 16 or later"
        ),
        "point [source] at the primary, or upgrade to Postgres 16 or later",
    )
    if major < 16:
        return
    feedback = _one(conn, "SHOW hot_standby_feedback") == "on"
    yield Check(
        "hot_standby_feedback",
        feedback,
        "on" if feedback else "off: the primary may remove catalog rows the slots here need, which invalidates them",
        "ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf(); (on the standby; and give it a"
        " physical slot on the primary: primary_slot_name)",
        advisory=True,
    )
