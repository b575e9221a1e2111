"""The hooks a plugin implements: the whole contract between ``etl`` and a plugin module.

A plugin module, named by an entry point of the ``etl`` group, implements one or both hooks below,
each marked with ``etl.plugins.hookimpl``. Each returns classes that satisfy ``PluginFactory``: a destination
class ``DestinationFactory`` (``etl.destination.base``), a store class ``StoreFactory`` (``etl.store.base``).
A function marked ``hookimpl`` whose name is not a hook here makes the plugin broken, so a misspelt
hook is reported instead of contributing nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import pluggy
from pydantic import BaseModel

if TYPE_CHECKING:
    from etl.destination.base import DestinationFactory
    from etl.store.base import StoreFactory

PROJECT = "etl"

ContextT_contra = TypeVar("ContextT_contra", contravariant=True)
BuiltT_co = TypeVar("BuiltT_co", covariant=True)


class PluginFactory(Protocol[ContextT_contra, BuiltT_co]):
    """What a plugin registers: a class with a name, a config model, and a constructor from both and what the
    pipeline hands it (its context: a destination's context, a store's pipeline id)."""

    name: ClassVar[str]

    @property
    def Config(self) -> type[BaseModel]:  # noqa: N802 - the class attribute plugins define
        """The model of the section's options: read-only here, so a nested ``class Config(BaseModel)`` and a
        ``ClassVar`` holding a subclass both satisfy it (a plain protocol attribute is invariant)."""

    @classmethod
    def from_config(cls, config: Any, context: ContextT_contra) -> BuiltT_co: ...


hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def etl_destinations() -> Iterable[type[DestinationFactory]]:  # type: ignore[empty-body]
    """Destination classes: each has ``name`` (the ``type`` users write), ``Config`` and ``from_config``."""


@hookspec
def etl_stores() -> Iterable[type[StoreFactory]]:  # type: ignore[empty-body]
    """Store classes: each has ``name`` (the ``type`` users write), ``Config`` and ``from_config``."""
