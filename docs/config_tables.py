"""Rewrites the config key tables of the docs from the config models: ``python docs/config_tables.py``.

Each table sits between ``<!-- generated: NAME -->`` and ``<!-- end generated -->`` and is made from the model
``TABLES`` maps NAME to (``etl.config_reference``); the prose around the tables is written by hand. Needs every
package of the repository installed, as in the tests environment: run ``REGENERATE``.
``tests/test_config_docs.py`` fails while a table differs from its model.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from etl.config import BatchSection, CopySection, MetricsSection, PipelineSection, PostgresConnection
from etl.config_reference import fill_config_tables
from etl_spark.bigquery.config import BigQueryConfig
from etl_spark.ducklake.config import DuckLakeConfig
from etl_store_postgres.store import PostgresStoreConfig
from etl_store_sqlite.store import SqliteStore

DOCS = Path(__file__).resolve().parent
REGENERATE = "./dev tox exec -e tests -- python docs/config_tables.py"

TABLES: dict[str, dict[str, type[BaseModel]]] = {
    "configuration.md": {
        "pipeline": PipelineSection,
        "source": PostgresConnection,
        "copy": CopySection,
        "batch": BatchSection,
        "metrics": MetricsSection,
    },
    "destinations/ducklake.md": {"ducklake": DuckLakeConfig},
    "destinations/bigquery.md": {"bigquery": BigQueryConfig},
    "stores.md": {"sqlite": SqliteStore.Config, "postgres": PostgresStoreConfig},
}
"""Per document under docs/, the model of each of its generated blocks."""


def generated() -> dict[Path, str]:
    """Each document's text with its tables made from the models."""
    return {
        DOCS / name: fill_config_tables((DOCS / name).read_text(encoding="utf-8"), models)
        for name, models in TABLES.items()
    }


def main() -> None:
    for path, text in generated().items():
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
