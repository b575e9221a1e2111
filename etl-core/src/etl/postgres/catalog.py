"""What the source publishes and how its tables look, read from the system catalogs.

Everything here runs over a normal connection (``etl.postgres.connection.connect``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import psycopg
import structlog

from etl.copy_plan import CtidRange
from etl.errors import SourceError, TableError
from etl.schema import ColumnSchema, ReplicaIdentity, TableId, TableName, TableSchema, quote_ident

log = structlog.get_logger(__name__)

WAL_POSITION: Final = (
    "(CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn()"
    " ELSE pg_catalog.pg_current_wal_lsn() END)"
)
"""SQL for the end of the WAL that the server's slots may decode: where it writes, or on a standby (whose slots
decode what it replayed), where its replay has got to. ``pg_current_wal_lsn()`` fails during recovery."""

WAL_INSERTED: Final = (
    "(CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn()"
    " ELSE pg_catalog.pg_current_wal_insert_lsn() END)"
)
"""SQL for a WAL position past the commit record of every transaction that a snapshot taken before it sees
committed: where records are inserted (an asynchronous commit's may not be written yet), or on a standby where
replay stands (it sees a commit once it replayed it)."""


@dataclass(frozen=True)
class PublishedTable:
    """A table as a publication publishes it."""

    id: TableId
    name: TableName
    row_filter: str | None
    """The publication's ``WHERE`` expression for the table (Postgres 15+), as SQL."""
    column_list: tuple[str, ...] | None
    """The published columns when the publication names them (Postgres 15+); ``None``: all columns."""
    partitioned: bool
    """A partitioned table published through its root (``publish_via_partition_root``)."""
    leaves: tuple[TableName, ...]
    """For a partitioned table, the leaf partitions that hold its rows; empty otherwise."""
    leaf_ids: tuple[TableId, ...] = ()
    """The OIDs of ``leaves``, in their order: what ATTACH and DETACH PARTITION change (a rename does not)."""
    attachments: tuple[tuple[TableId, int], ...] = ()
    """For a partitioned table, each partition of its tree (OID, sorted) with the transaction id that attached it
    (its ``pg_inherits`` row's ``xmin``): a partition detached and attached again has a new one."""

    @property
    def sources(self) -> tuple[TableName, ...]:
        """The tables whose rows make up this table: the leaves of a partitioned table, else itself."""
        return self.leaves if self.partitioned else (self.name,)

    @property
    def partitions(self) -> tuple[TableId, ...]:
        """``leaf_ids`` in ascending order, as ``TableSchema.partitions`` records what a copy read."""
        return tuple(sorted(self.leaf_ids))


@dataclass(frozen=True)
class PublicationOptions:
    name: str
    all_tables: bool
    inserts: bool
    updates: bool
    deletes: bool
    truncates: bool
    via_root: bool
    """``publish_via_partition_root``: partitioned tables are published as their root."""
    generated_columns: bool
    """``publish_generated_columns = stored`` (Postgres 18+): stored generated columns are published."""


def publication_exists(conn: psycopg.Connection[Any], publication: str) -> bool:
    row = conn.execute("SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = %s", (publication,)).fetchone()
    return row is not None


def publication_options(conn: psycopg.Connection[Any], publication: str) -> PublicationOptions:
    """The options of ``publication``; ``SourceError`` when it does not exist."""
    # to_jsonb(row) reads the columns each major has without a per-version query
    row = conn.execute(
        "SELECT to_jsonb(p) FROM pg_catalog.pg_publication p WHERE pubname = %s", (publication,)
    ).fetchone()
    if row is None:
        raise _missing_publication(conn, publication)
    pub: dict[str, Any] = row[0]
    return PublicationOptions(
        name=publication,
        all_tables=pub["puballtables"],
        inserts=pub["pubinsert"],
        updates=pub["pubupdate"],
        deletes=pub["pubdelete"],
        truncates=pub.get("pubtruncate", False),
        via_root=pub.get("pubviaroot", False),
        generated_columns=pub.get("pubgencols") in ("s", True),
    )


OWN_SCHEMA: Final = "etl"
"""The schema of the project's own tables on the source (the DDL trigger's record, the Postgres store's by default):
never a table the pipeline copies or streams, though a publication may publish them."""
_own_tables_logged: set[tuple[str, ...]] = set()
"""(server, database, publication, tables...) already logged as left out: once per process, not on every refresh."""


def publication_tables(conn: psycopg.Connection[Any], publication: str) -> list[PublishedTable]:
    """The tables ``publication`` publishes, ordered by name (``FOR ALL TABLES`` and schemas expanded), but for the
    pipeline's own ones (``OWN_SCHEMA``).

    With ``publish_via_partition_root`` a partitioned table is one entry (rows copied from its
    leaves); without it each leaf partition is published, and listed, on its own.
    """
    if not publication_exists(conn, publication):
        raise _missing_publication(conn, publication)
    if conn.info.server_version >= 150000:
        extra = """pt.rowfilter, pt.attnames,
            EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel pr
                    JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid
                    WHERE p.pubname = pt.pubname AND pr.prattrs IS NOT NULL
                      AND (pr.prrelid = c.oid
                           OR pr.prrelid IN (SELECT relid FROM pg_catalog.pg_partition_ancestors(c.oid))))"""
    else:
        extra = "NULL, NULL, false"
    rows = conn.execute(
        f"""SELECT c.oid, pt.schemaname, pt.tablename, c.relkind = 'p', {extra}
            FROM pg_catalog.pg_publication_tables pt
            JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname
            JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
            WHERE pt.pubname = %s
            ORDER BY pt.schemaname, pt.tablename""",
        (publication,),
    ).fetchall()
    tables = []
    own = sorted(str(TableName(schema, name)) for _, schema, name, *_ in rows if schema == OWN_SCHEMA)
    said = (conn.info.host, str(conn.info.port), conn.info.dbname, publication, *own)
    if own and said not in _own_tables_logged:
        _own_tables_logged.add(said)
        log.info(
            "the pipeline's own tables are left out of the publication's tables",
            publication=publication,
            tables=own,
            hint=f"a publication FOR ALL TABLES or TABLES IN SCHEMA {OWN_SCHEMA} publishes them; they are not copied"
            " or streamed",
        )
    for oid, schema, name, partitioned, row_filter, attnames, has_column_list in rows:
        if schema == OWN_SCHEMA:
            continue
        tables.append(
            PublishedTable(
                id=oid,
                name=TableName(schema, name),
                row_filter=row_filter,
                column_list=tuple(attnames) if has_column_list else None,
                partitioned=partitioned,
                leaves=(),
            )
        )
    return [with_current_leaves(conn, t) for t in tables]


def with_current_leaves(conn: psycopg.Connection[Any], table: PublishedTable) -> PublishedTable:
    """``table`` with the leaf partitions it has in ``conn``'s snapshot (itself when it is not partitioned)."""
    if not table.partitioned:
        return table
    # pg_inherits read with plain SQL, so the transaction's snapshot applies (pg_partition_tree reads the latest
    # catalog): inside a copy's imported snapshot these are the leaves whose rows that snapshot holds. A
    # partition being detached concurrently (inhdetachpending, Postgres 14+) is no longer the root's.
    rows = conn.execute(
        """WITH RECURSIVE tree(relid, attached) AS (
               SELECT i.inhrelid, i.xmin::text::bigint FROM pg_catalog.pg_inherits i
               WHERE i.inhparent = %s::oid AND (to_jsonb(i) ->> 'inhdetachpending')::bool IS NOT TRUE
             UNION
               SELECT i.inhrelid, i.xmin::text::bigint
               FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.relid
               WHERE (to_jsonb(i) ->> 'inhdetachpending')::bool IS NOT TRUE
           )
           SELECT c.oid, n.nspname, c.relname, c.relkind, tree.attached
           FROM tree
           JOIN pg_catalog.pg_class c ON c.oid = tree.relid
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
           ORDER BY n.nspname, c.relname""",
        (table.id,),
    ).fetchall()
    skipped = [str(TableName(schema, name)) for _, schema, name, kind, _ in rows if kind not in ("r", "p")]
    if skipped:
        log.warning("partitions that are not tables are not copied", root=table.id, partitions=skipped)
    leaves = [(oid, TableName(schema, name)) for oid, schema, name, kind, _ in rows if kind == "r"]
    return replace(
        table,
        leaves=tuple(name for _, name in leaves),
        leaf_ids=tuple(oid for oid, _ in leaves),
        attachments=tuple(sorted((oid, attached) for oid, _, _, _, attached in rows)),
    )


def estimated_rows(conn: psycopg.Connection[Any], tables: Sequence[TableName]) -> int | None:
    """The planner's row count of ``tables`` together (``reltuples``); ``None`` when none was ever analyzed."""
    if not tables:
        return None
    row = conn.execute(
        "SELECT sum(greatest(reltuples, 0))::bigint, bool_and(reltuples < 0)"
        " FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.regclass[])",
        ([t.quoted() for t in tables],),
    ).fetchone()
    if row is None or row[0] is None or row[1]:
        return None
    return int(row[0])


def table_schema(
    conn: psycopg.Connection[Any],
    table_id: TableId,
    column_list: Sequence[str] | None = None,
    *,
    include_generated: bool = False,
) -> TableSchema:
    """The current shape of table ``table_id``: columns in attnum order and the replica identity.

    Dropped columns are left out; so are generated columns (logical replication does not send them),
    except stored ones that the column list names or, with ``include_generated`` (a Postgres 18 publication
    with ``publish_generated_columns = stored``), all stored ones. With a ``column_list`` only those columns
    are kept. ``primary_key`` marks the replica identity key: the primary key (also for FULL and NOTHING,
    when there is one) or the columns of the ``REPLICA IDENTITY USING INDEX`` index.
    """
    row = conn.execute(
        """SELECT n.nspname, c.relname, c.relreplident
           FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
           WHERE c.oid = %s AND c.relkind IN ('r', 'p')""",
        (table_id,),
    ).fetchone()
    if row is None:
        raise TableError(
            f"table with oid {table_id} does not exist on the source",
            hint="it was dropped or is not a table; remove it from the publication or restore it",
        )
    schema_name, table_name, replident = row
    identity = ReplicaIdentity(replident)
    key_index = "i.indisreplident" if identity is ReplicaIdentity.INDEX else "i.indisprimary"
    columns = conn.execute(
        f"""SELECT a.attname, a.atttypid::int, a.atttypmod,
                  pg_catalog.format_type(a.atttypid, a.atttypmod) || repeat('[]', greatest(a.attndims - 1, 0)),
                  a.attnotnull, a.attgenerated,
                  EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                          WHERE i.indrelid = a.attrelid AND {key_index} AND a.attnum = ANY (i.indkey)),
                  a.attnum, CASE WHEN a.attgenerated = '' THEN pg_catalog.pg_get_expr(d.adbin, d.adrelid) END,
                  CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END
           FROM pg_catalog.pg_attribute a
           LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
           WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY a.attnum""",
        (table_id,),
    ).fetchall()
    name = TableName(schema_name, table_name)
    wanted = set(column_list) if column_list is not None else None
    if wanted is not None:
        unknown = wanted - {c[0] for c in columns}
        if unknown:
            raise TableError(
                f"column list of {name} names columns the table does not have: {', '.join(sorted(unknown))}",
                hint="the table changed since the list was read; read the publication again",
            )
    kept: list[ColumnSchema] = []
    skipped_generated: list[str] = []
    for attname, type_oid, typmod, type_name, not_null, generated, in_key, attnum, default, missing in columns:
        if wanted is not None and attname not in wanted:
            continue
        # Only stored ones are ever published ("s"; virtual ones, "v", never are), named by a column list or
        # by the publication's publish_generated_columns.
        if generated and not (generated == "s" and (wanted is not None or include_generated)):
            skipped_generated.append(attname)
            continue
        kept.append(ColumnSchema(attname, type_oid, typmod, not not_null, in_key, type_name, attnum, default, missing))
    if skipped_generated:
        log.warning("generated columns are not replicated", table=str(name), columns=skipped_generated)
    return TableSchema(table_id, name, tuple(kept), identity)


def ctid_ranges(conn: psycopg.Connection[Any], table: TableName, parts: int) -> list[CtidRange]:
    """Split ``table``'s heap into up to ``parts`` contiguous page ranges that together cover every row.

    The first range has no lower bound and the last no upper bound, so rows on pages added after
    planning are copied too. (Tid range scans make each range cheap on Postgres 14+.)
    """
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    row = conn.execute(
        """SELECT pg_catalog.pg_relation_size(c.oid) / current_setting('block_size')::bigint, c.relkind
           FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass(%s)""",
        (table.quoted(),),
    ).fetchone()
    if row is None:
        raise TableError(f"table {table} does not exist on the source", hint="it was dropped or renamed")
    pages, kind = row
    if kind != "r":
        raise TableError(
            f"{table} is not a plain table (relkind {kind!r}); ctid ranges are planned per leaf partition",
            hint="plan the ranges of each of its leaves (PublishedTable.sources)",
        )
    parts = max(1, min(parts, pages))
    bounds: list[int | None] = [None, *(pages * i // parts for i in range(1, parts)), None]
    return [CtidRange(bounds[i], bounds[i + 1]) for i in range(parts)]


def table_bytes(conn: psycopg.Connection[Any], tables: Sequence[TableName]) -> int:
    """The size of ``tables`` together, in bytes, their TOAST (long values) included: about what a copy reads."""
    row = conn.execute(
        "SELECT coalesce(sum(pg_catalog.pg_table_size(pg_catalog.to_regclass(t))), 0)::bigint"
        " FROM unnest(%s::text[]) AS t",
        ([t.quoted() for t in tables],),
    ).fetchone()
    return int(row[0]) if row else 0


def _missing_publication(conn: psycopg.Connection[Any], publication: str) -> SourceError:
    return SourceError(
        f"publication {publication!r} does not exist in database {conn.info.dbname!r}",
        hint=f"create it on the source: CREATE PUBLICATION {quote_ident(publication)} FOR TABLE <tables>"
        " (or FOR ALL TABLES)",
    )
