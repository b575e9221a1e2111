"""The SQL store: the store protocol on SQLAlchemy Core, shared by the SQLite and Postgres stores.

On open, one transaction migrates the tables (see ``etl.store.migrations``) and loads this
pipeline's rows into the cache of ``CachedStore``; afterwards reads come from the cache and each
write is one transaction that must commit before the cache changes. Every row carries the pipeline
id, so several pipelines can share one database.

Subclasses give the engine, the pipeline lock and their words for errors. The only dialect
difference written here twice is the two-argument maximum for monotonic progress.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, NoReturn

import sqlalchemy as sa
import structlog
from sqlalchemy.dialects import postgresql, sqlite

from etl.errors import StoreError, TransientError
from etl.lsn import Lsn
from etl.schema import TableId, TableSchema
from etl.store.base import (
    APPLY_WORKER,
    CopyProgress,
    DestinationSchemaStatus,
    DestinationTableMetadata,
    RetryKind,
    TableActivity,
    TableState,
    TableStateKind,
    merged_request,
    table_sync_worker,
)
from etl.store.cached import CachedStore, StateRow
from etl.store.codec import extra_from_json, extra_to_json, schema_from_json, schema_to_json
from etl.store.migrations import MIGRATIONS, Migration, StoreStep, define_tables, driver_message, migrate

log = structlog.get_logger(__name__)

# Dialect -> (INSERT with ON CONFLICT, two-argument maximum).
_DIALECTS: dict[str, tuple[Callable[[sa.Table], Any], Callable[..., sa.ColumnElement[Any]]]] = {
    "sqlite": (sqlite.insert, sa.func.max),
    "postgresql": (postgresql.insert, sa.func.greatest),
}


class SqlStore(CachedStore):
    """A store in SQL tables. Subclasses set ``name`` and ``package`` and implement ``acquire_lock``."""

    package: ClassVar[str]
    """The distribution that provides the store, named in upgrade hints."""
    migrations: ClassVar[tuple[Migration[StoreStep], ...]] = MIGRATIONS

    def __init__(self, engine: sa.Engine, pipeline_id: int, *, schema: str | None = None) -> None:
        super().__init__(pipeline_id)
        if engine.dialect.name not in _DIALECTS:
            raise ValueError(f"unsupported SQL dialect {engine.dialect.name!r} (supported: {', '.join(_DIALECTS)})")
        self._engine = engine
        self._tables = define_tables(schema)
        self._insert, self._greatest = _DIALECTS[engine.dialect.name]
        try:
            with engine.begin() as conn:
                self._before_migrate(conn)
                found = migrate(
                    conn, self._tables, store=self.describe(), package=self.package, migrations=self.migrations
                )
                self._load(conn)
        except StoreError:
            engine.dispose()
            raise
        except sa.exc.SQLAlchemyError as exc:
            engine.dispose()
            raise self._open_error(exc) from exc
        log.debug("store opened", store=self.describe(), pipeline_id=pipeline_id, found_version=found)

    # -- hooks for subclasses ------------------------------------------------------------------------
    def _before_migrate(self, conn: sa.Connection) -> None:
        """Check or prepare the database in the opening transaction, before the migrations run."""

    def _open_error(self, exc: sa.exc.SQLAlchemyError) -> StoreError:
        """The error to raise when opening fails with ``exc``."""
        return StoreError(f"cannot open {self.describe()}: {driver_message(exc)}")

    def _release(self) -> None:
        self._engine.dispose()

    def _reload_locked(self) -> None:
        """Read the pipeline's state again, just after taking its lock: the previous holder may have written
        after this store opened. On failure the cache stays as it was, the store closes (its lock released)
        and the error is raised."""
        try:
            with self._replacing_cache(), self._engine.begin() as conn:
                self._load(conn)
        except BaseException as exc:
            self.close()
            if isinstance(exc, sa.exc.SQLAlchemyError):
                raise self._open_error(exc) from exc
            raise

    # -- loading -------------------------------------------------------------------------------------
    def _load(self, conn: sa.Connection) -> None:
        t = self._tables
        try:
            for row in conn.execute(
                self._mine(sa.select(t.states), t.states).order_by(t.states.c.table_id, t.states.c.seq)
            ):
                state = TableState(
                    kind=TableStateKind(row.kind),
                    lsn=row.lsn,
                    reason=row.reason,
                    hint=row.hint,
                    retry=RetryKind(row.retry),
                    retry_at=row.retry_at,
                )
                self._states.setdefault(row.table_id, []).append(StateRow(row.table_id, row.seq, state))
            for row in conn.execute(self._mine(sa.select(t.schemas), t.schemas)):
                schema = schema_from_json(row.table_schema)
                if (schema.id, schema.snapshot_lsn) != (row.table_id, row.snapshot_lsn):
                    raise ValueError(
                        f"schema row ({row.table_id}, {row.snapshot_lsn}) holds {schema.id}@{schema.snapshot_lsn}"
                    )
                self._schemas.setdefault(schema.id, {})[schema.snapshot_lsn] = schema
            for row in conn.execute(self._mine(sa.select(t.progress), t.progress)):
                self._progress[row.worker] = row.lsn
            for row in conn.execute(self._mine(sa.select(t.destination), t.destination)):
                self._metadata[row.table_id] = DestinationTableMetadata(
                    destination_table=row.destination_table,
                    snapshot_lsn=row.snapshot_lsn,
                    status=DestinationSchemaStatus(row.status),
                    extra=extra_from_json(row.extra),
                )
            if self._migrated(3):
                self._load_copy_progress(conn)
            if self._migrated(4):
                self._load_table_activity(conn)
        except ValueError as exc:
            raise StoreError(
                f"{self.describe()} holds data this version cannot read: {exc}",
                hint="was it written by a different etl version? restore a backup or start a new store",
            ) from None
        for history in self._states.values():
            del history[: -self.history_limit]

    def _migrated(self, version: int) -> bool:
        """Whether this store's migrations include ``version`` (a test may pose as an earlier release)."""
        return any(m.version == version for m in self.migrations)

    def _load_copy_progress(self, conn: sa.Connection) -> None:
        t = self._tables.copy_progress
        resumable = self._migrated(5)  # resume_after came with migration 5
        columns = [c for c in t.c if resumable or c.name != "resume_after"]
        for row in conn.execute(self._mine(sa.select(*columns), t)):
            self._copy_progress[row.table_id] = CopyProgress(
                rows=row.copied_rows,
                estimate=row.estimated_rows,
                started_at=row.started_at,
                recorded_at=row.recorded_at,
                finished=bool(row.finished),
                resume_after=row.resume_after if resumable else None,
            )

    def _load_table_activity(self, conn: sa.Connection) -> None:
        t = self._tables.table_activity
        for row in conn.execute(self._mine(sa.select(t), t)):
            self._activity[row.table_id] = TableActivity(
                row.inserts, row.updates, row.deletes, row.truncates, row.since, row.last_write_at
            )

    def _mine(self, select: sa.Select[Any], table: sa.Table) -> sa.Select[Any]:
        return select.where(table.c.pipeline_id == self.pipeline_id)

    # -- writing -------------------------------------------------------------------------------------
    @contextmanager
    def _transaction(self, action: str) -> Iterator[sa.Connection]:
        try:
            with self._engine.begin() as conn:
                yield conn
        except sa.exc.SQLAlchemyError as exc:
            self._raise_write_error(action, exc)

    def _raise_write_error(self, action: str, exc: sa.exc.SQLAlchemyError) -> NoReturn:
        message = f"{self.describe()}: {action} failed for pipeline {self.pipeline_id}: {driver_message(exc)}"
        if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
            raise TransientError(message, hint="the store database connection was lost; the write is retried") from exc
        raise StoreError(message) from exc

    def _delete(self, table: sa.Table, **where: Any) -> sa.Delete:
        clauses = [table.c.pipeline_id == self.pipeline_id, *(table.c[k] == v for k, v in where.items())]
        return sa.delete(table).where(*clauses)

    def _insert_states(self, conn: sa.Connection, rows: list[StateRow]) -> None:
        t = self._tables.states
        conn.execute(
            sa.insert(t),
            [
                {
                    "pipeline_id": self.pipeline_id,
                    "table_id": row.table_id,
                    "seq": row.seq,
                    "kind": row.state.kind.value,
                    "lsn": row.state.lsn,
                    "reason": row.state.reason,
                    "hint": row.state.hint,
                    "retry": row.state.retry.value,
                    "retry_at": row.state.retry_at,
                }
                for row in rows
            ],
        )
        for row in rows:
            if row.seq > self.history_limit:
                conn.execute(self._delete(t, table_id=row.table_id).where(t.c.seq <= row.seq - self.history_limit))

    def _upsert(self, conn: sa.Connection, table: sa.Table, values: dict[str, Any]) -> None:
        stmt = self._insert(table).values(pipeline_id=self.pipeline_id, **values)
        keys = [c.name for c in table.primary_key.columns]
        conn.execute(
            stmt.on_conflict_do_update(index_elements=keys, set_={k: v for k, v in values.items() if k not in keys})
        )

    def _persist_table_states(self, rows: list[StateRow]) -> None:
        with self._transaction("updating table states") as conn:
            self._insert_states(conn, rows)

    def _persist_rollback(self, table_id: TableId, seq: int) -> None:
        with self._transaction("rolling back a table state") as conn:
            conn.execute(self._delete(self._tables.states, table_id=table_id, seq=seq))

    def _persist_table_schema(self, schema: TableSchema) -> None:
        with self._transaction("storing a table schema") as conn:
            self._upsert(
                conn,
                self._tables.schemas,
                {"table_id": schema.id, "snapshot_lsn": schema.snapshot_lsn, "table_schema": schema_to_json(schema)},
            )

    def _persist_prune_table_schemas(self, versions: list[tuple[TableId, Lsn]]) -> None:
        with self._transaction("pruning table schemas") as conn:
            for table_id, lsn in versions:
                conn.execute(self._delete(self._tables.schemas, table_id=table_id, snapshot_lsn=lsn))

    def _persist_progress(self, worker: str, lsn: Lsn) -> Lsn:
        t = self._tables.progress
        insert = self._insert(t).values(pipeline_id=self.pipeline_id, worker=worker, lsn=lsn)
        upsert = insert.on_conflict_do_update(
            index_elements=[t.c.pipeline_id, t.c.worker], set_={"lsn": self._greatest(t.c.lsn, insert.excluded.lsn)}
        )
        with self._transaction("storing progress") as conn:
            conn.execute(upsert)  # no RETURNING: SQLite before 3.35 (still shipped by some systems) lacks it
            stored: Lsn = conn.execute(self._mine(sa.select(t.c.lsn), t).where(t.c.worker == worker)).scalar_one()
        return stored

    def _persist_delete_progress(self, worker: str) -> None:
        with self._transaction("deleting progress") as conn:
            conn.execute(self._delete(self._tables.progress, worker=worker))

    def _persist_destination_metadata(self, table_id: TableId, metadata: DestinationTableMetadata) -> None:
        with self._transaction("storing destination metadata") as conn:
            self._upsert(
                conn,
                self._tables.destination,
                {
                    "table_id": table_id,
                    "destination_table": metadata.destination_table,
                    "snapshot_lsn": metadata.snapshot_lsn,
                    "status": metadata.status.value,
                    "extra": extra_to_json(metadata.extra),
                },
            )

    def _persist_copy_progress(self, table_id: TableId, progress: CopyProgress) -> None:
        with self._transaction("recording copy progress") as conn:
            self._upsert(
                conn,
                self._tables.copy_progress,
                {
                    "table_id": table_id,
                    "copied_rows": progress.rows,
                    "estimated_rows": progress.estimate,
                    "started_at": progress.started_at,
                    "recorded_at": progress.recorded_at,
                    "finished": progress.finished,
                    **({"resume_after": progress.resume_after} if self._migrated(5) else {}),
                },
            )

    def _persist_table_activity(self, activity: dict[TableId, TableActivity]) -> None:
        with self._transaction("recording table activity") as conn:
            for table_id, entry in activity.items():
                self._upsert(
                    conn,
                    self._tables.table_activity,
                    {
                        "table_id": table_id,
                        "inserts": entry.inserts,
                        "updates": entry.updates,
                        "deletes": entry.deletes,
                        "truncates": entry.truncates,
                        "since": entry.since,
                        "last_write_at": entry.last_write_at,
                    },
                )

    def _delete_copy_state(self, conn: sa.Connection, table_id: TableId) -> None:
        t = self._tables
        conn.execute(self._delete(t.destination, table_id=table_id))
        conn.execute(self._delete(t.schemas, table_id=table_id))
        conn.execute(self._delete(t.progress, worker=table_sync_worker(table_id)))
        conn.execute(self._delete(t.copy_progress, table_id=table_id))

    def _persist_prepare_table_for_copy(self, table_id: TableId) -> None:
        with self._transaction("preparing a table for copy") as conn:
            self._delete_copy_state(conn, table_id)

    def _persist_reset_tables_for_resync(self, rows: list[StateRow]) -> None:
        with self._transaction("resetting tables for resync") as conn:
            if rows:
                self._insert_states(conn, rows)
            conn.execute(self._delete(self._tables.progress, worker=APPLY_WORKER))

    def _persist_resync_request(self, table_id: TableId, where: str | None) -> None:
        t = self._tables.resync_requests
        if where is not None and not self._migrated(6):
            raise StoreError(
                f"the {self.describe()} was written by an older version, which cannot take a --where predicate",
                hint="run the pipeline once with this version (it upgrades the store), then ask again",
            )
        values: dict[str, Any] = {"requested_at": datetime.now(UTC)}
        with self._transaction("recording a resync request") as conn:
            if self._migrated(6):
                read = self._mine(sa.select(t.c.table_id, t.c.where_sql), t).where(t.c.table_id == table_id)
                pending: dict[TableId, str | None] = {row[0]: row[1] for row in conn.execute(read)}
                values["where_sql"] = merged_request(pending, table_id, where)
            insert = self._insert(t).values(pipeline_id=self.pipeline_id, table_id=table_id, **values)
            conn.execute(insert.on_conflict_do_update(index_elements=[t.c.pipeline_id, t.c.table_id], set_=values))

    def _take_resync_requests(self) -> dict[TableId, str | None]:
        t = self._tables.resync_requests
        with self._transaction("taking resync requests") as conn:
            where = t.c.where_sql if self._migrated(6) else sa.null()  # migration 6 added it
            read = self._mine(sa.select(t.c.table_id, where), t)
            taken: dict[TableId, str | None] = {row[0]: row[1] for row in conn.execute(read)}
            for table_id in taken:  # only what was read: a request made meanwhile stays for the next call
                conn.execute(self._delete(t, table_id=table_id))
        return taken

    def _persist_delete_table_state(self, table_id: TableId) -> None:
        with self._transaction("deleting a table's state") as conn:
            self._delete_copy_state(conn, table_id)
            conn.execute(self._delete(self._tables.states, table_id=table_id))
            conn.execute(self._delete(self._tables.table_activity, table_id=table_id))
