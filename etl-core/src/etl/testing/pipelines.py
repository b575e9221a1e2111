"""Helpers for end-to-end tests of pipelines: configs for a test database, waiting for conditions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from etl.config import PipelineConfig
from etl.pipeline import Pipeline
from etl.schema import TableName
from etl.store.base import TableStateKind
from etl.testing.compare import source_rows
from etl.testing.pytest_plugin import TestDatabase

T = TypeVar("T")


def pipeline_config(
    db: TestDatabase, publication: str = "pub", pipeline_id: int = 1, **sections: Any
) -> PipelineConfig:
    """A pipeline config for a test database, with small batches so tests move quickly."""
    raw: dict[str, Any] = {
        "pipeline": {"id": pipeline_id, "publication": publication},
        "source": db.connection().model_dump(),
        "batch": {"max_fill_ms": 100},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return PipelineConfig.model_validate(raw)


def poll_pause(spent: float, least: float) -> float:
    """How long to wait after a poll that took ``spent`` seconds: at least ``least``, and twice the poll's own
    time. A poll that compares every row of the source with the destination then takes at most a third of a
    core, which the pipeline under test needs more (the suite runs its tests side by side)."""
    return max(least, 2 * spent)


def poll(
    probe: Callable[[], T],
    what: str,
    *,
    until: Callable[[T], object] = bool,
    retry_on: tuple[type[BaseException], ...] = (),
    pipeline: Pipeline | None = None,
    timeout: float = 60.0,
    least: float = 0.05,
) -> T:
    """Call ``probe()`` until ``until(value)`` holds and return that value, pausing ``poll_pause(spent, least)``.

    ``probe`` raising one of ``retry_on`` counts as not yet; other exceptions propagate at once. Fails with ``what``
    and the last value (and exception) seen on timeout, and at once if ``pipeline`` stopped.
    """
    deadline = time.monotonic() + timeout
    seen: tuple[T, ...] = ()  # the last value, once there is one
    error: BaseException | None = None
    while True:
        began = time.monotonic()
        try:
            value = probe()
        except retry_on as exc:
            error = exc
        else:
            if until(value):
                return value
            seen = (value,)
        if pipeline is not None and pipeline.wait(timeout=0):
            raise AssertionError(f"the pipeline stopped while waiting for {what}")
        if time.monotonic() > deadline:
            shown = f"last value {_shortened(seen[0])}" if seen else "no value"
            if error is not None:
                shown += f", last exception {_shortened(error)}"
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; {shown}")
        time.sleep(poll_pause(time.monotonic() - began, least))


def _shortened(value: object, limit: int = 400) -> str:
    """``repr(value)``, its middle cut out when longer than ``limit``."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit // 2]} ... {text[-limit // 2 :]}"


def wait_until(condition: Callable[[], bool], what: str, pipeline: Pipeline | None = None, timeout: float = 60) -> None:
    """Poll until ``condition()``; fail with ``what`` on timeout, or at once if the pipeline stopped."""
    poll(condition, what, pipeline=pipeline, timeout=timeout)


def table_states(pipeline: Pipeline) -> dict[int, TableStateKind]:
    states = pipeline.states
    return {t: s.kind for t, s in (states.snapshot() if states is not None else {}).items()}


def all_ready(pipeline: Pipeline, count: int) -> bool:
    kinds = table_states(pipeline)
    return len(kinds) == count and all(k is TableStateKind.READY for k in kinds.values())


class ReadableDestination(Protocol):
    """A destination that can give back a table's rows (as ``MemoryDestination.rows`` does)."""

    def rows(self, name: TableName) -> list[dict[str, Any]]: ...


def destination_matches(db: TestDatabase, destination: ReadableDestination, *tables: str) -> bool:
    """True when every named table holds the same rows in the destination as in the source."""
    conn = db.kept_connection()
    for table in tables:
        try:
            if destination.rows(TableName.parse(table)) != source_rows(conn, table):
                return False
        except KeyError:
            return False
    return True
