"""What a running pipeline shows to the outside: the metrics listener with health checks, and the sampler.

``[metrics] listen = "host:port"`` serves, on one listener:

- ``/metrics``: the pipeline's Prometheus series (``etl.metrics``), destination series included;
- ``/healthz``: 200 while the pipeline's threads run (it has not stopped or failed), else 503;
- ``/readyz``: 200 while the apply worker streams and its read loop keeps turning, else 503.

The ``Sampler`` reads, every ``sample_interval_s``, the source's WAL position (for
``etl_replication_lag_bytes``) and the WAL each of the pipeline's slots holds
(``etl_slot_retained_wal_bytes``) from ``pg_replication_slots``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from etl.config import PostgresConnection
from etl.errors import EtlError
from etl.lsn import Lsn
from etl.metrics import PipelineMetrics
from etl.postgres.catalog import WAL_POSITION
from etl.postgres.connection import connect
from etl.replication.slots import slot_prefix

log = structlog.get_logger(__name__)

Check = Callable[[], tuple[bool, str]]
"""A health check: whether it passes, and a line saying why."""


class MetricsServer:
    """The HTTP listener of ``[metrics] listen``, on a daemon thread until ``close``."""

    def __init__(self, listen: str, metrics: PipelineMetrics, healthy: Check, ready: Check) -> None:
        host, _, port = listen.rpartition(":")
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(metrics.registry)),
            "/healthz": lambda: _answer(healthy),
            "/readyz": lambda: _answer(ready),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                status, content_type, body = route() if route else (HTTPStatus.NOT_FOUND, "text/plain", b"not found\n")
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds would drown the log

        try:
            self._server = ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
        except OSError as exc:
            raise EtlError(
                f"cannot listen on {listen} for metrics: {exc.strerror or exc}",
                hint="choose a free port in [metrics] listen, or remove the section",
            ) from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        log.info("metrics served", url=f"http://{listen}/metrics")

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _answer(check: Check) -> tuple[int, str, bytes]:
    ok, why = check()
    return (HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE), "text/plain; charset=utf-8", f"{why}\n".encode()


class Sampler:
    """Samples the source for the lag and the WAL held by the slots, every ``interval`` seconds, on a thread."""

    def __init__(
        self,
        source: PostgresConnection,
        pipeline_id: int,
        metrics: PipelineMetrics,
        durable: Callable[[], Lsn | None],
        interval: float,
    ) -> None:
        self._source = source
        self._prefixes = slot_prefix(pipeline_id)
        self._metrics = metrics
        self._durable = durable
        self._interval = interval
        self._stop = threading.Event()
        self._slots: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        failure = None
        while not self._stop.is_set():
            try:
                self.sample()
                failure = None
            except Exception as exc:  # keep the last values and go on sampling
                # The source being away is the apply worker's to report; any other failure is told once.
                reported, failure = failure, f"{type(exc).__name__}: {exc}"
                quiet = isinstance(exc, EtlError) or reported == failure
                (log.debug if quiet else log.warning)("metrics sample failed", error=failure)
            self._stop.wait(self._interval)

    def sample(self) -> None:
        apply_name, sync_prefix = self._prefixes
        with connect(self._source) as conn:
            rows = conn.execute(
                f"SELECT {WAL_POSITION}::text, slot_name,"
                f" pg_wal_lsn_diff({WAL_POSITION}, restart_lsn)::bigint"
                " FROM (SELECT 1) one LEFT JOIN pg_catalog.pg_replication_slots"
                " ON slot_name = %s OR starts_with(slot_name, %s)",
                (apply_name, sync_prefix),
            ).fetchall()
        position, durable = rows[0][0], self._durable()
        if position is not None and durable is not None:  # a standby that has replayed nothing yet has none
            self._metrics.replication_lag_bytes.set(max(0, Lsn.parse(position) - durable))
        slots = {slot: held for _, slot, held in rows if slot is not None}
        for gone in self._slots - slots.keys():
            self._metrics.slot_retained_wal_bytes.remove(gone)
        for slot, held in slots.items():
            self._metrics.slot_retained_wal_bytes.labels(slot).set(held or 0)
        self._slots = set(slots)
