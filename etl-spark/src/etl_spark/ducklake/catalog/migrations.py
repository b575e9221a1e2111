"""Versioned migrations of this writer's own tables in the DuckLake catalog (DuckLake's own are DuckDB's).

``etl_ducklake_version`` records every migration applied. ``Catalog.open`` runs the missing ones in order
inside its transaction (so a failure leaves the catalog as it was) and refuses a catalog written by a
newer version of this writer. Lakes written before the version table existed hold the tables of
migration 1 (perhaps the legacy one of migration 2) and no version table: the migrations are
idempotent over that, so such a lake starts at version 0 and upgrades.

To change the tables: add a ``Migration`` with the next version number whose step alters them, and
update ``ddl.OWN_COLUMNS`` to the new shape. A step must not depend on ``OWN_COLUMNS`` once that table's
shape changes again: freeze the definition it needs inside the step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Connection

from etl.api import DestinationError
from etl.api.sql import Migration, apply_migrations
from etl_spark.ducklake.catalog.ddl import (
    COLUMNS_TABLE,
    OWN_COLUMNS,
    POSITION_TABLE,
    STAGED_TABLE,
    STATE_TABLE,
    TABLES,
    VERSION_TABLE,
    column_ddl,
    create_statement,
)
from etl_spark.ducklake.catalog.model import UNKNOWN_SOURCE_TYPE

log = structlog.get_logger(__name__)

LEGACY_COLUMNS_TABLE: Final = "etl_ducklake_columns"
"""Attribute numbers only, as the first versions of this writer recorded them; migration 2 moves them."""


def _create_state_tables(conn: Connection) -> None:
    dialect = conn.dialect.name
    first_state = (
        "pipeline_id BIGINT NOT NULL PRIMARY KEY, source_table_id BIGINT NOT NULL PRIMARY KEY,"
        " table_id BIGINT NOT NULL, commit_lsn BIGINT NOT NULL, tx_ordinal BIGINT NOT NULL"
    )
    conn.exec_driver_sql(create_statement(STATE_TABLE, first_state, dialect, if_not_exists=True))
    # The columns table has kept its first shape.
    conn.exec_driver_sql(create_statement(COLUMNS_TABLE, OWN_COLUMNS[COLUMNS_TABLE], dialect, if_not_exists=True))


def _move_legacy_columns(conn: Connection) -> None:
    """Attribute numbers recorded by the first versions move over; their types stay unknown."""
    if not sa.inspect(conn).has_table(LEGACY_COLUMNS_TABLE):
        return
    conn.exec_driver_sql(
        f"INSERT INTO {COLUMNS_TABLE} (table_id, column_id, attnum, type_oid, type_modifier)"
        f" SELECT table_id, column_id, attnum, {UNKNOWN_SOURCE_TYPE[0]}, {UNKNOWN_SOURCE_TYPE[1]}"
        f" FROM {LEGACY_COLUMNS_TABLE} o WHERE NOT EXISTS"
        f" (SELECT 1 FROM {COLUMNS_TABLE} n WHERE n.table_id = o.table_id AND n.column_id = o.column_id)"
    )
    conn.exec_driver_sql(f"DROP TABLE {LEGACY_COLUMNS_TABLE}")


def _add_replaced(conn: Connection) -> None:
    if "replaced" in {c["name"] for c in sa.inspect(conn).get_columns(STATE_TABLE)}:
        return  # idempotent too, so that a catalog whose version table is lost upgrades from version 0
    false = sa.false().compile(dialect=conn.dialect)
    conn.exec_driver_sql(
        f"ALTER TABLE {STATE_TABLE} ADD COLUMN {column_ddl('replaced BOOLEAN NOT NULL', conn.dialect.name)}"
        f" DEFAULT {false}"
    )


def _create_positions(conn: Connection) -> None:
    shape = "pipeline_id BIGINT NOT NULL PRIMARY KEY, commit_lsn BIGINT NOT NULL, snapshot_id BIGINT NOT NULL"
    conn.exec_driver_sql(create_statement(POSITION_TABLE, shape, conn.dialect.name, if_not_exists=True))


def _create_staged(conn: Connection) -> None:
    shape = (
        "pipeline_id BIGINT NOT NULL, table_id BIGINT NOT NULL, directory VARCHAR NOT NULL,"
        " prefix VARCHAR NOT NULL PRIMARY KEY"
    )
    conn.exec_driver_sql(create_statement(STAGED_TABLE, shape, conn.dialect.name, if_not_exists=True))


MIGRATIONS: Final[tuple[Migration[Callable[[Connection], None]], ...]] = (
    Migration(1, "lake tables of source tables, with watermarks; source columns", _create_state_tables),
    Migration(2, "source columns recorded by attribute number only move to the source columns", _move_legacy_columns),
    Migration(3, "a lake table can be marked for replacement by the next copy", _add_replaced),
    Migration(4, "the stream's position each pipeline's batches brought the lake to", _create_positions),
    Migration(5, "the files a pipeline writes for a transaction it has not committed yet", _create_staged),
)


def migrate(conn: Connection, catalog: str) -> None:
    """Apply the missing migrations in ``conn``'s transaction; ``catalog`` names the catalog in messages."""
    version = TABLES[VERSION_TABLE]
    if sa.inspect(conn).has_table(VERSION_TABLE):
        found = conn.execute(sa.select(sa.func.max(version.c.version))).scalar() or 0
    else:
        conn.exec_driver_sql(create_statement(VERSION_TABLE, OWN_COLUMNS[VERSION_TABLE], conn.dialect.name))
        found = 0

    def newer(latest: int) -> DestinationError:
        return DestinationError(
            f"the DuckLake catalog {catalog} was written by a newer etl-spark (catalog version {found};"
            f" this version knows up to {latest})",
            hint="upgrade the package: pip install --upgrade etl-spark",
            transient=False,
        )

    apply_migrations(conn, version, MIGRATIONS, found, run=lambda step: step(conn), newer=newer, catalog=catalog)
