"""A row predicate given by the pipeline's owner (``etl resync --where``): checked before any query holds it.

The predicate is SQL, so it is written into the queries that read the rows it picks: ``... WHERE key > $after
AND (`` predicate ``)``. Before that, Postgres's own lexer (through pglast) reads it: outside string literals,
quoted names and comments, its parentheses must balance and no ``;`` may appear, so it cannot close the
parenthesis it is written in, nor end the statement. Then the source plans a query with it (``predicate_rows``):
an unknown column, a type that is not boolean or a syntax error is said there, before the request is made.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from etl.errors import ConfigError
from etl.schema import TableName

_OPEN, _CLOSE, _SEMICOLON = "ASCII_40", "ASCII_41", "ASCII_59"


def checked_predicate(text: str) -> str:
    """``text`` when it is one expression that cannot leave the parenthesis it is written in; ``ConfigError``
    otherwise."""
    if not text.strip():
        raise ConfigError(
            "the --where predicate is empty", hint='give a condition on the table\'s columns: "id < 1000"'
        )
    from pglast import parser  # Postgres's lexer: loaded by the commands that take a predicate only

    try:
        tokens = parser.scan(text)
    except parser.ParseError as exc:
        raise ConfigError(
            f"the --where predicate is not valid SQL: {exc}", hint="check its quotes and comments"
        ) from None
    depth = 0
    for token in tokens:
        if token.name == _SEMICOLON:
            raise ConfigError("the --where predicate holds a ';'", hint="give one condition, not statements")
        depth += (token.name == _OPEN) - (token.name == _CLOSE)
        if depth < 0:
            raise ConfigError(
                "the --where predicate closes a parenthesis it did not open", hint="balance its parentheses"
            )
    if depth:
        raise ConfigError("the --where predicate leaves a parenthesis open", hint="balance its parentheses")
    return text


def predicate_sql(text: str) -> str:
    """The predicate as it is written into a query: in parentheses of its own, on lines of its own (a ``--``
    comment at its end ends there)."""
    return f"(\n{checked_predicate(text)}\n)"


def predicate_rows(conn: psycopg.Connection[Any], table: TableName, text: str) -> int:
    """The planner's estimate of the rows of ``table`` that ``text`` picks; ``ConfigError`` when the source cannot
    plan a read with it (unknown columns, not a boolean, a syntax error). Read only, in a transaction that is
    rolled back."""
    query = f"EXPLAIN (FORMAT JSON) SELECT FROM ONLY {table.quoted()} WHERE {predicate_sql(text)}"
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("SET TRANSACTION READ ONLY")
            row = conn.execute(query, prepare=True).fetchone()  # prepared: the server takes one statement only
    except psycopg.Error as exc:
        detail = (exc.diag.message_primary or str(exc)).strip()
        raise ConfigError(
            f"the --where predicate does not fit {table}: {detail}",
            hint="write it as a condition on the table's columns, as in a WHERE clause",
        ) from None
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return int(plan[0]["Plan"]["Plan Rows"])
