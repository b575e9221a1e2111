"""What the Spark driver JVM prints, logged as events of this process's log.

PySpark's JVM writes on the process's own stdout and stderr: Spark's log4j lines and the JVM's notices,
outside the pipeline's log format (``--log-format json`` included). Here the JVM starts with the log4j2
configuration shipped beside this module, which writes one line per event (``LEVEL logger: message``, line
breaks escaped), and its stdout and stderr are pipes: a thread per pipe logs each line as an event of the
``spark`` logger, at the level log4j gave it. Lines not from log4j (the JVM's notices, Python workers'
prints) are logged at info from stdout and at warning from stderr.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import structlog

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")

log = structlog.get_logger(__name__)

_LEVELS = {"TRACE": "debug", "DEBUG": "debug", "INFO": "info", "WARN": "warning", "ERROR": "error", "FATAL": "critical"}

_NOTICES = ("WARNING: Using incubator modules", "NOTE: Picked up JDK_JAVA_OPTIONS", "Picked up JAVA_TOOL_OPTIONS")
"""What the JVMs of Spark 4 print on start, telling nothing new: logged at debug."""


def java_options() -> str:
    """The driver JVM option that selects the shipped log4j2 configuration (quoted: the path may hold spaces)."""
    return f'"-Dlog4j2.configurationFile={LOG4J_CONFIG}"'


def parse(line: str, default: str) -> tuple[str, str, dict[str, str]]:
    """One line the JVM printed, as (level, message, fields); ``default`` is the level of a line not from log4j."""
    level, _, rest = line.partition(" ")
    source, separator, message = rest.partition(": ")
    if level in _LEVELS and separator and " " not in source:
        text = message.replace("\\r\\n", "\n").replace("\\n", "\n").replace("\\r", "\n").rstrip()
        return _LEVELS[level], text, {"source": source}
    if line.startswith(_NOTICES):
        return "debug", line, {}
    return default, line, {}


@contextmanager
def routed() -> Iterator[dict[str, int]]:
    """The ``stdout`` and ``stderr`` to start the JVM with (``Popen`` keyword arguments): pipes whose lines are
    logged from before the JVM starts until it exits. Readers come first, so a JVM that prints much before it is
    up never blocks on a full pipe, and one that fails to start has said why in the log. The JVM's ends are
    closed here once it started (or failed to)."""
    pipes = [os.pipe(), os.pipe()]
    for (read, _), default in zip(pipes, ("info", "warning"), strict=True):
        stream = os.fdopen(read, "rb")
        threading.Thread(target=_pump, args=(stream, default), name="spark-jvm-log", daemon=True).start()
    try:
        yield {"stdout": pipes[0][1], "stderr": pipes[1][1]}
    finally:
        for _, write in pipes:
            os.close(write)


def _pump(stream: IO[bytes], default: str) -> None:
    """Log each line until the JVM closes its end. A line that cannot be logged is dropped, not the reader: a
    reader that stopped would leave the JVM blocked on a full pipe."""
    with stream:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\r\n")
            if not line.strip():
                continue
            level, message, fields = parse(line, default)
            with contextlib.suppress(Exception):
                getattr(log, level)(message, logger="spark", **fields)
