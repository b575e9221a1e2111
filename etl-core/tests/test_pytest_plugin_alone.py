"""The ``alone`` marker of the etl pytest plugin: under pytest-xdist such a test runs while no other test runs."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import time

import pytest

LOG = {log!r}


def record(name, what):
    with open(LOG, "a") as log:
        log.write(f"{{time.monotonic()}} {{name}} {{what}}\\n")


@pytest.mark.parametrize("i", range(8))
def test_busy(i):
    record(f"busy{{i}}", "start")
    time.sleep(0.3)
    record(f"busy{{i}}", "end")


@pytest.mark.alone
def test_timed():
    record("alone", "start")
    time.sleep(0.6)
    record("alone", "end")
"""


def test_an_alone_test_runs_while_no_other_test_runs(pytester: pytest.Pytester) -> None:
    log = pytester.path / "log.txt"
    pytester.makepyfile(test_alone=TESTS.format(log=str(log)))
    result = pytester.runpytest_subprocess("-n", "3", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)
    spans: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        at, name, _ = line.split()
        spans.setdefault(name, []).append(float(at))  # CLOCK_MONOTONIC: one clock for every process
    start, end = spans.pop("alone")
    assert len(spans) == 8
    overlapping = [name for name, (s, e) in spans.items() if s < end and e > start]
    assert overlapping == [], f"ran beside the alone test: {overlapping}"
    busy_overlap = any(
        s1 < e2 and s2 < e1 for (n1, (s1, e1)) in spans.items() for (n2, (s2, e2)) in spans.items() if n1 < n2
    )
    assert busy_overlap, "the other tests ran side by side (the run was parallel)"
