"""The plugin module named by the ``etl`` entry point: etl calls these hooks to find the classes.

Import the classes inside the hooks, so ``etl plugins`` stays fast and an import error is reported
as this plugin's failure without hiding other plugins.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from etl.api import hookimpl

if TYPE_CHECKING:
    from etl.api import DestinationFactory, StoreFactory


@hookimpl
def etl_destinations() -> Iterable[type[DestinationFactory]]:
    from etl_plugin_example.sqlite_mirror import SqliteMirrorDestination

    return [SqliteMirrorDestination]


@hookimpl
def etl_stores() -> Iterable[type[StoreFactory]]:
    from etl_plugin_example.json_file_store import JsonFileStore

    return [JsonFileStore]
