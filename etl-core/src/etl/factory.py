"""Building a pipeline's store and destination from config, through the plugin registry."""

from __future__ import annotations

from typing import Any, Literal

from etl.config import PipelineConfig, PluginSection
from etl.config_validation import validate
from etl.destination.base import Destination, DestinationContext
from etl.errors import ConfigError
from etl.plugins import Registry, load_registry
from etl.store.base import Store


def validate_plugin(
    registry: Registry, kind: Literal["store", "destination"], section: PluginSection, source: str
) -> tuple[Any, Any]:
    """The plugin class ``section`` names and its validated options, without building it; a ``ConfigError``
    when it is not installed or does not accept the options."""
    return _plugin(registry, kind, section, source)


def _plugin(registry: Registry, kind: str, section: PluginSection, source: str) -> tuple[Any, Any]:
    """The plugin class a section names and its validated options; errors name the file and key."""
    try:
        cls = registry.store(section.type) if kind == "store" else registry.destination(section.type)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {kind}.type: {exc.message}", hint=exc.hint) from None
    return cls, validate(cls.Config, section.options(), source, prefix=kind)


def build_store(config: PipelineConfig, source: str, registry: Registry | None = None) -> Store:
    cls, options = _plugin(registry or load_registry(), "store", config.store, source)
    store: Store = cls.from_config(options, config.pipeline.id)
    return store


def build_destination(
    config: PipelineConfig, store: Store, source: str, registry: Registry | None = None
) -> Destination:
    cls, options = _plugin(registry or load_registry(), "destination", config.destination, source)
    destination: Destination = cls.from_config(options, DestinationContext(config.pipeline.id, store))
    return destination


def validate_plugins(config: PipelineConfig, source: str, registry: Registry | None = None) -> None:
    """Check that both plugin types exist and their options are valid, without opening anything."""
    registry = registry or load_registry()
    _plugin(registry, "store", config.store, source)
    _plugin(registry, "destination", config.destination, source)
