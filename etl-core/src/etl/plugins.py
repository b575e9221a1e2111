"""Plugin discovery: destinations and stores found through the ``etl`` entry-point group.

A plugin module implements one or both hooks of ``etl.hookspecs`` and is named by an entry point::

    [project.entry-points.etl]
    my_plugin = "my_package.plugin"

Each entry point is loaded on its own, so one broken plugin is reported and does not hide the
others. The core registers its memory store and destination through the same path.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import pluggy
import structlog

from etl import hookspecs
from etl.errors import ConfigError, PluginError
from etl.log import route_to_stdlib

ENTRY_POINT_GROUP = "etl"

hookimpl = pluggy.HookimplMarker(hookspecs.PROJECT)

Kind = Literal["destination", "store"]

# Built-in names and the distribution that provides each, for "not installed" messages.
BUILTIN_PROVIDERS: dict[tuple[Kind, str], str] = {
    ("destination", "memory"): "etl-core",
    ("destination", "null"): "etl-core",
    ("destination", "ducklake"): "etl-spark",
    ("destination", "bigquery"): "etl-spark",
    ("store", "memory"): "etl-core",
    ("store", "sqlite"): "etl-store-sqlite",
    ("store", "postgres"): "etl-store-postgres",
}

log = structlog.get_logger(__name__)


_HOOKS: dict[str, Kind] = {"etl_destinations": "destination", "etl_stores": "store"}
"""Each hook of ``etl.hookspecs``, and the kind of plugin class it returns."""


@dataclass(frozen=True)
class PluginInfo:
    name: str
    kind: Kind
    cls: type[Any]
    distribution: str
    version: str


@dataclass(frozen=True)
class BrokenPlugin:
    entry_point: str
    distribution: str
    error: str


@dataclass
class Registry:
    destinations: dict[str, PluginInfo] = field(default_factory=dict)
    stores: dict[str, PluginInfo] = field(default_factory=dict)
    broken: list[BrokenPlugin] = field(default_factory=list)

    def all(self) -> list[PluginInfo]:
        return sorted([*self.destinations.values(), *self.stores.values()], key=lambda p: (p.kind, p.name))

    def destination(self, name: str) -> type[Any]:
        return self._get("destination", self.destinations, name)

    def store(self, name: str) -> type[Any]:
        return self._get("store", self.stores, name)

    def _get(self, kind: Kind, table: dict[str, PluginInfo], name: str) -> type[Any]:
        if name in table:
            return table[name].cls
        installed = ", ".join(sorted(table)) or "none"
        provider = BUILTIN_PROVIDERS.get((kind, name))
        hint = (
            f"'{name}' is provided by the {provider} package: pip install {provider}"
            if provider
            else f"install the package that provides the '{name}' {kind}, or pick an installed one"
        )
        if self.broken:
            hint += "; some plugins failed to load: " + "; ".join(f"{b.distribution}: {b.error}" for b in self.broken)
        raise ConfigError(f"unknown {kind} type '{name}' (installed: {installed})", hint=hint)


def load_registry(entry_points: Iterable[md.EntryPoint] | None = None) -> Registry:
    """Load every plugin of the ``etl`` entry-point group into a registry.

    Raises ``PluginError`` when two plugins claim one name. A plugin that fails to import, whose hook fails,
    that implements no hook, or one ``etl.hookspecs`` does not have (``check_pending``), is recorded in
    ``Registry.broken`` and logged, and does not stop the others.
    """
    route_to_stdlib()  # what embedding code calls first; the CLI has configured logging by now
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    registry = Registry()
    eps = entry_points if entry_points is not None else md.entry_points(group=ENTRY_POINT_GROUP)
    for ep in sorted(eps, key=lambda e: e.name):
        dist_name, version = _distribution(ep)
        module: object = None
        try:
            module = ep.load()
            manager.register(module, name=f"{dist_name}:{ep.name}")
            found = _classes_of(manager, module)
        except Exception as exc:  # a broken plugin must not hide the others
            if module is not None and manager.is_registered(module):
                manager.unregister(module)
            error = str(exc) if isinstance(exc, _NotAPlugin) else f"{type(exc).__name__}: {exc}"
            broken = BrokenPlugin(ep.value, dist_name, error)
            registry.broken.append(broken)
            log.warning("plugin failed to load", entry_point=ep.value, distribution=dist_name, error=broken.error)
            continue
        for kind, cls in found:
            table = registry.destinations if kind == "destination" else registry.stores
            name = getattr(cls, "name", None)
            if not isinstance(name, str) or not name:
                registry.broken.append(BrokenPlugin(ep.value, dist_name, f"{cls!r} has no string 'name'"))
                continue
            info = PluginInfo(name, kind, cls, dist_name, version)
            if name in table:
                other = table[name]
                raise PluginError(
                    f"two plugins claim the {kind} name '{name}': {other.distribution} ({other.cls.__module__})"
                    f" and {dist_name} ({cls.__module__})",
                    hint="uninstall one of the two distributions",
                )
            table[name] = info
    return registry


class _NotAPlugin(Exception):
    """The module implements no hook of ``etl.hookspecs``, or one that is not there."""


def _classes_of(manager: pluggy.PluginManager, module: object) -> list[tuple[Kind, Any]]:
    """Check the plugin's hooks against ``etl.hookspecs`` and call them, through pluggy, leaving out every other
    plugin, so that a failure stays this plugin's own."""
    callers = manager.get_hookcallers(module) or []
    try:
        manager.check_pending()
    except pluggy.PluginValidationError:
        unknown = sorted(caller.name for caller in callers if not caller.has_spec())
        raise _NotAPlugin(
            f"unknown hook {', '.join(unknown)}: etl's hooks are {', '.join(_HOOKS)} (etl.hookspecs)"
        ) from None
    implemented = [caller.name for caller in callers if caller.name in _HOOKS]
    if not implemented:
        raise _NotAPlugin(f"implements none of etl's hooks ({', '.join(_HOOKS)}), each marked with @hookimpl")
    others = [plugin for plugin in manager.get_plugins() if plugin is not module]
    found: list[tuple[Kind, Any]] = []
    for name in implemented:
        results = manager.subset_hook_caller(name, remove_plugins=others)()
        if not results:  # pluggy leaves out a None: the hook returned nothing
            raise _NotAPlugin(f"its {name} hook returned nothing; it must return a list of classes")
        found += [(_HOOKS[name], cls) for classes in results for cls in classes]
    return found


def _distribution(ep: md.EntryPoint) -> tuple[str, str]:
    dist = ep.dist
    if dist is None:
        return "unknown", "unknown"
    return dist.metadata["Name"], dist.version
