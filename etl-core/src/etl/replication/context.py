"""What every worker of one pipeline shares."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog

from etl.config import PipelineConfig
from etl.destination.base import Destination
from etl.errors import TransientError
from etl.lsn import Lsn
from etl.metrics import PipelineMetrics
from etl.postgres import ddl
from etl.postgres.connection import connect
from etl.replication.activity import ActivityRecorder
from etl.replication.retries import TableRetries
from etl.replication.schemas import SchemaTracker
from etl.replication.states import TableStates
from etl.replication.stream import StreamSettings
from etl.schema import TableId, TableName
from etl.store.base import CopyProgress, Store, TableState


@dataclass
class WorkerContext:
    config: PipelineConfig
    store: Store
    destination: Destination
    states: TableStates
    schemas: SchemaTracker
    protocol_version: int
    streaming: bool
    retries: TableRetries
    fail: Callable[[BaseException], None]
    """Stop the whole pipeline with this error (``Pipeline.wait`` raises it)."""
    metrics: PipelineMetrics
    stop: threading.Event = field(default_factory=threading.Event)
    activity: ActivityRecorder | None = None
    """Where writers count what they wrote into each table, for ``etl status``."""

    @property
    def pipeline_id(self) -> int:
        return self.config.pipeline.id

    @property
    def publication(self) -> str:
        return self.config.pipeline.publication

    @property
    def stream(self) -> StreamSettings:
        """What a stream worker of this pipeline is built from, with its connection and writer."""
        return StreamSettings(self.protocol_version, self.config.batch, self.schemas, self.stop)

    def resync_command(self, name: TableName | str) -> str:
        return f"etl resync -c <pipeline file> --table {name}"

    def table_failed(self, table_id: TableId, name: TableName | str, error: BaseException) -> TableState:
        """Record the table as Errored, with a timed retry when the failure may pass; return the state."""
        state = self.retries.errored(table_id, error, self.resync_command(name))
        self.states.set(table_id, state)
        self.metrics.errors.labels("table").inc()
        return state

    def copy_progress(self, table_id: TableId) -> Callable[[CopyProgress], None]:
        """Where a table's copy reports its progress: the store, for ``etl status`` in another process.

        A store that is unreachable for a moment (``TransientError``) costs one report, not the copy: the
        next report or the copy's next state change tries again. Other store errors stop the copy as any
        write of the store would (a lost pipeline lock, say).
        """
        store = self.store

        def report(progress: CopyProgress) -> None:
            try:
                store.record_copy_progress(table_id, progress)
            except TransientError as exc:
                structlog.get_logger(__name__).warning(
                    "could not record the copy's progress; the copy goes on", table_id=table_id, error=exc.message
                )

        return report

    def schema_change_recorded(self, lsn: Lsn) -> bool:
        """Ask the source whether its DDL trigger recorded the message at ``lsn`` (``ddl.schema_change_recorded``)."""
        return self._recorded.ask(lsn)

    def close(self) -> None:
        """Close the connections the context keeps (opened again when next needed)."""
        self._recorded.close()

    def __post_init__(self) -> None:
        self._recorded = RecordedMessages(self.config)


class RecordedMessages:
    """Asks the source whether its DDL trigger recorded a message, on one connection kept for it: any login may emit
    ``etl.ddl`` messages by the thousand, and a connection opened for each would cost the pipeline seconds apiece
    (and the source its connection slots). Thread-safe: the apply and table sync workers share it."""

    def __init__(self, config: PipelineConfig) -> None:
        self._config = config
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def ask(self, lsn: Lsn) -> bool:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self._config.source)
            try:
                return ddl.schema_change_recorded(self._conn, lsn)
            except BaseException:
                self._close()  # a broken connection is not used again
                raise

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
