"""The catalog as one pipeline sees it: opening it, reading tables, files and watermarks, and committing.

A read runs on its own connection, or on a ``Transaction``'s (which passes its ``conn``), so a commit reads
what it is about to change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Connection, Engine

from etl.api import DestinationError, Lsn
from etl_spark.ducklake.catalog import positions, retention, staging
from etl_spark.ducklake.catalog.bootstrap import check_lake, create_lake
from etl_spark.ducklake.catalog.ddl import COLUMNS_TABLE, STATE_TABLE, TABLES
from etl_spark.ducklake.catalog.engine import engine_for, masked, one_of, redacted, writing
from etl_spark.ducklake.catalog.inlined_reads import InlinedReads
from etl_spark.ducklake.catalog.migrations import migrate
from etl_spark.ducklake.catalog.model import (
    DataFile,
    DeleteFile,
    Handle,
    LakeColumn,
    LakeOptions,
    LakeTable,
    directory_name,
    table_directory,
)
from etl_spark.ducklake.catalog.transaction import Transaction
from etl_spark.ducklake.metrics import DuckLakeMetrics
from etl_spark.ducklake.types import LIST

log = structlog.get_logger(__name__)

T = TypeVar("T")


def _join(base: str, path: str, relative: Any) -> str:
    return base + path if relative else path


def _is_integer(text: str) -> bool:
    """Whether a statistics value reads as an integer (files written before a type change may hold others)."""
    return text.lstrip("-").isdigit()


class Catalog(InlinedReads):
    """A DuckLake catalog seen by one pipeline."""

    def __init__(
        self, url: str, data_path: str, pipeline_id: int, author: str = "etl", metrics: DuckLakeMetrics | None = None
    ) -> None:
        self._url = url
        self.metrics = metrics if metrics is not None else DuckLakeMetrics()
        """Where commits are timed and lost races counted (``etl_ducklake_commit_seconds``, ``..._conflicts``)."""
        self._requested_data_path = data_path if data_path.endswith("/") else data_path + "/"
        self.pipeline_id = pipeline_id
        self.author = author
        self.data_path = self._requested_data_path
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Catalog({redacted(self._url)!r}, data_path={self.data_path!r})"

    @property
    def task_url(self) -> str:
        """The catalog's URL for Spark tasks that read it themselves, credentials included (never log it). A
        SQLite catalog's path is made absolute: executors do not run in the driver's directory."""
        url = self.engine.url
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            url = url.set(database=str(Path(url.database).resolve()))
        return url.render_as_string(hide_password=False)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise DestinationError("the DuckLake catalog is not open", hint="call startup() first", transient=False)
        return self._engine

    # -- lifecycle -------------------------------------------------------------------------------
    def open(self) -> None:
        """Connect; create a new lake when the database is empty, else check it is a DuckLake 1.0 lake; bring
        this writer's tables up to date."""
        if self._engine is not None:
            return
        engine = engine_for(self._url)
        if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
            Path(engine.url.database).parent.mkdir(parents=True, exist_ok=True)
        try:
            with writing(engine) as conn:
                if not sa.inspect(conn).has_table("ducklake_metadata"):
                    create_lake(conn, self._requested_data_path, self.author)
                    log.info("created ducklake catalog", catalog=redacted(self._url))
                self.data_path = check_lake(conn, self._requested_data_path, redacted(self._url))
                migrate(conn, redacted(self._url))
        except sa.exc.OperationalError as exc:
            engine.dispose()
            raise DestinationError(
                f"cannot open the DuckLake catalog {redacted(self._url)}: {masked(str(exc.orig), self._url)}",
                hint="check that the catalog database exists and is reachable with these credentials",
            ) from None
        except BaseException:
            engine.dispose()
            raise
        self._engine = engine
        log.info("ducklake catalog open", catalog=redacted(self._url), data_path=self.data_path)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    # -- reads -----------------------------------------------------------------------------------
    @contextmanager
    def _reading(self, conn: Connection | None) -> Iterator[Connection]:
        if conn is not None:
            yield conn
        else:
            with self.engine.connect() as own:
                yield own

    def options(self) -> LakeOptions:
        """The lake's options, lake-wide and of its current schemas and tables."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT m.key, m.value, m.scope, m.scope_id, s.schema_name, t.table_name FROM ducklake_metadata m"
                    " LEFT JOIN ducklake_table t ON m.scope = 'table' AND t.table_id = m.scope_id"
                    " AND t.end_snapshot IS NULL"
                    " LEFT JOIN ducklake_schema s ON s.end_snapshot IS NULL AND s.schema_id ="
                    " CASE WHEN m.scope = 'schema' THEN m.scope_id ELSE t.schema_id END"
                )
            ).all()
        lake: dict[str, str] = {}
        schemas: dict[str, dict[str, str]] = {}
        tables: dict[int, tuple[str, str, dict[str, str]]] = {}
        for key, value, scope, scope_id, schema_name, table_name in rows:
            if scope is None:
                lake[key] = value
            elif scope == "schema" and schema_name is not None:
                schemas.setdefault(schema_name, {})[key] = value
            elif scope == "table" and table_name is not None and schema_name is not None:
                tables.setdefault(int(scope_id), (schema_name, table_name, {}))[2][key] = value
        return LakeOptions(lake, schemas, tables)

    def latest_snapshot(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT max(snapshot_id) FROM ducklake_snapshot")).scalar_one())

    def handle(self, source_table_id: int, conn: Connection | None = None) -> Handle | None:
        """The source table's lake table and watermark; ``None`` before its first write, after its lake table was
        dropped, and once it is marked for replacement."""
        return self.handles([source_table_id], conn).get(source_table_id)

    def handles(self, source_table_ids: Sequence[int], conn: Connection | None = None) -> dict[int, Handle | None]:
        """``handle`` of each source table this pipeline tracks (``tracked``): ``None`` where its lake table was
        dropped. The others are left out."""
        with self._reading(conn) as c:
            member, ids = one_of(c, "source_table_id", "s", source_table_ids)
            states = c.execute(
                sa.text(
                    f"SELECT source_table_id, table_id, commit_lsn, tx_ordinal FROM {STATE_TABLE}"
                    f" WHERE pipeline_id = :p AND NOT replaced AND {member}"
                ),
                {"p": self.pipeline_id, "s": ids},
            ).all()
            tables = self.tables([int(s.table_id) for s in states], c)
        handles: dict[int, Handle | None] = {}
        for state in states:
            table = tables.get(int(state.table_id))
            watermark = (int(state.commit_lsn), int(state.tx_ordinal))
            handles[int(state.source_table_id)] = None if table is None else Handle(table, watermark)
        return handles

    def tracked(self, source_table_id: int, conn: Connection | None = None) -> bool:
        """Whether this pipeline recorded a lake table for the source table (which may since have been dropped),
        and did not mark it for replacement."""
        with self._reading(conn) as c:
            found = c.execute(
                sa.text(
                    f"SELECT 1 FROM {STATE_TABLE} WHERE pipeline_id = :p AND source_table_id = :s AND NOT replaced"
                ),
                {"p": self.pipeline_id, "s": source_table_id},
            ).first()
        return found is not None

    def table(self, table_id: int, conn: Connection | None = None) -> LakeTable | None:
        """The active table, with its active columns (list elements under their lists); ``None`` once dropped."""
        return self.tables([table_id], conn).get(table_id)

    def tables(self, table_ids: Sequence[int], conn: Connection | None = None) -> dict[int, LakeTable]:
        """``table`` of each of these ids, by id; dropped ones are left out."""
        if not table_ids:
            return {}
        with self._reading(conn) as c:
            member, ids = one_of(c, "t.table_id", "t", table_ids)
            rows = c.execute(
                sa.text(
                    "SELECT t.table_id, t.table_name, t.path, t.path_is_relative, s.schema_name, s.path AS spath,"
                    " s.path_is_relative AS srel FROM ducklake_table t"
                    " JOIN ducklake_schema s ON s.schema_id = t.schema_id"
                    f" WHERE {member} AND t.end_snapshot IS NULL AND s.end_snapshot IS NULL"
                ),
                {"t": ids},
            ).all()
            if not rows:
                return {}
            member, ids = one_of(c, "c.table_id", "t", [r.table_id for r in rows])
            columns = c.execute(
                sa.text(
                    "SELECT c.table_id, c.column_id, c.column_name, c.column_type, c.nulls_allowed, c.parent_column,"
                    " c.initial_default,"
                    f" a.attnum, a.type_oid, a.type_modifier FROM ducklake_column c LEFT JOIN {COLUMNS_TABLE} a"
                    " ON a.table_id = c.table_id AND a.column_id = c.column_id"
                    f" WHERE {member} AND c.end_snapshot IS NULL ORDER BY c.table_id, c.column_order"
                ),
                {"t": ids},
            ).all()
        by_table: dict[int, list[Any]] = {}
        for column in columns:
            by_table.setdefault(int(column.table_id), []).append(column)
        return {int(row.table_id): self._lake_table(row, by_table.get(int(row.table_id), [])) for row in rows}

    def _lake_table(self, row: Any, columns: list[Any]) -> LakeTable:
        children = {int(c.parent_column): c for c in columns if c.parent_column is not None}

        def column(c: Any) -> LakeColumn:
            element = children.get(int(c.column_id)) if c.column_type == LIST else None
            return LakeColumn(
                int(c.column_id),
                c.column_name,
                c.column_type,
                bool(c.nulls_allowed),
                None if c.attnum is None else int(c.attnum),
                None if c.type_oid is None else (int(c.type_oid), int(c.type_modifier)),
                None if element is None else column(element),
                c.initial_default,
            )

        relative = (row.spath + row.path) if row.srel and row.path_is_relative else None
        directory = table_directory(self.data_path, row.spath, row.srel, row.path, row.path_is_relative)
        return LakeTable(
            table_id=int(row.table_id),
            schema_name=row.schema_name,
            name=row.table_name,
            directory=directory,
            relative_directory=relative,
            columns=tuple(column(c) for c in columns if c.parent_column is None),
        )

    def max_column_id(self, table_id: int, conn: Connection | None = None) -> int:
        """The highest column id the table ever used, list elements' and dropped columns' included."""
        return self.max_column_ids([table_id], conn).get(table_id, 0)

    def max_column_ids(self, table_ids: Sequence[int], conn: Connection | None = None) -> dict[int, int]:
        """``max_column_id`` of each of these tables that has columns."""
        with self._reading(conn) as c:
            member, ids = one_of(c, "table_id", "t", table_ids)
            rows = c.execute(
                sa.text(f"SELECT table_id, max(column_id) FROM ducklake_column WHERE {member} GROUP BY table_id"),
                {"t": ids},
            ).all()
        return {int(t): int(m) for t, m in rows}

    def table_directory(self, schema_name: str, table_name: str, conn: Connection | None = None) -> str:
        """Where a new table's files go: under its schema's path (an existing schema's, or ``<schema>/``)."""
        with self._reading(conn) as c:
            row = c.execute(
                sa.text(
                    "SELECT path, path_is_relative FROM ducklake_schema WHERE schema_name = :n AND end_snapshot IS NULL"
                ),
                {"n": schema_name},
            ).one_or_none()
        schema_dir = (
            _join(self.data_path, row.path, row.path_is_relative)
            if row
            else self.data_path + directory_name(schema_name)
        )
        return schema_dir + directory_name(table_name)

    def data_files(self, table: LakeTable, conn: Connection | None = None) -> list[DataFile]:
        """The table's active data files, each with its active delete file, oldest first."""
        return self.data_files_of([table], conn)[table.table_id]

    def data_files_of(self, tables: Sequence[LakeTable], conn: Connection | None = None) -> dict[int, list[DataFile]]:
        """``data_files`` of each table, by table id."""
        files: dict[int, list[DataFile]] = {t.table_id: [] for t in tables}
        if not tables:
            return files
        with self._reading(conn) as c:
            member, ids = one_of(c, "d.table_id", "t", list(files))
            rows = c.execute(
                sa.text(
                    "SELECT d.table_id, d.data_file_id, d.path, d.path_is_relative, d.record_count, d.file_size_bytes,"
                    " d.begin_snapshot, d.row_id_start, x.delete_file_id, x.path AS xpath,"
                    " x.path_is_relative AS xrel, x.begin_snapshot AS xbegin, x.partial_max, x.delete_count"
                    " FROM ducklake_data_file d LEFT JOIN ducklake_delete_file x"
                    " ON x.data_file_id = d.data_file_id AND x.end_snapshot IS NULL"
                    f" WHERE {member} AND d.end_snapshot IS NULL ORDER BY d.data_file_id"
                ),
                {"t": ids},
            ).all()
        directories = {t.table_id: t.directory for t in tables}
        for r in rows:
            directory = directories[int(r.table_id)]
            delete = None
            if r.delete_file_id is not None:
                delete = DeleteFile(
                    int(r.delete_file_id),
                    _join(directory, r.xpath, r.xrel),
                    int(r.xbegin),
                    r.partial_max is not None,
                    int(r.delete_count or 0),
                )
            files[int(r.table_id)].append(
                DataFile(
                    int(r.data_file_id),
                    _join(directory, r.path, r.path_is_relative),
                    int(r.record_count),
                    delete,
                    int(r.file_size_bytes or 0),
                    int(r.begin_snapshot),
                    None if r.row_id_start is None else int(r.row_id_start),
                )
            )
        return files

    def columns_changed(self, table_id: int) -> int:
        """The last snapshot that changed the table's columns (or created them): files written since hold its
        columns as they are."""
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT max(coalesce(end_snapshot, begin_snapshot)) FROM ducklake_column WHERE table_id = :t"
                    ),
                    {"t": table_id},
                ).scalar_one()
            )

    def integer_bounds(
        self, columns: Mapping[int, int], conn: Connection | None = None
    ) -> dict[int, dict[int, tuple[int, int]]]:
        """For tables and one integer column of each (``table_id -> column_id``): ``table_id -> {data_file_id ->
        (min, max)}`` of that column, over the active files whose statistics hold both."""
        bounds: dict[int, dict[int, tuple[int, int]]] = {t: {} for t in columns}
        if not columns:
            return bounds
        with self._reading(conn) as c:
            tables, table_ids = one_of(c, "s.table_id", "t", list(columns))
            column_ids, wanted = one_of(c, "s.column_id", "c", sorted(set(columns.values())))
            rows = c.execute(
                sa.text(
                    "SELECT s.table_id, s.column_id, s.data_file_id, s.min_value, s.max_value"
                    " FROM ducklake_file_column_stats s"
                    " JOIN ducklake_data_file d ON d.data_file_id = s.data_file_id AND d.end_snapshot IS NULL"
                    f" WHERE {tables} AND {column_ids} AND s.min_value IS NOT NULL AND s.max_value IS NOT NULL"
                ),
                {"t": table_ids, "c": wanted},
            ).all()
        for table_id, column_id, file_id, low, high in rows:
            if columns[int(table_id)] == int(column_id) and _is_integer(low) and _is_integer(high):
                bounds[int(table_id)][int(file_id)] = (int(low), int(high))
        return bounds

    def schema_versions(self, table_ids: Sequence[int], conn: Connection | None = None) -> dict[int, int]:
        """Each table's schema version of its last schema change (what names its inlined data table)."""
        with self._reading(conn) as c:
            member, ids = one_of(c, "table_id", "t", table_ids)
            rows = c.execute(
                sa.text(
                    "SELECT table_id, max(schema_version) FROM ducklake_schema_versions"
                    f" WHERE {member} GROUP BY table_id"
                ),
                {"t": ids},
            ).all()
            versions = {int(t): int(v) for t, v in rows}
            if len(versions) < len(set(table_ids)):  # a catalog without a table's versions: the current one
                current = c.execute(
                    sa.text(
                        "SELECT schema_version FROM ducklake_snapshot"
                        " WHERE snapshot_id = (SELECT max(snapshot_id) FROM ducklake_snapshot)"
                    )
                ).scalar_one()
                versions = {int(t): versions.get(int(t), int(current)) for t in table_ids}
        return versions

    def pipeline_tables(self) -> list[int]:
        """The lake tables this pipeline keeps."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(f"SELECT table_id FROM {STATE_TABLE} WHERE pipeline_id = :p AND NOT replaced"),
                {"p": self.pipeline_id},
            ).all()
        return sorted(int(t) for (t,) in rows)

    def position(self) -> positions.LakePosition | None:
        """Where this pipeline's batches brought the lake (``positions``)."""
        with self.engine.connect() as conn:
            return positions.recorded(conn, self.pipeline_id)

    def record_position(self, lsn: Lsn) -> None:
        """Record the end of a batch that changed no table as this pipeline's position (no snapshot)."""
        with self._lock, writing(self.engine) as conn:
            positions.record(conn, self.pipeline_id, lsn, None)

    def record_staged(self, staged: staging.StagedPrefix) -> None:
        """Record the name prefix of a write job for a transaction not committed yet (``staging``)."""
        with writing(self.engine) as conn:
            staging.record(conn, self.pipeline_id, staged)

    def staged(self) -> list[staging.StagedPrefix]:
        """The write jobs recorded for this pipeline's open transaction (after a crash: its leftovers)."""
        with self.engine.connect() as conn:
            return staging.recorded(conn, self.pipeline_id)

    def forget_staged(self) -> None:
        with writing(self.engine) as conn:
            staging.forget(conn, self.pipeline_id)

    def kept_source_tables(self) -> set[int]:
        """The source tables this pipeline has recorded a lake table for (replaced ones too)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(f"SELECT source_table_id FROM {STATE_TABLE} WHERE pipeline_id = :p"), {"p": self.pipeline_id}
            ).all()
        return {int(t) for (t,) in rows}

    # -- retention -------------------------------------------------------------------------------
    def expire_snapshots(self, before: datetime) -> int:
        """Expire the snapshots taken before ``before`` (``retention.expire_snapshots``); how many."""
        with self.engine.connect() as conn:  # mostly there are none: then no write transaction (lock) at all
            if not retention.expiring(conn, before):
                return 0
        with writing(self.engine) as conn:
            return retention.expire_snapshots(conn, self.data_path, before)

    def scheduled_files(self, before: datetime) -> list[tuple[int, str]]:
        """Files scheduled for deletion before ``before``: id and absolute path."""
        with self.engine.connect() as conn:
            return retention.scheduled(conn, self.data_path, before)

    def unschedule(self, file_ids: Sequence[int]) -> None:
        with writing(self.engine) as conn:
            retention.unschedule(conn, file_ids)

    def known_files(self, table_ids: Sequence[int]) -> set[str]:
        """Absolute paths of the files of these tables the catalog knows (any snapshot), and of those scheduled
        for deletion."""
        with self.engine.connect() as conn:
            return retention.known_files(conn, self.data_path, table_ids)

    # -- writes ----------------------------------------------------------------------------------
    def mark_for_replacement(self, source_table_id: int) -> None:
        """Let the next copy of the source table replace its lake table (a resync without downtime).

        The lake table stays as it is, readable, until the commit that creates its replacement ends it
        (``Transaction.create_table``). Until then ``handle`` is ``None`` and ``tracked`` false, as after a
        drop. No snapshot: readers see nothing change. Marking again, or a source table with no lake table,
        changes nothing.
        """
        state = TABLES[STATE_TABLE]
        with writing(self.engine) as conn:
            conn.execute(
                sa.update(state)
                .where(state.c.pipeline_id == self.pipeline_id, state.c.source_table_id == source_table_id)
                .values(replaced=True)
            )

    def commit(
        self,
        build: Callable[[Transaction], T],
        *,
        base_snapshot: int | None = None,
        tables: Iterable[int] = (),
        attempts: int = 20,
    ) -> T:
        """Run ``build`` in one catalog transaction that ends with a new snapshot; return its result.

        With ``base_snapshot``, raise ``CommitConflict`` when a snapshot after it touched one of
        ``tables`` other than by inserting. A lost race for the snapshot id is retried here.
        """
        watched = set(tables)
        for attempt in range(attempts):
            try:
                with self._lock:
                    started = time.perf_counter()
                    with writing(self.engine) as conn:
                        txn = Transaction(self, conn)
                        if base_snapshot is not None and watched:
                            txn.check_conflicts(base_snapshot, watched)
                        result = build(txn)
                        txn.finish()
                    self.metrics.commit_seconds.observe(time.perf_counter() - started)  # committed
                    return result
            except sa.exc.IntegrityError:
                self.metrics.commit_conflicts.inc()
                log.info("catalog commit raced another writer; retrying", attempt=attempt + 1)
        raise DestinationError(
            f"could not commit to the DuckLake catalog after {attempts} attempts: other writers kept committing first",
            hint="pause the other writers (maintenance jobs) and retry",
        )
