"""An example third-party etl plugin: the ``sqlite_mirror`` destination and the ``json_file`` store."""

from etl_plugin_example.json_file_store import JsonFileStore
from etl_plugin_example.mirror_reader import MirrorReader
from etl_plugin_example.sqlite_mirror import SqliteMirrorDestination

__all__ = ["JsonFileStore", "MirrorReader", "SqliteMirrorDestination"]
