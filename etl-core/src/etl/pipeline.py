"""A pipeline: one publication, one store, one destination, and the workers between them."""

from __future__ import annotations

import threading
import time
from typing import Any, Final

import psycopg
import pyarrow as pa
import structlog

from etl.config import MetricsSection, PipelineConfig
from etl.destination.base import Destination
from etl.errors import ConfigError, EtlError, SourceError, TransientError
from etl.log import route_to_stdlib
from etl.lsn import Lsn
from etl.metrics import PipelineMetrics
from etl.observe import MetricsServer, Sampler
from etl.postgres.catalog import publication_exists, publication_tables
from etl.postgres.connection import connect
from etl.postgres.ddl import install_ddl_trigger
from etl.postgres.replication import PublicationMissingError, ReplicationConnection, choose_protocol
from etl.postgres.slot_state import SlotLostError, SlotState, slot_state
from etl.replication.activity import ActivityRecorder
from etl.replication.apply import ApplyWorker
from etl.replication.backoff import backoff_delays
from etl.replication.chunked_copy import check_backfill
from etl.replication.context import WorkerContext
from etl.replication.retries import TableRetries
from etl.replication.schemas import SchemaTracker
from etl.replication.slots import apply_slot, pipeline_slots
from etl.replication.states import TableStates
from etl.replication.tablesync import TableSyncWorker
from etl.replication.writer import BatchWriter
from etl.schema import TableId, TableName
from etl.store.base import APPLY_WORKER, Store, TableStateKind

log = structlog.get_logger(__name__)

HEALTHY_ATTEMPT_S: Final = 60.0
"""A connection that streamed for this long was healthy: the next outage reconnects from the shortest delay.

Twice the longest backoff delay (30 s), so a source that accepts connections and drops them again within a
minute (a crash loop, a flapping network) keeps backing off, while one outage a day never costs more than
the first delays of the series.
"""

SLOT_RELEASE_WAIT_S = 5.0
"""How long a start waits for a server process of a run that just died to let go of the slot."""


