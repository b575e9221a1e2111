"""A fault-injecting HTTP proxy for tests: in front of the BigQuery emulator, it answers chosen requests
with an error status, or drops the connection, and forwards the rest unchanged.

Faults are real HTTP: the client library sees a 503, a 429 or a reset connection exactly as from
Google, so its own retries and the destination's classification run as in production. A fault
matches a request by method and a piece of its path or body (``"MERGE"``, ``"/jobs"``); each fires
``times`` times, or until ``until`` passes.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import structlog

log = structlog.get_logger(__name__)

DROP = 0
"""The ``status`` of a fault that closes the connection without an answer, the request never forwarded."""
LOSE_ANSWER = -1
"""The ``status`` of a fault that forwards the request, then closes the connection without its answer: the
server did the work, the client cannot know."""


@dataclass
class Fault:
    status: int
    """The HTTP status to answer, or ``DROP``."""
    reason: str = "backendError"
    """BigQuery's error ``reason`` in the answer's body."""
    method: str | None = None
    contains: str = ""
    """A piece of the request's path or body that the fault matches."""
    times: int = 1
    until: float | None = None
    """A ``time.monotonic()`` until which it fires, however often (``times`` is then ignored)."""
    fired: int = 0

    def matches(self, method: str, path: str, body: bytes) -> bool:
        if self.method is not None and method != self.method:
            return False
        if self.contains and self.contains not in path and self.contains.encode() not in body:
            return False
        return time.monotonic() < self.until if self.until is not None else self.fired < self.times


@dataclass
class FaultProxy:
    """Forwards to ``upstream`` (``http://host:port``); ``endpoint`` is where clients connect."""

    upstream: str
    faults: list[Fault] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    endpoint: str = ""

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def fault_for(self, method: str, path: str, body: bytes) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path, body):
                    fault.fired += 1
                    return fault
        return None

    @contextmanager
    def running(self) -> Iterator[FaultProxy]:
        proxy = self
        target = urlsplit(self.upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy.fault_for(self.command, self.path, body)
                if fault is not None and fault.status == LOSE_ANSWER:
                    log.info("fault injected: answer lost", method=self.command, path=self.path)
                    self._upstream(body)
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault is not None:
                    log.info("fault injected", status=fault.status, method=self.command, path=self.path)
                    if fault.status == DROP:
                        self.close_connection = True
                        self.connection.close()
                        return
                    payload = json.dumps(
                        {
                            "error": {
                                "code": fault.status,
                                "message": f"injected {fault.reason}",
                                "errors": [{"reason": fault.reason, "message": f"injected {fault.reason}"}],
                            }
                        }
                    ).encode()
                    self.send_response(fault.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                answer, data = self._upstream(body)
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _upstream(self, body: bytes) -> tuple[http.client.HTTPResponse, bytes]:
                upstream = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=300)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    answer = upstream.getresponse()
                    return answer, answer.read()
                finally:
                    upstream.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward  # noqa: N815 - http.server calls these

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True)
        thread.start()
        self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
