"""The SQL that applies a batch's staged rows to a target table, as text: BigQuery runs it in one script.

A table with a key: its touched keys deleted and the upserts inserted (``upsert``); without a key: images losing
copies deleted and inserted again in their remaining number, images gaining copies inserted (``add_and_remove``);
in ``history`` mode every change appended (``append_history``). Staged columns are converted to their target
types on the way (``converted``).
"""

from __future__ import annotations

from etl.api import ColumnSchema, TableSchema
from etl_spark.bigquery import history
from etl_spark.bigquery.names import column_name
from etl_spark.bigquery.staging import MISSING_TEXT
from etl_spark.bigquery.types import bq_type, is_array
from etl_spark.collapse import ACTION, NET, UPSERT

CHANGES = "_etl_changes"
"""The temporary table holding a batch's collapsed changes in target types, inside the apply transaction."""
STORED = "_etl_stored"
"""For tables without a key, the temporary table counting the stored occurrences of row images losing copies."""


def upsert(
    schema: TableSchema, target: str, staging: str, toast: list[str], key_range: tuple[int, int] | None
) -> list[str]:
    """Statements applying the collapsed changes in ``staging``: the keys they touch are deleted, upserts inserted.

    Not a MERGE: local-bigquery runs a MERGE inside its own DuckDB transaction, which cannot nest in
    the script's (the emulator then aborts the whole script), while DELETE and INSERT work in both.
    The changes are first converted into a temporary table, so unchanged TOAST values are read
    from the stored rows before those rows are deleted.
    """
    key = [column_name(c.name) for c in schema.key_columns]
    names = [column_name(c.name) for c in schema.columns]
    source = f"SELECT {converted(schema)}, S.{ACTION} FROM {staging} AS S"
    if toast:
        # Unchanged TOAST values still missing come from the stored row of the prior key.
        prior = same_key(schema, "P.{q}", "S.`_etl_prior_{n}`")
        fills = {column_name(t): t for t in toast}
        values = [
            f"IF(STRPOS(S.{MISSING_TEXT}, ',{fills[n]},') > 0, P.{n}, {conversion(schema, n)}) AS {n}"
            if n in fills
            else f"{conversion(schema, n)} AS {n}"
            for n in names
        ]
        source = f"SELECT {', '.join(values)}, S.{ACTION} FROM {staging} AS S LEFT JOIN {target} AS P ON {prior}"
    touched = same_key(schema, "U.{q}", "T.{q}")
    # A constant range of the first key column lets BigQuery skip the blocks of a table clustered by it.
    bounded = f"T.{key[0]} BETWEEN {key_range[0]} AND {key_range[1]} AND " if key_range else ""
    return [
        f"CREATE TEMP TABLE {CHANGES} AS {source}",
        f"DELETE FROM {target} AS T WHERE {bounded}EXISTS (SELECT 1 FROM {CHANGES} AS U WHERE {touched})",
        f"INSERT INTO {target} ({', '.join(names)}) SELECT {', '.join(names)} FROM {CHANGES}"
        f" WHERE {ACTION} = '{UPSERT}'",
        f"DROP TABLE {CHANGES}",
    ]


def append_history(schema: TableSchema, target: str, staged: str) -> str:
    """The statement appending ``staged``'s history rows (``history``) to ``target``."""
    names = [column_name(c.name) for c in schema.columns] + [name for name, _ in history.COLUMNS]
    extra = ", ".join(f"S.{name}" for name, _ in history.COLUMNS)
    return f"INSERT INTO {target} ({', '.join(names)}) SELECT {converted(schema)}, {extra} FROM {staged} AS S"


def same_key(schema: TableSchema, left: str, right: str) -> str:
    """The condition that two rows have the same key, their columns named by the patterns ``left`` and ``right``
    (``{q}``: a key column's quoted name, ``{n}``: its name). BigQuery has no ``=`` for arrays: an array column
    is compared as its JSON text (``TO_JSON_STRING``: the elements in order, ``[]`` and NULL elements told apart)."""

    def equal(column: ColumnSchema) -> str:
        a, b = (side.format(q=column_name(column.name), n=column.name) for side in (left, right))
        return f"TO_JSON_STRING({a}) = TO_JSON_STRING({b})" if is_array(column) else f"{a} = {b}"

    return " AND ".join(equal(c) for c in schema.key_columns)


def add_and_remove(schema: TableSchema, target: str, staging: str, removes: bool) -> list[str]:
    """Statements applying ``staging``'s net copies per row image (``NET``) to a table without a key.

    Rows are told apart by their whole image, as text (``TO_JSON_STRING``: arrays and JSON have no
    equality). An image losing copies has all its stored occurrences deleted and the remaining
    number inserted again; an image gaining copies has them inserted. Without ``removes`` (only
    inserts) the copies are inserted and the table is not read; otherwise it is scanned twice.
    """
    names = [column_name(c.name) for c in schema.columns]
    if not removes:
        return [
            f"INSERT INTO {target} ({', '.join(names)}) SELECT {converted(schema)} FROM {staging} AS S"
            f" CROSS JOIN UNNEST(GENERATE_ARRAY(1, S.{NET})) AS _etl_copy"
        ]

    def image(alias: str) -> str:
        return f"TO_JSON_STRING(STRUCT({', '.join(f'{alias}.{n}' for n in names)}))"

    copies = f"IF(C.{NET} < 0, IFNULL(N._etl_stored, 0) + C.{NET}, C.{NET})"
    return [
        f"CREATE TEMP TABLE {CHANGES} AS WITH C AS (SELECT {converted(schema)}, S.{NET} FROM {staging} AS S)"
        f" SELECT C.*, {image('C')} AS _etl_image FROM C",
        f"CREATE TEMP TABLE {STORED} AS SELECT {image('T')} AS _etl_image, COUNT(*) AS _etl_stored"
        f" FROM {target} AS T WHERE {image('T')} IN (SELECT _etl_image FROM {CHANGES} WHERE {NET} < 0)"
        " GROUP BY _etl_image",
        f"DELETE FROM {target} AS T WHERE {image('T')} IN (SELECT _etl_image FROM {STORED})",
        f"INSERT INTO {target} ({', '.join(names)}) SELECT {', '.join(f'C.{n}' for n in names)}"
        f" FROM {CHANGES} AS C LEFT JOIN {STORED} AS N ON N._etl_image = C._etl_image"
        f" CROSS JOIN UNNEST(GENERATE_ARRAY(1, {copies})) AS _etl_copy",
        f"DROP TABLE {CHANGES}",
        f"DROP TABLE {STORED}",
    ]


def converted(schema: TableSchema) -> str:
    return ", ".join(f"{conversion(schema, column_name(c.name))} AS {column_name(c.name)}" for c in schema.columns)


def conversion(schema: TableSchema, quoted: str) -> str:
    column = next(c for c in schema.columns if column_name(c.name) == quoted)
    return bq_type(column).load.format(f"S.{quoted}")