class Pipeline:
    """Runs a pipeline in background threads.

    ``start()`` takes the pipeline lock, starts the destination and the apply worker, and returns.
    ``wait()`` blocks until the pipeline stops and re-raises what stopped it. ``shutdown()`` drains
    the batch in flight, records progress and stops every worker.
    """

    healthy_attempt_s: float = HEALTHY_ATTEMPT_S
    """An attempt (connect and stream) that lasted this long resets the reconnect backoff."""

    def __init__(self, config: PipelineConfig, store: Store, destination: Destination) -> None:
        route_to_stdlib()
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
        self._retries = TableRetries(config.pipeline, resync_on_type_change=config.copy_.on_type_change == "resync")
        self._activity = ActivityRecorder(store)
        self.metrics = PipelineMetrics()
        """The pipeline's Prometheus series; ``metrics.registry`` is what ``[metrics] listen`` serves."""
        self.metrics.watch_states(lambda: self._states.snapshot() if self._states is not None else {})
        self._streaming = False
        self._server: MetricsServer | None = None
        self._sampler: Sampler | None = None
        self.log = log.bind(pipeline_id=config.pipeline.id, publication=config.pipeline.publication)

    # -- public API ------------------------------------------------------------------------------------
    def start(self) -> None:
        threading.Thread(target=_warm_arrow, name="warm-arrow", daemon=True).start()
        self.store.acquire_lock()
        try:
            self._preflight()
            self._states = TableStates(self.store)
            self._schemas = SchemaTracker(self.store, self.config.pipeline.publication)
            self.destination.startup()
            register = getattr(self.destination, "register_metrics", None)
            if callable(register):
                register(self.metrics.registry)
            self._observe()
        except BaseException:
            self._stop_observing()
            self.store.close()
            raise
        self._thread = threading.Thread(target=self._run, name=f"pipeline-{self.config.pipeline.id}", daemon=True)
        self._thread.start()
        self.log.info("pipeline started")

    def healthy(self) -> tuple[bool, str]:
        """``/healthz``: the pipeline's threads run (it has neither stopped nor failed)."""
        if self._thread is not None and self._thread.is_alive() and not self._stop.is_set():
            return True, "running"
        return False, "stopped" if self._error is None else f"failed: {self._error}"

    def ready(self) -> tuple[bool, str]:
        """``/readyz``: the apply worker streams, and neither its read loop nor its destination write has been
        stuck for ``[metrics] stuck_after_s``."""
        healthy, why = self.healthy()
        if not healthy:
            return False, why
        apply = self._apply
        if apply is None or not self._streaming:
            return False, "not streaming (starting, or reconnecting to the source)"
        stuck_after = self.config.metrics.stuck_after_s if self.config.metrics else MetricsSection().stuck_after_s
        stalled = apply.stalled_for()
        if stalled > stuck_after:
            return False, (
                f"the apply worker has made no progress for {stalled:.0f}s (a destination write hangs, or its read loop"
                " stopped)"
            )
        return True, "streaming"

    def _observe(self) -> None:
        section = self.config.metrics
        if section is None:
            return
        self._sampler = Sampler(
            self.config.source,
            self.config.pipeline.id,
            self.metrics,
            lambda: self._apply.confirmed_lsn() if self._apply is not None else None,
            section.sample_interval_s,
        )
        if section.listen is not None:
            self._server = MetricsServer(section.listen, self.metrics, self.healthy, self.ready)

    def _stop_observing(self) -> None:
        for part in (self._server, self._sampler):
            if part is not None:
                part.close()
        self._server = self._sampler = None

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

    def shutdown(self, timeout: float | None = None) -> bool:
        """Drain the batch in flight, store progress, stop the workers and release the lock.

        Waits at most ``timeout`` seconds (``None``: as long as it takes) for the workers, and returns
        whether they stopped. When they did not (a worker blocked on an unresponsive source, say), the
        destination and the store stay open, since a worker may still use them; the caller decides what
        to do, such as ``etl run`` exiting the process. Durable progress is kept either way.
        """
        self._stop.set()
        stopped = False
        try:
            stopped = self.wait(timeout)
        finally:
            self._stop_observing()
            if self._thread is not None and self._thread.is_alive():
                self.log.warning(
                    "pipeline workers did not stop in time; the destination and the store are left open",
                    timeout_s=timeout,
                )
            else:
                stopped = True
                self.destination.shutdown()
                self.store.close()
                self.log.info("pipeline stopped")
        return stopped

    def request_stop(self) -> None:
        """Ask the pipeline to stop (safe from a signal handler); ``wait()`` returns once it did."""
        self._stop.set()

    def resync(self, table_id: TableId, where: str | None = None) -> None:
        """Copy one table again while the others keep streaming, or with ``where`` only the rows it picks into the
        table as it is (``Store.request_resync``; taken within seconds)."""
        self.store.request_resync(table_id, where)

    def _fail(self, error: BaseException) -> None:
        """Stop the pipeline because of ``error`` (from any worker); ``wait()`` raises it."""
        if self._error is None:
            self._error = error
        self.log.error("pipeline failed", error=str(error))
        self._stop.set()

    @property
    def states(self) -> TableStates | None:
        """The live table states, once started."""
        return self._states

    # -- internals -------------------------------------------------------------------------------------
    def _preflight(self) -> None:
        with connect(self.config.source) as conn:
            self._check_slot_free(conn)
            if not publication_exists(conn, self.config.pipeline.publication):
                raise SourceError(
                    f"publication '{self.config.pipeline.publication}' does not exist in"
                    f" {self.config.source.describe()}",
                    hint=f"CREATE PUBLICATION {self.config.pipeline.publication} FOR TABLE ...; or fix [pipeline]"
                    " publication",
                )
            publication = self.config.pipeline.publication
            unpublished = self.config.copy_.unpublished({t.name for t in publication_tables(conn, publication)})
            if unpublished:  # a warning: a skipped table dropped since must not stop every later start
                error = copy_names_error(publication, unpublished)
                self.log.warning(error.message, hint=error.hint)
            if self.config.pipeline.install_ddl_trigger:
                self._install_ddl_trigger(conn)

    def _check_slot_free(self, conn: psycopg.Connection[Any]) -> None:
        """Fail at once when another process streams this pipeline's slot (as a second run with a memory store
        would, which has no lock to take). A just-killed run's server process may hold it a moment longer."""
        slot = apply_slot(self.config.pipeline.id)
        deadline = time.monotonic() + SLOT_RELEASE_WAIT_S
        while (pid := slot_state(conn, slot).active_pid) is not None:
            if time.monotonic() >= deadline:
                raise SourceError(
                    f"replication slot {slot} is active for process {pid} on the source: another `etl run` of"
                    f" pipeline {self.config.pipeline.id} streams from it",
                    hint="stop the other run first, or give this pipeline its own [pipeline] id",
                )
            time.sleep(0.2)

    def _install_ddl_trigger(self, conn: psycopg.Connection[Any]) -> None:
        result = install_ddl_trigger(conn)
        if not result:
            self.log.warning(
                "DDL trigger not installed; schema changes are seen from the replication stream only",
                reason=result.reason,
                lost="nullability, defaults and certain renames (a rename can look like a drop plus an add)",
                hint="have a superuser run what `etl ddl-trigger --print-sql` prints on the source database (pipe it"
                " into psql), or set [pipeline] install_ddl_trigger = false",
            )

    def _run(self) -> None:
        delays = backoff_delays()
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    self._run_apply()
                    return
                except TransientError as exc:
                    self.metrics.reconnects.inc()
                    self.metrics.errors.labels("source").inc()
                    if time.monotonic() - began >= self.healthy_attempt_s:
                        delays = backoff_delays()  # a healthy run: this outage starts from the shortest delay
                    delay = next(delays)
                    self.log.warning("connection lost; reconnecting", error=str(exc), retry_in=round(delay, 2))
                    self._stop.wait(delay)
        except BaseException as exc:
            self._error = exc
            self.metrics.errors.labels("fatal").inc()
            self.log.error("pipeline failed", error=str(exc))
        finally:
            self._stop.set()
            self._stop_sync_workers()

    def _stop_sync_workers(self) -> None:
        if self._sync_workers:
            self.log.info("waiting for the copies and catch-ups in flight to stop", tables=len(self._sync_workers))
        for worker in self._sync_workers.values():
            worker.cancel()
        for worker in self._sync_workers.values():
            worker.thread.join()
        self._sync_workers.clear()

    def _run_apply(self) -> None:
        config = self.config
        slot = apply_slot(config.pipeline.id)
        with ReplicationConnection.connect(config.source) as rconn:
            protocol, streaming = choose_protocol(rconn.server_version)
            with connect(config.source) as conn:
                state = slot_state(conn, slot)
            if apply_slot_lost(state, self.store):
                self._slot_lost(rconn, slot, state)
            failover = rconn.failover_slots(config.pipeline.failover_slots)
            if state.exists and not state.invalidated and failover != state.failover and rconn.server_version >= 170000:
                rconn.set_failover(slot, failover)
            if not state.exists or state.invalidated:
                created = rconn.create_slot(slot, failover=failover)
                # From now on the store says a slot existed: should it vanish, that is noticed (_slot_lost).
                self.store.upsert_progress(APPLY_WORKER, created.consistent_point)
            slot_position = state.confirmed_flush_lsn if state.exists and not state.invalidated else Lsn.ZERO
            start = Lsn(max(self.store.get_progress(APPLY_WORKER) or 0, slot_position))
            assert self._states is not None and self._schemas is not None
            ctx = WorkerContext(
                config,
                self.store,
                self.destination,
                self._states,
                self._schemas,
                protocol,
                streaming,
                self._retries,
                self._fail,
                self.metrics,
                self._stop,
                self._activity,
            )
            writer = BatchWriter(
                self.destination,
                self.store,
                APPLY_WORKER,
                self._on_table_error,
                start,
                metrics=self.metrics,
                activity=self._activity,
            )
            self._apply = worker = ApplyWorker(ctx, rconn, writer, self._sync_workers)
            worker.refresh()
            try:
                rconn.start_replication(slot, start, [config.pipeline.publication], protocol, streaming)
                self.log.info("streaming", slot=slot, start_lsn=str(start), protocol=protocol)
                self._streaming = True
                worker.run()
            except PublicationMissingError as exc:
                raise self._publication_error(exc) from None
            finally:
                self._streaming = False
                writer.close()
                ctx.close()
        if worker.copies_done:
            self._drop_after_copies()

    def _drop_after_copies(self) -> None:
        """``initial_only``: the copies are done and nothing streams on, so no slot of the pipeline may hold WAL on
        the source (a table's own slot that a failed drop left behind included)."""
        with connect(self.config.source) as conn:
            slots = pipeline_slots(conn, self.config.pipeline.id)
        with ReplicationConnection.connect(self.config.source) as rconn:
            for slot in slots:
                rconn.drop_slot_if_exists(slot)
        self.log.info(
            "the pipeline's slots are dropped: its copies are final",
            slots=slots,
            hint="to stream from here on, run a pipeline of another [pipeline] id; this one would copy again"
            " (etl reset --recopy)",
        )

    def _on_table_error(self, table_id: int, error: Any) -> None:
        assert self._apply is not None
        self._apply.table_failed(table_id, error)

    def _slot_lost(self, rconn: ReplicationConnection, slot: str, state: SlotState) -> None:
        """The apply slot is invalidated, or gone while the store holds progress for it: changes were lost.

        Never start a new slot later than the store's progress without copying again: stop, or (``recreate``)
        drop what is left and copy every table again.
        """
        if self.config.pipeline.invalidated_slot == "stop":
            raise slot_lost_error(slot, state, "<pipeline file>", ' (or set [pipeline] invalidated_slot = "recreate")')
        self.log.warning("replication slot lost; recreating it and copying every table again", slot=slot)
        # A copy or catch-up still running would write its state over the reset: a catch-up that ends at the lost
        # slot's position would make its table ready without the changes between there and the new slot.
        self._stop_sync_workers()
        rconn.drop_slot_if_exists(slot)
        self.store.reset_tables_for_resync()
        assert self._states is not None
        self._states.reload()

    def _publication_error(self, error: PublicationMissingError) -> SourceError:
        """The server could not find the publication where it decodes; say how to get out of it."""
        publication = self.config.pipeline.publication
        with connect(self.config.source) as conn:
            exists = publication_exists(conn, publication)
        if not exists:
            return error
        return SourceError(
            f"{error.message}; publication '{publication}' exists now, so it was dropped and created again after the"
            " slot's position, and the slot can never decode past that point",
            hint="copy every table again from a new slot: etl reset --recopy -c <pipeline file>",
        )


