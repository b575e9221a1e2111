"""The engine's own histogram of many observations at once exports what prometheus_client's would."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from etl.metrics import LATENCY_BUCKETS, BulkHistogram


def test_a_bulk_histogram_exports_what_one_observe_per_value_does() -> None:
    values = np.array([0.0, 0.005, 0.0051, 0.3, 2.0, 7.5, 1000.0, 0.049])
    bulk_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    bulk = BulkHistogram("etl_latency_seconds", "latency", LATENCY_BUCKETS)
    bulk_registry.register(bulk)
    reference = Histogram("etl_latency_seconds", "latency", buckets=LATENCY_BUCKETS, registry=reference_registry)
    bulk.observe_many(values[:3])
    bulk.observe_many(values[3:])
    for value in values:
        reference.observe(float(value))
    exported = generate_latest(bulk_registry).decode().splitlines()
    expected = generate_latest(reference_registry).decode().splitlines()

    def buckets(lines: list[str]) -> list[str]:
        return [line for line in lines if "_created" not in line and "_sum" not in line]

    def total(lines: list[str]) -> float:
        return float(next(line for line in lines if line.startswith("etl_latency_seconds_sum")).split()[1])

    assert buckets(exported) == buckets(expected)
    assert any('le="0.005"} 2.0' in line for line in exported), "a value on a bound counts in that bound's bucket"
    assert abs(total(exported) - total(expected)) < 1e-9
