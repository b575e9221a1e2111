"""The destination contract (``etl.testing.destination_contract``) for the sqlite_mirror destination, read back
with its ``MirrorReader``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from etl.destination.base import Destination
from etl.schema import TableSchema
from etl.testing.destination_contract import DestinationContract

from etl_plugin_example import MirrorReader, SqliteMirrorDestination


class TestSqliteMirrorDestination(DestinationContract):
    @pytest.fixture
    def destination(self, tmp_path: Path) -> Iterator[SqliteMirrorDestination]:
        destination = SqliteMirrorDestination(tmp_path / "mirror.db")
        destination.startup()
        yield destination
        destination.shutdown()

    def read_rows(self, destination: Destination, schema: TableSchema) -> list[dict[str, Any]]:
        assert isinstance(destination, SqliteMirrorDestination)
        with closing(MirrorReader(destination.path)) as reader:
            return [{name: row[name] for name in schema.column_names} for row in reader.rows(schema.name)]
