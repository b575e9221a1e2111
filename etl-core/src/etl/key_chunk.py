"""An incremental copy's chunk as a value: a range of a table's rows in the order of its key, and the SQL that
reads, splits and bounds it. Nothing here does I/O (``etl.postgres.copy`` runs the queries), and a chunk pickles
within a ``CopyRange`` (``etl.copy_plan``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from etl.key_sql import GT, LE, KeyValue, key_literal, key_row, key_text, parse_key
from etl.predicate_sql import predicate_sql
from etl.schema import TableName, quote_ident


@dataclass(frozen=True)
class KeyChunk:
    """The rows of one chunk of an incremental copy: the first ``limit`` after ``after`` (``None``: from the first
    row) in the order of the key ``columns`` (the source's, by its b-tree: row comparison for several columns); of a
    backfill, only those that ``where`` picks."""

    columns: tuple[str, ...]
    after: KeyValue | None
    limit: int
    where: str | None = None
    """A backfill's predicate (``etl resync --where``), as the owner gave it."""
    upto: KeyValue | None = None
    """The chunk's last key, when it is a part of a chunk split by key (``split``)."""

    def predicate(self) -> str | None:
        key = key_row(self.columns)
        after = None if self.after is None else f"{key} {GT} {key_literal(self.after)}"
        upto = None if self.upto is None else f"{key} {LE} {key_literal(self.upto)}"
        where = None if self.where is None else predicate_sql(self.where)
        return " AND ".join(c for c in (after, upto, where) if c) or None

    def reach_query(self, source: TableName) -> str:
        """A backfill's chunk covers the first ``limit`` rows of the table after ``after``, of which its predicate
        picks some: the key of the last of them ('' when no row follows them), found on the key's index. So a chunk
        reads at most ``limit`` rows whatever the predicate picks; a sparse one never scans the table in one read."""
        names = ", ".join(quote_ident(c) for c in self.columns)
        after = "" if self.after is None else f" WHERE {key_row(self.columns)} {GT} {key_literal(self.after)}"
        last = f"SELECT {names} FROM ONLY {source.quoted()}{after} ORDER BY {names} OFFSET {int(self.limit) - 1}"
        first = f"(pg_catalog.array_agg({key_text(self.columns)}::pg_catalog.text ORDER BY {names}))[1]"
        return f"SELECT CASE WHEN count(*) > 1 THEN {first} ELSE '' END FROM ({last} LIMIT 2) s"

    def bounded(self, reach: str) -> KeyChunk:
        """The chunk up to ``reach`` (``reach_query``'s answer); unchanged when the chunk runs to the table's end."""
        return replace(self, upto=parse_key(json.loads(reach))) if reach else self

    def ends_copy(self, rows: int) -> bool:
        """Whether no row of the table follows this chunk of ``rows`` rows: a backfill's (``bounded``) when it runs
        to the table's end, a copy's when it holds fewer than ``limit``."""
        return self.upto is None if self.where is not None else rows < self.limit

    def reach(self, last: KeyValue | None) -> KeyValue | None:
        """The key the next chunk follows, given this one's last row's key: a bounded backfill chunk's end."""
        return self.upto if self.where is not None and self.upto is not None else last

    def split(self, bounds: list[KeyValue], step: int) -> list[KeyChunk]:
        """The chunk as consecutive parts: one of ``step`` rows up to each key of ``bounds`` (every ``step``-th key
        of the chunk, ``split_query``'s answer), then the rest."""
        parts, after = [], self.after
        for bound in bounds:
            parts.append(replace(self, after=after, limit=step, upto=bound))
            after = bound
        parts.append(replace(self, after=after, limit=self.limit - step * len(bounds)))
        return parts

    def split_query(self, source: TableName, row_filter: str | None, step: int) -> str:
        """What ``copy_session.ChunkKeys.parse`` reads: the chunk's row count, its last key, and every ``step``-th
        key of its rows while ``step`` rows or more follow (the last part holds ``step`` rows, and the rest of a
        ``limit`` that ``step`` does not divide)."""
        names = ", ".join(quote_ident(c) for c in self.columns)
        where = " AND ".join(c for c in (f"({row_filter})" if row_filter else None, self.predicate()) if c)
        keys = f"SELECT {names} FROM ONLY {source.quoted()}{' WHERE ' + where if where else ''}{self.order()}"
        rank, last, key = '"_etl_rank"', '"_etl_last"', '"_etl_key"'  # names no key column clashes with, as used
        every = f"{rank} OPERATOR(pg_catalog.%) {int(step)} = 0 AND {rank} <= {int(self.limit - step)}"
        numbered = (
            f"SELECT {names}, pg_catalog.row_number() OVER w AS {rank}, (pg_catalog.lead(1) OVER w) IS NULL AS {last}"
            f" FROM ({keys}) c WINDOW w AS (ORDER BY {names})"
        )
        texts = f"SELECT CASE WHEN {last} OR ({every}) THEN {key_text(self.columns)} END AS {key}, {rank}, {last}"
        return (
            f"SELECT pg_catalog.json_build_array(count(*), pg_catalog.json_agg({key}) FILTER (WHERE {last}),"
            f" coalesce(pg_catalog.json_agg({key} ORDER BY {rank}) FILTER (WHERE {every}), '[]'))::text"
            f" FROM ({texts} FROM ({numbered}) s) t"
        )

    def order(self) -> str:
        return f" ORDER BY {', '.join(quote_ident(c) for c in self.columns)} LIMIT {int(self.limit)}"
