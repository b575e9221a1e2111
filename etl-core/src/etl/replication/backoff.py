"""How long the engine waits before it connects again after losing a connection."""

from __future__ import annotations

import random
from collections.abc import Iterator


def backoff_delays(initial: float = 0.5, maximum: float = 30.0) -> Iterator[float]:
    """Endless reconnect delays: exponential from ``initial`` up to ``maximum``, each jittered to 50-100%."""
    if not 0 < initial <= maximum:
        raise ValueError(f"need 0 < initial <= maximum, got initial={initial}, maximum={maximum}")
    ceiling = initial
    while True:
        yield ceiling * random.uniform(0.5, 1.0)
        ceiling = min(maximum, ceiling * 2)
