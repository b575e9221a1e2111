"""Logging setup: structlog to stderr as console text or JSON, with secrets redacted."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from datetime import date, time
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


def _iso_times(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Dates and times as ISO 8601 text (``retry_at=2030-05-06T07:08:09+00:00``): the console would show their
    repr, and JSON has no type for them."""
    for key, value in event.items():
        if isinstance(value, (date, time)):
            event[key] = value.isoformat()
    return event


def redact_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The structlog processor that masks secrets in an event's values; a program that configures structlog
    itself puts it in its processors."""
    for key, value in list(event.items()):
        event[key] = redact_value(key, value)
    return event


_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    _drop_none,
    _iso_times,
    redact_secrets,
]
"""What every event goes through, whatever renders it: context, level, time, and secrets masked."""


def route_to_stdlib() -> None:
    """For a program that embeds a ``Pipeline`` and has not configured structlog: send structlog's events
    (process-wide: etl's and any other), secrets masked, to stdlib logging (loggers named for the modules, the
    fields in the message), where the program's own handlers and levels take them.
    A structlog configuration already made (by ``configure_logging``, or by the program) is kept as it is."""
    if structlog.is_configured():
        return
    structlog.configure(  # stdlib records carry the level and time; the message carries every field, as logfmt
        processors=[
            structlog.stdlib.filter_by_level,  # first: an event below the logger's level costs nothing more
            structlog.contextvars.merge_contextvars,
            _drop_none,
            _iso_times,
            redact_secrets,
            structlog.processors.format_exc_info,
            structlog.processors.LogfmtRenderer(key_order=["event"]),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def configure_logging(fmt: LogFormat = "console", level: str = "info") -> None:
    """Route structlog (and stdlib logging, e.g. from libraries) to stderr in the chosen format."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*_SHARED, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED, processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))
    logging.captureWarnings(True)  # a library's warnings.warn too, rather than bare text on stderr
