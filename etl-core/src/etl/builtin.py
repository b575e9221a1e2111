"""The core's own plugins, registered through the ``etl`` entry-point group like any other."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from etl.plugins import hookimpl

if TYPE_CHECKING:
    from etl.destination.base import DestinationFactory
    from etl.store.base import StoreFactory


@hookimpl
def etl_destinations() -> Iterable[type[DestinationFactory]]:
    from etl.destination.memory import MemoryDestination
    from etl.destination.null import NullDestination

    return [MemoryDestination, NullDestination]


@hookimpl
def etl_stores() -> Iterable[type[StoreFactory]]:
    from etl.store.memory import MemoryStore

    return [MemoryStore]
