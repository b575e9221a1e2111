"""Logging setup: structlog to stderr as console text or JSON, with secrets redacted."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

LogFormat = Literal["console", "json"]

_SECRET_KEY = re.compile(r"pass(word)?|secret|token|credential|private_key|api_key", re.IGNORECASE)
_SECRET_IN_TEXT = re.compile(r"(password|passwd|secret|token)(\s*[=:]\s*)('[^']*'|\"[^\"]*\"|\S+)", re.IGNORECASE)
REDACTED = "**********"


def redact_text(text: str) -> str:
    """Mask ``password=...``-style values in free text (connection strings, error messages)."""
    return _SECRET_IN_TEXT.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event.items()):
        if _SECRET_KEY.search(key):
            event[key] = REDACTED
        elif isinstance(value, str):
            event[key] = redact_text(value)
    return event


def configure_logging(fmt: LogFormat = "console", level: str = "info") -> None:
    """Route structlog (and stdlib logging, e.g. from libraries) to stderr in the chosen format."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared, processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))
