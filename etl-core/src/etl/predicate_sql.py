"""A row predicate given by the pipeline's owner (``etl resync --where``), as SQL text: checked before any query
holds it. No I/O: the source's own checks of it are ``etl.postgres.predicate``'s.

The predicate is SQL, so it is written into the queries that read the rows it picks: ``... WHERE key > $after
AND (`` predicate ``)``. Before that, Postgres's own lexer (through pglast) reads it: outside string literals,
quoted names and comments, its parentheses must balance and no ``;`` may appear, so it cannot close the
parenthesis it is written in, nor end the statement (every source session pins ``standard_conforming_strings =
on``, as pglast lexes).
"""

from __future__ import annotations

from etl.errors import ConfigError

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