def apply_slot_lost(state: SlotState, store: Store) -> bool:
    """The apply slot is invalidated, or gone while the store holds progress that only it could continue from.

    Either way changes were lost: the run stops (or copies everything again), and ``etl check`` and ``etl status``
    say so.
    """
    if state.invalidated:
        return True
    if state.exists:
        return False
    if store.get_progress(APPLY_WORKER) is not None:
        return True
    return any(s.kind is not TableStateKind.INIT for s in store.get_table_states().values())


def slot_lost_error(slot: str, state: SlotState, config_path: str, alternative: str = "") -> SlotLostError:
    """The error, and the way out, of a lost apply slot (``apply_slot_lost``)."""
    return SlotLostError.of(
        slot,
        state,
        "the destination cannot be brought up to date from it",
        f"copy every table again: etl reset --recopy -c {config_path}{alternative}; raise max_slot_wal_keep_size on"
        " the source if WAL removal invalidated it (docs/configuration.md, Source failover)",
    )


def copy_names_error(publication: str, names: list[TableName]) -> ConfigError:
    """``[copy] include`` or ``skip`` names tables the publication does not publish."""
    return ConfigError(
        f"[copy] include/skip name tables that publication '{publication}' does not publish: "
        + ", ".join(str(n) for n in names),
        hint="fix the names (schema.table), or add the tables to the publication first: ALTER PUBLICATION"
        f" {publication} ADD TABLE ...",
    )


