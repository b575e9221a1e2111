"""The core's own plugins, registered through the ``etl`` entry-point group like any other."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from etl.plugins import hookimpl


@hookimpl
def etl_destinations() -> Iterable[type[Any]]:
    from etl.destination.memory import MemoryDestination
    from etl.destination.null import NullDestination

    return [MemoryDestination, NullDestination]


@hookimpl
def etl_stores() -> Iterable[type[Any]]:
    from etl.store.memory import MemoryStore

    return [MemoryStore]
