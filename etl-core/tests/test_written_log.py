"""The "changes written" info line: one per durable batch on a quiet stream, one per interval on a busy one."""

from __future__ import annotations

from structlog.testing import capture_logs

from etl.lsn import Lsn
from etl.replication.written_log import WrittenLog
from etl.schema import TableId


class Clock:
    """A stand-in for ``time.monotonic`` that the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def batch(inserts: int = 0, updates: int = 0, deletes: int = 0) -> dict[str, int]:
    return {"insert": inserts, "update": updates, "delete": deletes, "truncate": 0}


def test_a_quiet_stream_logs_each_batch_and_a_busy_one_sums_an_interval() -> None:
    clock = Clock()
    written = WrittenLog("apply", every_s=10, clock=clock)
    with capture_logs() as logs:
        written.written(batch(inserts=3), {TableId(1)}, 0.25, Lsn(100))
        clock.now += 1
        written.written(batch(updates=2), {TableId(1)}, 0.5, Lsn(200))
        clock.now += 1
        written.written(batch(deletes=1), {TableId(2)}, 0.25, Lsn(300))
        lines_within_the_interval = len(logs)
        clock.now += 10
        written.written(batch(inserts=1), {TableId(3)}, 0.5, Lsn(400))
        written.written(batch(inserts=5), {TableId(3)}, 0.5, Lsn(500))
        written.flush()  # the stream stops: what is pending is logged
        written.flush()  # and only once
    assert lines_within_the_interval == 1
    common = {"event": "changes written", "log_level": "info", "worker": "apply", "truncates": 0}
    assert logs == [
        common | {"batches": 1, "inserts": 3, "updates": 0, "deletes": 0, "tables": 1, "write_s": 0.25, "lsn": "0/64"},
        common | {"batches": 3, "inserts": 1, "updates": 2, "deletes": 1, "tables": 3, "write_s": 1.25, "lsn": "0/190"},
        common | {"batches": 1, "inserts": 5, "updates": 0, "deletes": 0, "tables": 1, "write_s": 0.5, "lsn": "0/1F4"},
    ]