def reset_for_recopy(config: PipelineConfig, store: Store) -> tuple[list[str], int]:
    """Drop every replication slot of the pipeline and set every table back to Init (the pipeline must be stopped).

    The next run creates a new slot and copies every table again. Returns the dropped slots and the number of
    tables reset.
    """
    with connect(config.source) as conn:
        slots = pipeline_slots(conn, config.pipeline.id)
    with ReplicationConnection.connect(config.source) as rconn:
        dropped = [slot for slot in slots if rconn.drop_slot_if_exists(slot, wait=False)]
    tables = store.reset_tables_for_resync()
    log.info("pipeline reset: every table is copied again at the next run", slots=dropped, tables=tables)
    return dropped, tables


def published_table_id(config: PipelineConfig, table: TableName, where: str | None = None) -> TableId:
    """The id of a table of the pipeline's publication; ``EtlError`` naming the published tables when it is not
    one of them, or saying why ``where`` cannot backfill it (``check_backfill``)."""
    with connect(config.source) as conn:
        published = {t.name: t for t in publication_tables(conn, config.pipeline.publication)}
        if table not in published:
            raise EtlError(
                f"table {table} is not in publication '{config.pipeline.publication}'",
                hint="published tables: " + ", ".join(sorted(str(n) for n in published)),
            )
        if where is not None:
            check_backfill(conn, published[table], where)
    return published[table].id


def _warm_arrow() -> None:
    """Convert one value to Arrow, as every batch does: pyarrow imports pandas at its first conversion (a second
    or more of CPU), which would otherwise fall inside the first batch after every start."""
    pa.array([0])


def request_resync(config: PipelineConfig, store: Store, table: TableName, where: str | None = None) -> TableId:
    """Ask the pipeline, through its store, to copy one published table again (with ``where``: to backfill the rows
    that SQL predicate picks); return the table's id.

    Only whoever can write the store can ask: the running pipeline takes the request within seconds, a stopped
    one when it next starts (nothing in the source's WAL is trusted for this: any role may write there).
    Raises ``EtlError`` when the table is not in the publication or cannot be backfilled with ``where``,
    ``StoreError`` for a store that lives in one process (memory).
    """
    table_id = published_table_id(config, table, where)
    store.request_resync(table_id, where)
    log.info("resync requested", table=str(table), where=where)
    return table_id
