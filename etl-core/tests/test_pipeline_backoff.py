"""The reconnect backoff: its delays, and a pipeline's starting over after a healthy period, so outages far
apart each start with the shortest delay instead of the longest one reached before."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from structlog.testing import capture_logs

from etl.config import PipelineConfig
from etl.destination.memory import MemoryDestination
from etl.errors import TransientError
from etl.pipeline import Pipeline
from etl.replication.backoff import backoff_delays
from etl.store.memory import MemoryStore

HEALTHY = 0.3


class ScriptedSource(Pipeline):
    """A pipeline whose connection attempts follow a script, as a stand-in for a source that goes away and
    comes back: each entry is how long an attempt streams before its connection is lost (``None``: the run
    ends there). Everything else is the real reconnect loop (``Pipeline._run``)."""

    healthy_attempt_s = HEALTHY

    def __init__(self, script: Sequence[float | None]) -> None:
        config = PipelineConfig.model_validate({"pipeline": {"id": 1, "publication": "pub"}, "source": {}})
        super().__init__(config, MemoryStore(1), MemoryDestination())
        self.script = list(script)

    def _run_apply(self) -> None:
        lasts = self.script.pop(0)
        if lasts is None:
            return
        self._stop.wait(lasts)
        raise TransientError("connection lost (scripted)")


def reconnect_delays(script: Sequence[float | None]) -> list[float]:
    pipeline = ScriptedSource(script)
    with capture_logs() as logs:
        pipeline._run()
    assert pipeline._error is None, pipeline._error
    return [entry["retry_in"] for entry in logs if entry["event"] == "connection lost; reconnecting"]


def test_backoff_grows_while_attempts_fail_fast_and_starts_over_after_a_healthy_one() -> None:
    # Delays are jittered to 50-100% of 0.5, 1, 2, 4 ... seconds. The third attempt lasts, but not long enough.
    delays = reconnect_delays([0, 0, HEALTHY / 3, HEALTHY + 0.2, 0, None])
    assert len(delays) == 5
    assert 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1 and 1 <= delays[2] <= 2, delays
    assert 0.25 <= delays[3] <= 0.5, f"after a healthy attempt the backoff did not start over: {delays}"
    assert 0.5 <= delays[4] <= 1, f"the series did not grow again from its start: {delays}"


def test_backoff_delays_grow_jittered_and_capped() -> None:
    delays = list(itertools.islice(backoff_delays(0.5, 4.0), 12))
    ceilings = [0.5, 1.0, 2.0, 4.0] + [4.0] * 8
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) > 1
    with pytest.raises(ValueError):
        next(backoff_delays(0, 1))
