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
_URL_PASSWORD = re.compile(r"(\w[\w+.-]*://[^:/@\s]*:)([^@\s]+)(@)")
REDACTED = "**********"


def redact_text(text: str) -> str:
    """Mask ``password=...``-style values and URL passwords in free text (conninfo, URLs, errors)."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", text)
    return _SECRET_IN_TEXT.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


def redact_value(key: str, value: Any) -> Any:
    """The value to show for a named setting: masked when the key names a secret or the text holds one."""
    if _SECRET_KEY.search(key):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    return value


def _drop_none(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Leave out keys whose value is None (``hint=None`` of an error without a hint, say): they tell nothing."""
    for key in [k for k, v in event.items() if v is None and k != "event"]:
        del event[key]
    return event


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event.items()):
        event[key] = redact_value(key, value)
    return event


def configure_logging(fmt: LogFormat = "console", level: str = "info") -> None:
    """Route structlog (and stdlib logging, e.g. from libraries) to stderr in the chosen format."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _drop_none,
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
