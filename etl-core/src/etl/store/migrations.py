"""The tables of the SQL stores and the versioned migrations that create them.

``etl_store_version`` records every migration applied. On open, ``migrate`` runs the missing ones in
order inside the caller's transaction (so a failure leaves the database as it was) and refuses a
database written by a newer version of the code.

To change the tables: add a ``Migration`` with the next version number whose step alters them, and
update ``define_tables`` to the new shape. A step must not depend on ``define_tables`` once that
changes again: freeze the definitions it needs inside the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Dialect

from etl.errors import StoreError
from etl.lsn import Lsn
from etl.store.codec import lsn_from_text, lsn_to_text

log = structlog.get_logger(__name__)

VERSION_TABLE = "etl_store_version"


class LsnText(sa.types.TypeDecorator[Lsn]):
    """An LSN as 16 upper-case hex digits: the full unsigned range, ordered as text (C collation on Postgres)."""

    impl = sa.String(16)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        collation = "C" if dialect.name == "postgresql" else None
        return dialect.type_descriptor(sa.String(16, collation=collation))

    def process_bind_param(self, value: int | None, dialect: Dialect) -> str | None:
        return None if value is None else lsn_to_text(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Lsn | None:
        return None if value is None else lsn_from_text(value)


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A timezone-aware datetime, stored in UTC and returned in UTC on every dialect."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError(f"a naive datetime cannot be stored (give it a time zone): {value!r}")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass(frozen=True)
class Tables:
    version: sa.Table
    states: sa.Table
    schemas: sa.Table
    progress: sa.Table
    destination: sa.Table
    resync_requests: sa.Table
    copy_progress: sa.Table
    table_activity: sa.Table

    @property
    def schema(self) -> str | None:
        return self.version.schema

    @property
    def data_tables(self) -> tuple[sa.Table, ...]:
        return (
            self.states,
            self.schemas,
            self.progress,
            self.destination,
            self.resync_requests,
            self.copy_progress,
            self.table_activity,
        )


def define_tables(schema: str | None) -> Tables:
    """The current shape of the store tables, in ``schema`` (``None``: the database's default)."""
    md = sa.MetaData(schema=schema)

    def pipeline_id() -> sa.Column[int]:
        return sa.Column("pipeline_id", sa.BigInteger, primary_key=True)

    def table_id() -> sa.Column[int]:
        return sa.Column("table_id", sa.BigInteger, primary_key=True)

    return Tables(
        version=sa.Table(
            VERSION_TABLE,
            md,
            sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("description", sa.Text, nullable=False),
            sa.Column("applied_at", UtcDateTime, nullable=False),
        ),
        # One row per state a table went through (bounded); the highest seq is the current state.
        states=sa.Table(
            "etl_table_states",
            md,
            pipeline_id(),
            table_id(),
            sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("kind", sa.String(32), nullable=False),
            sa.Column("lsn", LsnText),
            sa.Column("reason", sa.Text),
            sa.Column("hint", sa.Text),
            sa.Column("retry", sa.String(16), nullable=False),
            sa.Column("retry_at", UtcDateTime),
        ),
        schemas=sa.Table(
            "etl_table_schemas",
            md,
            pipeline_id(),
            table_id(),
            sa.Column("snapshot_lsn", LsnText, primary_key=True),
            sa.Column("table_schema", sa.Text, nullable=False, comment="JSON, see etl.store.codec"),
        ),
        progress=sa.Table(
            "etl_progress",
            md,
            pipeline_id(),
            sa.Column("worker", sa.String(200), primary_key=True),
            sa.Column("lsn", LsnText, nullable=False),
        ),
        destination=sa.Table(
            "etl_destination_tables",
            md,
            pipeline_id(),
            table_id(),
            sa.Column("destination_table", sa.Text, nullable=False),
            sa.Column("snapshot_lsn", LsnText, nullable=False),
            sa.Column("status", sa.String(16), nullable=False),
            sa.Column("extra", sa.Text, nullable=False, comment="JSON object"),
        ),
        resync_requests=_resync_requests_table(md),
        copy_progress=_copy_progress_table(md),
        table_activity=_table_activity_table(md),
    )


def _per_table(name: str, md: sa.MetaData, *columns: sa.Column[Any]) -> sa.Table:
    """A table of one row per pipeline and table (its key), with ``columns``."""
    return sa.Table(
        name,
        md,
        sa.Column("pipeline_id", sa.BigInteger, primary_key=True),
        sa.Column("table_id", sa.BigInteger, primary_key=True),
        *columns,
    )


def _resync_requests_table(md: sa.MetaData, *, where: bool = True) -> sa.Table:
    # Tables that `etl resync` asked the running pipeline to copy again (see Store.request_resync). Migration 2
    # creates it without where_sql, which migration 6 adds.
    return _per_table(
        "etl_resync_requests",
        md,
        sa.Column("requested_at", UtcDateTime, nullable=False),
        *([_WHERE_SQL()] if where else []),
    )


def _WHERE_SQL() -> sa.Column[Any]:  # noqa: N802 - a column, made anew for each table it joins
    return sa.Column("where_sql", sa.Text, comment="a backfill's predicate (etl resync --where); NULL: the whole table")


def _copy_progress_table(md: sa.MetaData, *, resume: bool = True) -> sa.Table:
    # Where each table's initial copy stands, for `etl status` (see Store.record_copy_progress). Migration 3
    # creates it without resume_after, which migration 5 adds.
    return _per_table(
        "etl_copy_progress",
        md,
        sa.Column("copied_rows", sa.BigInteger, nullable=False),
        sa.Column("estimated_rows", sa.BigInteger, comment="the planner's estimate; NULL when never analyzed"),
        sa.Column("started_at", UtcDateTime, nullable=False),
        sa.Column("recorded_at", UtcDateTime, nullable=False),
        sa.Column("finished", sa.Boolean, nullable=False),
        *([_RESUME_AFTER()] if resume else []),
    )


def _RESUME_AFTER() -> sa.Column[Any]:  # noqa: N802 - a column, made anew for each table it joins
    return sa.Column("resume_after", sa.Text, comment="an incremental copy's last key copied (JSON)")


def _table_activity_table(md: sa.MetaData) -> sa.Table:
    # What the running pipeline wrote into each table, for `etl status` (see Store.record_table_activity).
    # Migration 4 creates it in this shape: to change it, add a migration and keep this shape for migration 4.
    return _per_table(
        "etl_table_activity",
        md,
        sa.Column("inserts", sa.BigInteger, nullable=False),
        sa.Column("updates", sa.BigInteger, nullable=False),
        sa.Column("deletes", sa.BigInteger, nullable=False),
        sa.Column("truncates", sa.BigInteger, nullable=False),
        sa.Column("since", UtcDateTime, nullable=False, comment="when the run that counted them began"),
        sa.Column("last_write_at", UtcDateTime, nullable=False),
    )


StepT = TypeVar("StepT", bound=Callable[..., None])


@dataclass(frozen=True)
class Migration(Generic[StepT]):
    """One numbered change of a database's own tables. A store's steps get the connection and the store's
    schema; other users of ``apply_migrations`` (the DuckLake catalog) choose their own."""

    version: int
    description: str
    apply: StepT
    """Runs inside the migration transaction."""


StoreStep = Callable[[sa.Connection, str | None], None]


def _create_initial_tables(conn: sa.Connection, schema: str | None) -> None:
    tables = define_tables(schema)  # these four have kept their first shape
    for table in (tables.states, tables.schemas, tables.progress, tables.destination):
        table.create(conn)


def _create_resync_requests(conn: sa.Connection, schema: str | None) -> None:
    _resync_requests_table(sa.MetaData(schema=schema), where=False).create(conn)


def _create_copy_progress(conn: sa.Connection, schema: str | None) -> None:
    _copy_progress_table(sa.MetaData(schema=schema), resume=False).create(conn)


def _add_column(conn: sa.Connection, column: sa.Column[Any]) -> None:
    name = conn.dialect.identifier_preparer.format_table(column.table)
    conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN {column.name} {column.type.compile(conn.dialect)}")


def _add_resume_after(conn: sa.Connection, schema: str | None) -> None:
    _add_column(conn, _copy_progress_table(sa.MetaData(schema=schema)).c.resume_after)


def _add_backfill_predicate(conn: sa.Connection, schema: str | None) -> None:
    _add_column(conn, _resync_requests_table(sa.MetaData(schema=schema)).c.where_sql)


def _create_table_activity(conn: sa.Connection, schema: str | None) -> None:
    _table_activity_table(sa.MetaData(schema=schema)).create(conn)


MIGRATIONS: tuple[Migration[StoreStep], ...] = (
    Migration(1, "table states, schemas, progress, destination tables", _create_initial_tables),
    Migration(2, "resync requests", _create_resync_requests),
    Migration(3, "copy progress", _create_copy_progress),
    Migration(4, "table activity", _create_table_activity),
    Migration(5, "incremental copy position", _add_resume_after),
    Migration(6, "backfill predicates", _add_backfill_predicate),
)


def migrate(
    conn: sa.Connection,
    tables: Tables,
    *,
    store: str,
    package: str,
    migrations: Sequence[Migration[StoreStep]] = MIGRATIONS,
) -> int:
    """Apply the missing migrations in ``conn``'s transaction; return the version the database had.

    ``store`` describes the store for messages; ``package`` is the distribution to upgrade when the
    database is newer than this code.
    """
    present = set(sa.inspect(conn).get_table_names(schema=tables.schema))
    if VERSION_TABLE in present:
        try:
            found = conn.execute(sa.select(sa.func.max(tables.version.c.version))).scalar() or 0
        except sa.exc.DBAPIError as exc:
            raise StoreError(
                f"{store} has a table {VERSION_TABLE} that etl did not write ({driver_message(exc)})",
                hint="point the store at a database or schema of its own",
            ) from None
    else:
        ours = sorted(present & {t.name for t in tables.data_tables})
        if ours:
            raise StoreError(
                f"{store} has tables named like etl's ({', '.join(ours)}) but no {VERSION_TABLE}: "
                "they were not written by etl",
                hint="point the store at a database or schema of its own",
            )
        tables.version.create(conn)
        found = 0

    def newer(latest: int) -> StoreError:
        return StoreError(
            f"{store} was written by a newer {package} (store schema version {found}; "
            f"this version knows up to {latest})",
            hint=f"upgrade the package: pip install --upgrade {package}",
        )

    def run(step: StoreStep) -> None:
        step(conn, tables.schema)

    apply_migrations(conn, tables.version, migrations, found, run=run, newer=newer, store=store)
    return found


def apply_migrations(
    conn: sa.Connection,
    version_table: sa.Table,
    migrations: Sequence[Migration[StepT]],
    found: int,
    *,
    run: Callable[[StepT], None],
    newer: Callable[[int], Exception],
    **about: str,
) -> None:
    """Apply the migrations past version ``found`` in order, each by ``run(step)`` and recorded in
    ``version_table`` (version, description, applied_at), in ``conn``'s transaction. A database newer than the
    last migration raises ``newer(last version)``. ``about`` goes into the log lines."""
    latest = migrations[-1].version
    if found > latest:
        raise newer(latest)
    for migration in migrations:
        if migration.version > found:
            run(migration.apply)
            conn.execute(
                sa.insert(version_table).values(
                    version=migration.version, description=migration.description, applied_at=datetime.now(UTC)
                )
            )
            log.info("migrated", version=migration.version, description=migration.description, **about)


def driver_message(exc: sa.exc.SQLAlchemyError) -> str:
    """The database driver's own message (first line), without SQLAlchemy's statement echo."""
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    lines = str(orig).strip().splitlines()
    return lines[0].strip() if lines else type(orig).__name__
