"""What a plugin registers, whatever it builds: the protocol under ``DestinationFactory`` (``etl.destination.base``)
and ``StoreFactory`` (``etl.store.base``), which the hooks of ``etl.hookspecs`` return.

A leaf: the plugin contracts and the hooks import it, and it imports none of them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel

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
