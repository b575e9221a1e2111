"""BigQuery table ids for Postgres tables: ``schema_table``, with ``_`` doubled inside each name.

In an id every run of underscores inside a name has even length; the one separator is the only run of
length one, so two different tables never share an id. That holds when names neither start nor end
with ``_`` and use only ``[A-Za-z0-9_]``; other names are refused with a hint rather than mangled.
"""

from __future__ import annotations

import re
from typing import Final

from etl.api import TableError, TableName

_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_]*[A-Za-z0-9])?")
MAX_TABLE_ID: Final = 1024
STAGING_PREFIX: Final = "_etl_staging_"
"""Staging tables start with ``_``, which no table id does."""


def table_id(name: TableName) -> str:
    """The BigQuery table id of a Postgres table (see the module docstring)."""
    for part in (name.schema, name.name):
        if not _NAME.fullmatch(part):
            raise TableError(
                f"{name}: {part!r} cannot be part of a BigQuery table id (letters, digits and inner underscores only)",
                hint="rename the Postgres table or schema, or leave the table out of the publication",
            )
    result = f"{name.schema.replace('_', '__')}_{name.name.replace('_', '__')}"
    if len(result) > MAX_TABLE_ID:
        raise TableError(f"{name}: the BigQuery table id would exceed {MAX_TABLE_ID} characters")
    return result


def column_name(name: str) -> str:
    """A Postgres column name as a quoted BigQuery identifier."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,299}", name) or name.lower().startswith(("_table_", "_file_")):
        raise TableError(
            f"column {name!r} is not a valid BigQuery column name",
            hint="rename the column (letters, digits, underscores; not starting with a digit, _TABLE_ or _FILE_)",
        )
    return f"`{name}`"
