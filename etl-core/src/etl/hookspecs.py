"""The hooks a plugin implements: the whole contract between ``etl`` and a plugin module.

A plugin module, named by an entry point of the ``etl`` group, implements one or both hooks below,
each marked with ``etl.plugins.hookimpl``. Each returns classes that satisfy ``PluginFactory``
(``etl.plugin_factory``): a destination class ``DestinationFactory`` (``etl.destination.base``), a store class
``StoreFactory`` (``etl.store.base``).
A function marked ``hookimpl`` whose name is not a hook here makes the plugin broken, so a misspelt
hook is reported instead of contributing nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from etl.destination.base import DestinationFactory
    from etl.store.base import StoreFactory

PROJECT = "etl"

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def etl_destinations() -> Iterable[type[DestinationFactory]]:  # type: ignore[empty-body]
    """Destination classes: each has ``name`` (the ``type`` users write), ``Config`` and ``from_config``."""


@hookspec
def etl_stores() -> Iterable[type[StoreFactory]]:  # type: ignore[empty-body]
    """Store classes: each has ``name`` (the ``type`` users write), ``Config`` and ``from_config``."""
