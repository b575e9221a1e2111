"""A pipeline: one publication, one store, one destination, and the workers between them."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import structlog

from etl.config import PipelineConfig
from etl.destination.base import Destination
from etl.errors import SourceError, TransientError
from etl.lsn import Lsn
from etl.postgres.catalog import publication_exists
from etl.postgres.connection import connect
from etl.postgres.ddl import install_ddl_trigger
from etl.postgres.replication import ReplicationConnection, backoff_delays, choose_protocol, slot_state
from etl.replication.apply import ApplyWorker
from etl.replication.context import WorkerContext
from etl.replication.schemas import SchemaTracker
from etl.replication.slots import apply_slot
from etl.replication.states import TableStates
from etl.replication.tablesync import TableSyncWorker
from etl.replication.writer import BatchWriter
from etl.schema import TableId
from etl.store.base import APPLY_WORKER, Store

log = structlog.get_logger(__name__)


class Pipeline:
    """Runs a pipeline in background threads.

    ``start()`` takes the pipeline lock, starts the destination and the apply worker, and returns.
    ``wait()`` blocks until the pipeline stops and re-raises what stopped it. ``shutdown()`` drains
    the batch in flight, records progress and stops every worker.
    """

    def __init__(self, config: PipelineConfig, store: Store, destination: Destination) -> None:
        self.config = config
        self.store = store
        self.destination = destination
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._apply: ApplyWorker | None = None
        self._states: TableStates | None = None
        self._schemas: SchemaTracker | None = None
        self._sync_workers: dict[TableId, TableSyncWorker] = {}
        self.log = log.bind(pipeline_id=config.pipeline.id, publication=config.pipeline.publication)

    # -- public API ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.store.acquire_lock()
        try:
            self._preflight()
            self._states = TableStates(self.store)
            self._schemas = SchemaTracker(self.store, self.config.pipeline.publication)
            self.destination.startup()
        except BaseException:
            self.store.close()
            raise
        self._thread = threading.Thread(target=self._run, name=f"pipeline-{self.config.pipeline.id}", daemon=True)
        self._thread.start()
        self.log.info("pipeline started")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the pipeline stopped (True) or ``timeout`` passed (False); re-raise its failure."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return True

    def shutdown(self, timeout: float | None = None) -> None:
        """Drain the batch in flight, store progress, stop the workers and release the lock."""
        self._stop.set()
        try:
            self.wait(timeout)
        finally:
            self.destination.shutdown()
            self.store.close()
            self.log.info("pipeline stopped")

    def request_stop(self) -> None:
        """Ask the pipeline to stop (safe from a signal handler); ``wait()`` returns once it did."""
        self._stop.set()

    @property
    def states(self) -> TableStates | None:
        """The live table states, once started."""
        return self._states

    # -- internals -------------------------------------------------------------------------------------
    def _preflight(self) -> None:
        with connect(self.config.source) as conn:
            if not publication_exists(conn, self.config.pipeline.publication):
                raise SourceError(
                    f"publication '{self.config.pipeline.publication}' does not exist in"
                    f" {self.config.source.describe()}",
                    hint=f"CREATE PUBLICATION {self.config.pipeline.publication} FOR TABLE ...; or fix [pipeline]"
                    " publication",
                )
            if self.config.pipeline.install_ddl_trigger:
                self._install_ddl_trigger(conn)

    def _install_ddl_trigger(self, conn: psycopg.Connection[Any]) -> None:
        result = install_ddl_trigger(conn)
        if not result:
            self.log.warning(
                "DDL trigger not installed; schema changes are seen from the replication stream only",
                reason=result.reason,
                lost="nullability, defaults and certain renames (a rename can look like a drop plus an add)",
                hint="have a superuser run the install SQL from docs/schema-changes.md on the source database,"
                " or set [pipeline] install_ddl_trigger = false",
            )

    def _run(self) -> None:
        delays = backoff_delays()
        try:
            while not self._stop.is_set():
                try:
                    self._run_apply()
                    return
                except TransientError as exc:
                    delay = next(delays)
                    self.log.warning("connection lost; reconnecting", error=str(exc), retry_in=delay)
                    self._stop.wait(delay)
        except BaseException as exc:
            self._error = exc
            self.log.error("pipeline failed", error=str(exc))
        finally:
            self._stop.set()
            for worker in self._sync_workers.values():
                worker.thread.join()

    def _run_apply(self) -> None:
        config = self.config
        slot = apply_slot(config.pipeline.id)
        with ReplicationConnection.connect(config.source) as rconn:
            protocol, streaming = choose_protocol(rconn.server_version)
            with connect(config.source) as conn:
                state = slot_state(conn, slot)
            if state.exists and state.invalidated:
                self._slot_invalidated(rconn, slot)
            if not state.exists or state.invalidated:
                created = rconn.create_slot(slot)
                self.log.info("replication slot created", slot=slot, consistent_point=str(created.consistent_point))
            slot_position = state.confirmed_flush_lsn if state.exists and not state.invalidated else Lsn.ZERO
            start = Lsn(max(self.store.get_progress(APPLY_WORKER) or 0, slot_position))
            assert self._states is not None and self._schemas is not None
            ctx = WorkerContext(
                config, self.store, self.destination, self._states, self._schemas, protocol, streaming, self._stop
            )
            writer = BatchWriter(self.destination, self.store, APPLY_WORKER, self._on_table_error, start)
            self._apply = worker = ApplyWorker(ctx, rconn, writer, self._sync_workers)
            worker.refresh()
            rconn.start_replication(slot, start, [config.pipeline.publication], protocol, streaming)
            self.log.info("streaming", slot=slot, start_lsn=str(start), protocol=protocol)
            try:
                worker.run()
            finally:
                writer.close()

    def _on_table_error(self, table_id: int, error: Any) -> None:
        assert self._apply is not None
        self._apply.table_failed(table_id, error)

    def _slot_invalidated(self, rconn: ReplicationConnection, slot: str) -> None:
        if self.config.pipeline.invalidated_slot == "stop":
            raise SourceError(
                f"replication slot {slot} was invalidated: the WAL it needed is gone, changes were lost",
                hint='set [pipeline] invalidated_slot = "recreate" to drop it and copy every table again, or raise'
                " max_slot_wal_keep_size on the source to keep this from recurring",
            )
        self.log.warning("replication slot invalidated; recreating it and resyncing every table", slot=slot)
        rconn.drop_slot_if_exists(slot)
        self.store.reset_tables_for_resync()
        assert self._states is not None
        self._states.reload()
