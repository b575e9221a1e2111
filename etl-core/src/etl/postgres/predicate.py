"""What the source says of a row predicate given by the pipeline's owner (``etl resync --where``), once its text
passed ``etl.predicate_sql.checked_predicate``: the source plans a query with it (``predicate_rows``), so an unknown
column, a type that is not boolean or a syntax error is said there, before the request is made.

The predicate runs as the pipeline's role, so it may call only immutable and stable functions (``called_volatile``),
which Postgres runs read only; ``pg_terminate_backend``, ``dblink``, ``pg_read_file`` and the like are volatile.
Unqualified names resolve in ``pg_catalog`` only (the pinned ``search_path``): a function of another schema is
called by its qualified name.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from etl.errors import ConfigError
from etl.predicate_sql import predicate_sql
from etl.schema import TableName, display_ident


def called(text: str) -> set[tuple[str, str, str]]:
    """``("function" | "operator", schema, name)`` of every function the predicate calls, and of every operator it
    names with a schema (``OPERATOR(s.=)``); unqualified ones are in ``pg_catalog``, whose operators are none of
    them volatile."""
    from pglast import parse_sql, parser, visitors

    found: set[tuple[str, str, str]] = set()

    class Calls(visitors.Visitor):
        def visit_FuncCall(self, ancestors: Any, node: Any) -> None:  # noqa: N802 (pglast's naming)
            *schema, name = (part.sval for part in node.funcname)
            found.add(("function", schema[-1] if schema else "pg_catalog", name))

        def visit_A_Expr(self, ancestors: Any, node: Any) -> None:  # noqa: N802
            if node.name is not None and len(node.name) > 1:
                found.add(("operator", node.name[-2].sval, node.name[-1].sval))

    try:
        statements = parse_sql(f"SELECT WHERE {predicate_sql(text)}")
    except parser.ParseError as exc:  # what it calls is not known: refused, though the source might read it
        raise ConfigError(
            f"the --where predicate is not valid SQL: {exc}", hint="write it as a condition, as in a WHERE clause"
        ) from None
    Calls()(statements)
    return found


def called_volatile(conn: psycopg.Connection[Any], text: str) -> list[str]:
    """The functions and operators the predicate calls that are volatile (any of the overloads of that name): they
    may act (end sessions, reach other servers, read files), and would as the pipeline's role."""
    calls = sorted(called(text))
    if not calls:
        return []
    rows = conn.execute(
        """SELECT c.kind, c.nsp, c.name FROM unnest(%s::text[], %s::text[], %s::text[]) AS c(kind, nsp, name)
           WHERE EXISTS (SELECT FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                         WHERE c.kind = 'function' AND n.nspname = c.nsp AND p.proname = c.name
                           AND p.provolatile = 'v')
              OR EXISTS (SELECT FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace
                         JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode
                         WHERE c.kind = 'operator' AND n.nspname = c.nsp AND o.oprname = c.name
                           AND p.provolatile = 'v')""",
        ([c[0] for c in calls], [c[1] for c in calls], [c[2] for c in calls]),
    ).fetchall()
    return [f"{kind} {display_ident(nsp)}.{display_ident(name)}" for kind, nsp, name in rows]


def predicate_rows(conn: psycopg.Connection[Any], table: TableName, text: str) -> int:
    """The planner's estimate of the rows of ``table`` that ``text`` picks; ``ConfigError`` when it calls a volatile
    function (``called_volatile``) or the source cannot plan a read with it (unknown columns, not a boolean, a
    syntax error). Read only, in a transaction that is rolled back."""
    volatile = called_volatile(conn, text)
    if volatile:
        raise ConfigError(
            f"the --where predicate calls what is volatile: {', '.join(volatile)}",
            hint="use immutable or stable functions only (now(), lower(), date_trunc() ...): the predicate runs as the"
            " pipeline's role",
        )
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
