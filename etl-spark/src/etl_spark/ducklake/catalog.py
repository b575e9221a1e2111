"""The DuckLake catalog, in SQLite or Postgres through SQLAlchemy: bootstrap, reads, and snapshot commits.

One ``commit`` is one catalog transaction and one DuckLake snapshot. Ids come from the latest
snapshot read inside the transaction; the primary key on ``ducklake_snapshot.snapshot_id`` is the
commit point, so a concurrent writer (another pipeline, DuckDB compacting) makes one of the two
fail and retry. A commit whose inputs were computed against an older snapshot first checks that no
snapshot since then touched its tables other than by plain inserts, and raises ``CommitConflict``
otherwise, so the caller recomputes. The replication watermark lives in this writer's own table in
the same database and moves in the same transaction.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Connection, Engine, make_url

from etl.errors import ConfigError, DestinationError, TableError
from etl_spark.ducklake.catalog_schema import (
    COLUMNS_TABLE,
    LEGACY_COLUMNS_TABLE,
    SPEC_VERSION,
    STATE_DDL,
    STATE_TABLE,
    create_statements,
)
from etl_spark.ducklake.metrics import DuckLakeMetrics
from etl_spark.ducklake.stats import ColumnStats, stats_kind, widen
from etl_spark.ducklake.types import LakeType, Stats

log = structlog.get_logger(__name__)

T = TypeVar("T")

_TOKEN = re.compile(r"([a-z_]+):(\d+)")
_INSERT_ONLY = "inserted_into_table"


class CommitConflict(Exception):
    """Another writer changed a table this commit's inputs were computed from; recompute and retry."""


SourceColumn = tuple[int | None, int, int]
"""What this writer records of the source column a lake column holds: attribute number, type OID, type modifier."""

UNKNOWN_SOURCE_TYPE = (0, -1)
"""The type recorded when it is not known (InvalidOid): equal to no source type."""


@dataclass(frozen=True)
class LakeColumn:
    column_id: int
    name: str
    type: str
    nullable: bool
    attnum: int | None = None
    """The Postgres attribute it holds, when known (this writer records it; not for columns DuckDB added)."""
    source_type: tuple[int, int] | None = None
    """Type OID and modifier of the source column it holds, when this writer recorded them."""


@dataclass(frozen=True)
class LakeTable:
    table_id: int
    schema_name: str
    name: str
    directory: str
    """Absolute directory of the table's files, ending in ``/``."""
    relative_directory: str | None
    """The directory relative to the lake's data path, when it is relative."""
    columns: tuple[LakeColumn, ...]


@dataclass(frozen=True)
class DeleteFile:
    delete_file_id: int
    path: str
    begin_snapshot: int
    partial: bool


@dataclass(frozen=True)
class DataFile:
    data_file_id: int
    path: str
    record_count: int
    delete: DeleteFile | None


@dataclass(frozen=True)
class Handle:
    """A pipeline's source table as it stands in the lake."""

    table: LakeTable
    watermark: tuple[int, int]
    """``(commit_lsn, tx_ordinal)`` of the last change applied."""


@dataclass(frozen=True)
class NewFile:
    """A Parquet file already in place under the table's directory, ready to register."""

    name: str
    """File name relative to the table directory."""
    record_count: int
    size_bytes: int
    footer_size: int
    stats: Sequence[ColumnStats] = ()


@dataclass(frozen=True)
class NewColumn:
    name: str
    type: LakeType
    nullable: bool


def redacted(url: str) -> str:
    """A catalog URL fit for messages: the password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable catalog URL>"


def _masked(message: str, url: str) -> str:
    """A driver message with the URL's password, should it appear, masked."""
    try:
        password = make_url(url).password
    except Exception:
        return message
    return message.replace(str(password), "***") if password else message


def engine_for(url: str) -> Engine:
    """An engine for a ``sqlite:///`` or ``postgresql://`` URL (psycopg 3 driver)."""
    try:
        parsed = make_url(url)
    except Exception:
        raise ConfigError(
            "the DuckLake catalog is not a valid URL",
            hint="use sqlite:///path/catalog.sqlite or postgresql://user:password@host:port/database",
        ) from None
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        engine = sa.create_engine(parsed.set(drivername="postgresql+psycopg"), pool_pre_ping=True)
    elif backend == "sqlite":
        engine = sa.create_engine(parsed, connect_args={"timeout": 60})

        @sa.event.listens_for(engine, "connect")
        def _no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _write_lock(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    else:
        raise ConfigError(
            f"the DuckLake catalog must live in SQLite or Postgres, not {backend!r}",
            hint="use sqlite:///path/catalog.sqlite or postgresql://user:password@host:port/database",
        )
    return engine


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _join(base: str, path: str, relative: Any) -> str:
    return base + path if relative else path


class Catalog:
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
    def engine(self) -> Engine:
        if self._engine is None:
            raise DestinationError("the DuckLake catalog is not open", hint="call startup() first")
        return self._engine

    # -- lifecycle -------------------------------------------------------------------------------
    def open(self) -> None:
        """Connect; create a new lake when the database is empty, else check it is a DuckLake 1.0 lake."""
        if self._engine is not None:
            return
        engine = engine_for(self._url)
        if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
            Path(engine.url.database).parent.mkdir(parents=True, exist_ok=True)
        try:
            with engine.begin() as conn:
                if not sa.inspect(conn).has_table("ducklake_metadata"):
                    self._bootstrap(conn)
                self.data_path = self._check(conn)
                for statement in STATE_DDL:
                    conn.exec_driver_sql(statement)
                if sa.inspect(conn).has_table(LEGACY_COLUMNS_TABLE):
                    _migrate_legacy_columns(conn)
        except sa.exc.OperationalError as exc:
            engine.dispose()
            raise DestinationError(
                f"cannot open the DuckLake catalog {redacted(self._url)}: {_masked(str(exc.orig), self._url)}",
                hint="check that the catalog database exists and is reachable with these credentials",
            ) from None
        self._engine = engine
        log.info("ducklake catalog open", catalog=redacted(self._url), data_path=self.data_path)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _bootstrap(self, conn: Connection) -> None:
        for statement in create_statements(conn.dialect.name):
            conn.exec_driver_sql(statement)
        metadata = [
            ("version", SPEC_VERSION),
            ("created_by", "etl-spark"),
            ("data_path", self._requested_data_path),
            ("encrypted", "false"),
            ("data_inlining_row_limit", "0"),
        ]
        conn.execute(
            sa.text("INSERT INTO ducklake_metadata (key, value) VALUES (:k, :v)"),
            [{"k": k, "v": v} for k, v in metadata],
        )
        conn.execute(
            sa.text("INSERT INTO ducklake_snapshot VALUES (0, :t, 0, 1, 0)"),
            {"t": _now()},
        )
        conn.execute(
            sa.text("INSERT INTO ducklake_snapshot_changes VALUES (0, :c, :a, NULL, NULL)"),
            {"c": 'created_schema:"main"', "a": self.author},
        )
        conn.execute(
            sa.text("INSERT INTO ducklake_schema VALUES (0, :u, 0, NULL, 'main', 'main/', :rel)"),
            {"u": str(uuid.uuid4()), "rel": True},
        )
        log.info("created ducklake catalog", catalog=redacted(self._url))

    def _check(self, conn: Connection) -> str:
        rows = conn.execute(sa.text("SELECT key, value FROM ducklake_metadata WHERE scope IS NULL")).all()
        metadata = {k: v for k, v in rows}
        version = metadata.get("version")
        if version != SPEC_VERSION:
            raise DestinationError(
                f"the DuckLake catalog {redacted(self._url)} has specification version {version!r};"
                f" this writer supports {SPEC_VERSION!r} only",
                hint="migrate the lake with DuckDB 1.5 (ATTACH it once with the ducklake extension)"
                " or use a new catalog",
            )
        if metadata.get("encrypted", "false") != "false":
            raise DestinationError("the DuckLake lake is encrypted", hint="this writer supports unencrypted lakes only")
        if "data_inlining_row_limit" not in metadata:
            conn.execute(sa.text("INSERT INTO ducklake_metadata (key, value) VALUES ('data_inlining_row_limit', '0')"))
        data_path = metadata.get("data_path", self._requested_data_path)
        if data_path.rstrip("/") != self._requested_data_path.rstrip("/"):
            raise DestinationError(
                f"the DuckLake catalog keeps its data at {data_path}, but data_path is {self._requested_data_path}",
                hint="set data_path to the lake's data path",
            )
        return str(data_path) if data_path.endswith("/") else f"{data_path}/"

    # -- reads -----------------------------------------------------------------------------------
    def latest_snapshot(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT max(snapshot_id) FROM ducklake_snapshot")).scalar_one())

    def handle(self, source_table_id: int) -> Handle | None:
        with self.engine.connect() as conn:
            return self._handle(conn, source_table_id)

    def _handle(self, conn: Connection, source_table_id: int) -> Handle | None:
        state = conn.execute(
            sa.text(
                f"SELECT table_id, commit_lsn, tx_ordinal FROM {STATE_TABLE}"
                " WHERE pipeline_id = :p AND source_table_id = :s"
            ),
            {"p": self.pipeline_id, "s": source_table_id},
        ).one_or_none()
        if state is None:
            return None
        table = self._table(conn, state.table_id)
        if table is None:
            return None
        return Handle(table, (int(state.commit_lsn), int(state.tx_ordinal)))

    def tracked(self, source_table_id: int) -> bool:
        """Whether this pipeline recorded a lake table for the source table (which may since have been dropped)."""
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.text(f"SELECT 1 FROM {STATE_TABLE} WHERE pipeline_id = :p AND source_table_id = :s"),
                {"p": self.pipeline_id, "s": source_table_id},
            ).first()
        return found is not None

    def _table(self, conn: Connection, table_id: int) -> LakeTable | None:
        row = conn.execute(
            sa.text(
                "SELECT t.table_id, t.table_name, t.path, t.path_is_relative, s.schema_name, s.path AS spath,"
                " s.path_is_relative AS srel FROM ducklake_table t JOIN ducklake_schema s ON s.schema_id = t.schema_id"
                " WHERE t.table_id = :t AND t.end_snapshot IS NULL AND s.end_snapshot IS NULL"
            ),
            {"t": table_id},
        ).one_or_none()
        if row is None:
            return None
        columns = conn.execute(
            sa.text(
                "SELECT c.column_id, c.column_name, c.column_type, c.nulls_allowed, a.attnum, a.type_oid,"
                " a.type_modifier FROM ducklake_column c"
                f" LEFT JOIN {COLUMNS_TABLE} a ON a.table_id = c.table_id AND a.column_id = c.column_id"
                " WHERE c.table_id = :t AND c.end_snapshot IS NULL AND c.parent_column IS NULL ORDER BY c.column_order"
            ),
            {"t": table_id},
        ).all()
        relative = (row.spath + row.path) if row.srel and row.path_is_relative else None
        directory = _join(_join(self.data_path, row.spath, row.srel), row.path, row.path_is_relative)
        return LakeTable(
            table_id=int(row.table_id),
            schema_name=row.schema_name,
            name=row.table_name,
            directory=directory,
            relative_directory=relative,
            columns=tuple(
                LakeColumn(
                    int(c.column_id),
                    c.column_name,
                    c.column_type,
                    bool(c.nulls_allowed),
                    None if c.attnum is None else int(c.attnum),
                    None if c.type_oid is None else (int(c.type_oid), int(c.type_modifier)),
                )
                for c in columns
            ),
        )

    def max_column_id(self, table_id: int) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT coalesce(max(column_id), 0) FROM ducklake_column WHERE table_id = :t"),
                    {"t": table_id},
                ).scalar_one()
            )

    def table_directory(self, schema_name: str, table_name: str) -> str:
        """Where a new table's files go: under its schema's path (an existing schema's, or ``<schema>/``)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "SELECT path, path_is_relative FROM ducklake_schema WHERE schema_name = :n AND end_snapshot IS NULL"
                ),
                {"n": schema_name},
            ).one_or_none()
        schema_dir = (
            _join(self.data_path, row.path, row.path_is_relative) if row else self.data_path + schema_name + "/"
        )
        return schema_dir + table_name + "/"

    def data_files(self, table: LakeTable) -> list[DataFile]:
        """The table's active data files, each with its active delete file."""
        with self.engine.connect() as conn:
            return self._data_files(conn, table)

    def integer_bounds(self, table: LakeTable, column_id: int) -> dict[int, tuple[int, int]]:
        """``data_file_id -> (min, max)`` of an integer column, for the active files whose statistics hold both."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT s.data_file_id, s.min_value, s.max_value FROM ducklake_file_column_stats s"
                    " JOIN ducklake_data_file d ON d.data_file_id = s.data_file_id AND d.end_snapshot IS NULL"
                    " WHERE s.table_id = :t AND s.column_id = :c"
                    " AND s.min_value IS NOT NULL AND s.max_value IS NOT NULL"
                ),
                {"t": table.table_id, "c": column_id},
            ).all()
        return {int(r[0]): (int(r[1]), int(r[2])) for r in rows if _is_integer(r[1]) and _is_integer(r[2])}

    def _data_files(self, conn: Connection, table: LakeTable) -> list[DataFile]:
        rows = conn.execute(
            sa.text(
                "SELECT d.data_file_id, d.path, d.path_is_relative, d.record_count, x.delete_file_id,"
                " x.path AS xpath, x.path_is_relative AS xrel, x.begin_snapshot AS xbegin, x.partial_max"
                " FROM ducklake_data_file d LEFT JOIN ducklake_delete_file x"
                " ON x.data_file_id = d.data_file_id AND x.end_snapshot IS NULL"
                " WHERE d.table_id = :t AND d.end_snapshot IS NULL ORDER BY d.data_file_id"
            ),
            {"t": table.table_id},
        ).all()
        files = []
        for r in rows:
            delete = None
            if r.delete_file_id is not None:
                delete = DeleteFile(
                    int(r.delete_file_id),
                    _join(table.directory, r.xpath, r.xrel),
                    int(r.xbegin),
                    r.partial_max is not None,
                )
            files.append(
                DataFile(
                    int(r.data_file_id), _join(table.directory, r.path, r.path_is_relative), int(r.record_count), delete
                )
            )
        return files

    def check_no_inlined_data(self, table: LakeTable) -> None:
        """Refuse to write a table DuckDB has inlined rows into: this writer's scans do not see them."""
        with self.engine.connect() as conn:
            names = conn.execute(
                sa.text("SELECT table_name FROM ducklake_inlined_data_tables WHERE table_id = :t"),
                {"t": table.table_id},
            ).scalars()
            for name in names:
                count = conn.execute(
                    sa.text(f"SELECT count(*) FROM {_quote(name)} WHERE end_snapshot IS NULL")
                ).scalar()
                if count:
                    raise DestinationError(
                        f"DuckLake table {table.schema_name}.{table.name} holds rows DuckDB inlined into the catalog",
                        hint="run CALL ducklake_flush_inlined_data('<lake>') in DuckDB with the pipeline paused,"
                        " and keep data_inlining_row_limit at 0",
                    )

    # -- commits ---------------------------------------------------------------------------------
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
                    with self.engine.begin() as conn:
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


@dataclass(frozen=True)
class _Holder:
    """An active lake table that holds a name, and who keeps it."""

    table_id: int
    source_table_id: int | None
    """The source table this pipeline keeps in it, if this pipeline keeps it."""
    other_pipeline: int | None
    """The other pipeline that keeps it, if another one does."""


@dataclass
class Transaction:
    """The inside of one snapshot commit; ids are allocated from the latest snapshot."""

    catalog: Catalog
    conn: Connection
    snapshot_id: int = 0
    schema_version: int = 0
    next_catalog_id: int = 0
    next_file_id: int = 0
    changes: list[str] = field(default_factory=list)
    _schema_changed: set[int] = field(default_factory=set)
    _ddl: bool = False

    def __post_init__(self) -> None:
        row = self.conn.execute(
            sa.text(
                "SELECT snapshot_id, schema_version, next_catalog_id, next_file_id FROM ducklake_snapshot"
                " WHERE snapshot_id = (SELECT max(snapshot_id) FROM ducklake_snapshot)"
            )
        ).one()
        self.snapshot_id = int(row.snapshot_id) + 1
        self.schema_version = int(row.schema_version)
        self.next_catalog_id = int(row.next_catalog_id)
        self.next_file_id = int(row.next_file_id)

    def _run(self, sql: str, params: dict[str, Any] | list[dict[str, Any]] | None = None) -> sa.CursorResult[Any]:
        return self.conn.execute(sa.text(sql), params)

    def _change(self, token: str) -> None:
        if token not in self.changes:
            self.changes.append(token)

    def check_conflicts(self, base_snapshot: int, tables: set[int]) -> None:
        rows = self._run(
            "SELECT changes_made FROM ducklake_snapshot_changes WHERE snapshot_id > :b", {"b": base_snapshot}
        )
        for (changes,) in rows:
            for kind, ident in _TOKEN.findall(changes or ""):
                if int(ident) in tables and kind != _INSERT_ONLY:
                    raise CommitConflict(f"{kind}:{ident} committed after snapshot {base_snapshot}")

    # -- state -----------------------------------------------------------------------------------
    def handle(self, source_table_id: int) -> Handle | None:
        return self.catalog._handle(self.conn, source_table_id)

    def table(self, table_id: int) -> LakeTable:
        table = self.catalog._table(self.conn, table_id)
        if table is None:
            raise CommitConflict(f"DuckLake table {table_id} was dropped")
        return table

    def set_watermark(self, source_table_id: int, table_id: int, position: tuple[int, int]) -> None:
        params = {
            "p": self.catalog.pipeline_id,
            "s": source_table_id,
            "t": table_id,
            "l": position[0],
            "o": position[1],
        }
        updated = self._run(
            f"UPDATE {STATE_TABLE} SET table_id = :t, commit_lsn = :l, tx_ordinal = :o"
            " WHERE pipeline_id = :p AND source_table_id = :s",
            params,
        )
        if not updated.rowcount:
            self._run(f"INSERT INTO {STATE_TABLE} VALUES (:p, :s, :t, :l, :o)", params)

    def set_source_columns(self, table_id: int, sources: dict[int, SourceColumn]) -> None:
        """Record which source column each column (by id) of a lake table holds, replacing what was recorded."""
        self._run(f"DELETE FROM {COLUMNS_TABLE} WHERE table_id = :t", {"t": table_id})
        if sources:
            self._run(
                f"INSERT INTO {COLUMNS_TABLE} VALUES (:t, :c, :a, :oid, :mod)",
                [{"t": table_id, "c": c, "a": a, "oid": oid, "mod": mod} for c, (a, oid, mod) in sources.items()],
            )

    def forget(self, source_table_id: int) -> None:
        self._run(
            f"DELETE FROM {STATE_TABLE} WHERE pipeline_id = :p AND source_table_id = :s",
            {"p": self.catalog.pipeline_id, "s": source_table_id},
        )

    # -- schemas and tables ----------------------------------------------------------------------
    def schema_id(self, name: str) -> int:
        """The id of the named schema, created in this snapshot when missing."""
        found = self._run(
            "SELECT schema_id FROM ducklake_schema WHERE schema_name = :n AND end_snapshot IS NULL", {"n": name}
        ).scalar()
        if found is not None:
            return int(found)
        schema_id = self._catalog_id()
        self._run(
            "INSERT INTO ducklake_schema VALUES (:id, :u, :s, NULL, :n, :p, :rel)",
            {"id": schema_id, "u": str(uuid.uuid4()), "s": self.snapshot_id, "n": name, "p": name + "/", "rel": True},
        )
        self._bump_schema_version()
        self._change(f"created_schema:{_quote(name)}")
        return schema_id

    def create_table(self, schema_name: str, name: str, columns: Sequence[NewColumn]) -> LakeTable:
        """Create a table. An active table of the same name is parked when it holds another source table of this
        pipeline (renamed at the source, or dropped there), else ended: this writer owns the name."""
        schema_id = self.schema_id(schema_name)
        holder = self._holder(schema_id, name)
        if holder is not None:
            if holder.source_table_id is not None:
                self._park(holder.table_id, holder.source_table_id)
            elif holder.other_pipeline is not None:
                raise TableError(
                    f"cannot create DuckLake table {schema_name}.{name}: pipeline {holder.other_pipeline} keeps a"
                    " table of that name in this lake",
                    hint="give each pipeline its own lake, or leave the table out of one of the publications",
                )
            else:
                self.drop_table(holder.table_id)
        table_id = self._catalog_id()
        self._run(
            "INSERT INTO ducklake_table VALUES (:id, :u, :s, NULL, :schema, :n, :p, :rel)",
            {
                "id": table_id,
                "u": str(uuid.uuid4()),
                "s": self.snapshot_id,
                "schema": schema_id,
                "n": name,
                "p": name + "/",
                "rel": True,
            },
        )
        for column_id, column in enumerate(columns, start=1):
            self._insert_column(
                table_id,
                column_id=column_id,
                order=column_id,
                name=column.name,
                type_name=column.type.name,
                nullable=column.nullable,
            )
        if columns:
            self._run(
                "INSERT INTO ducklake_table_column_stats (table_id, column_id, contains_null, contains_nan)"
                " VALUES (:t, :c, :f, NULL)",
                [{"t": table_id, "c": i, "f": False} for i in range(1, len(columns) + 1)],
            )
        self._table_schema_changed(table_id)
        self._change(f"created_table:{_quote(schema_name)}.{_quote(name)}")
        return self.table(table_id)

    def rename_table(self, table: LakeTable, schema_name: str, name: str) -> None:
        """Give a table a new name, in the same or another schema (created when missing), as DuckDB renames:
        its row ends and one with the same id begins. Its files stay where they are: a table moved to another
        schema gets its directory as an absolute path, since a relative one is read under the schema's."""
        schema_id = self.schema_id(schema_name)
        holder = self._holder(schema_id, name)
        if holder is not None and holder.table_id != table.table_id:
            if holder.source_table_id is None:
                raise TableError(
                    f"cannot rename DuckLake table {table.schema_name}.{table.name} to {schema_name}.{name}:"
                    " the lake has a table of that name that this pipeline does not keep",
                    hint="drop or rename that lake table, then resync this one (etl resync --table ...)",
                )
            self._park(holder.table_id, holder.source_table_id)
        row = self._run(
            "SELECT table_uuid, schema_id, path, path_is_relative FROM ducklake_table"
            " WHERE table_id = :t AND end_snapshot IS NULL",
            {"t": table.table_id},
        ).one()
        path, relative = row.path, bool(row.path_is_relative)
        if int(row.schema_id) != schema_id and relative:
            path, relative = table.directory, False
        self._run(
            "UPDATE ducklake_table SET end_snapshot = :s WHERE table_id = :t AND end_snapshot IS NULL",
            {"s": self.snapshot_id, "t": table.table_id},
        )
        self._run(
            "INSERT INTO ducklake_table VALUES (:id, :u, :s, NULL, :schema, :n, :p, :rel)",
            {
                "id": table.table_id,
                "u": row.table_uuid,
                "s": self.snapshot_id,
                "schema": schema_id,
                "n": name,
                "p": path,
                "rel": relative,
            },
        )
        self._table_schema_changed(table.table_id)
        self._change(f"created_table:{_quote(schema_name)}.{_quote(name)}")  # what DuckDB records for a rename

    def _holder(self, schema_id: int, name: str) -> _Holder | None:
        """The active table of that name, and who keeps it."""
        row = self._run(
            f"SELECT t.table_id, k.pipeline_id, k.source_table_id FROM ducklake_table t LEFT JOIN {STATE_TABLE} k"
            " ON k.table_id = t.table_id"
            " WHERE t.schema_id = :s AND t.table_name = :n AND t.end_snapshot IS NULL",
            {"s": schema_id, "n": name},
        ).first()
        if row is None:
            return None
        if row.pipeline_id is None:
            return _Holder(int(row.table_id), None, None)
        if int(row.pipeline_id) == self.catalog.pipeline_id:
            return _Holder(int(row.table_id), int(row.source_table_id), None)
        return _Holder(int(row.table_id), None, int(row.pipeline_id))

    def _park(self, table_id: int, source_table_id: int) -> None:
        """Move a table of this pipeline out of the way of a name another of its source tables took. It goes to
        ``<name>_etl_parked_<source table OID>``; its own next change gives it its source table's name again."""
        table = self.table(table_id)
        parked = f"{table.name}_etl_parked_{source_table_id}"
        self.rename_table(table, table.schema_name, parked)
        log.warning(
            "parked a ducklake table whose name another source table took",
            table=f"{table.schema_name}.{table.name}",
            parked_as=parked,
            source_table_id=source_table_id,
        )

    def drop_table(self, table_id: int) -> None:
        self._run(f"DELETE FROM {COLUMNS_TABLE} WHERE table_id = :t", {"t": table_id})
        for table in ("ducklake_table", "ducklake_column", "ducklake_data_file", "ducklake_delete_file"):
            self._run(
                f"UPDATE {table} SET end_snapshot = :s WHERE table_id = :t AND end_snapshot IS NULL",
                {"s": self.snapshot_id, "t": table_id},
            )
        self._bump_schema_version()
        self._change(f"dropped_table:{table_id}")

    def max_column_id(self, table_id: int) -> int:
        return int(
            self._run(
                "SELECT coalesce(max(column_id), 0) FROM ducklake_column WHERE table_id = :t", {"t": table_id}
            ).scalar_one()
        )

    def add_column(self, table: LakeTable, column: NewColumn, column_id: int) -> None:
        """Add a column under ``column_id`` (above every id the table ever used), with no default."""
        if column_id <= self.max_column_id(table.table_id):
            raise CommitConflict(f"column id {column_id} of table {table.table_id} is taken")
        order = 1 + int(
            self._run(
                "SELECT coalesce(max(column_order), 0) FROM ducklake_column WHERE table_id = :t", {"t": table.table_id}
            ).scalar_one()
        )
        self._insert_column(
            table.table_id,
            column_id=column_id,
            order=order,
            name=column.name,
            type_name=column.type.name,
            nullable=column.nullable,
        )
        self._run(
            "INSERT INTO ducklake_table_column_stats (table_id, column_id, contains_null, contains_nan)"
            " VALUES (:t, :c, :n, NULL)",
            {"t": table.table_id, "c": column_id, "n": self._record_count(table.table_id) > 0},
        )
        self._altered(table.table_id)

    def drop_column(self, table: LakeTable, column_id: int) -> None:
        self._run(
            "UPDATE ducklake_column SET end_snapshot = :s"
            " WHERE table_id = :t AND column_id = :c AND end_snapshot IS NULL",
            {"s": self.snapshot_id, "t": table.table_id, "c": column_id},
        )
        self._altered(table.table_id)

    def rename_column(self, table: LakeTable, column_id: int, new_name: str) -> None:
        """End the column's row and add one with the same id under the new name (as DuckDB does)."""
        self._replace_column(table, column_id, name=new_name)

    def retype_column(self, table: LakeTable, column_id: int, new_type: str) -> None:
        """A type promotion DuckDB reads from the old files (int32 -> int64, ...): same id, new type."""
        self._replace_column(table, column_id, type_name=new_type)

    def _replace_column(
        self, table: LakeTable, column_id: int, name: str | None = None, type_name: str | None = None
    ) -> None:
        row = self._run(
            "SELECT column_order, column_name, column_type, nulls_allowed FROM ducklake_column"
            " WHERE table_id = :t AND column_id = :c AND end_snapshot IS NULL",
            {"t": table.table_id, "c": column_id},
        ).one()
        self.drop_column(table, column_id)
        self._insert_column(
            table.table_id,
            column_id=column_id,
            order=int(row.column_order),
            name=name or row.column_name,
            type_name=type_name or row.column_type,
            nullable=bool(row.nulls_allowed),
        )
        if type_name is not None:
            self._run(
                "DELETE FROM ducklake_table_column_stats WHERE table_id = :t AND column_id = :c",
                {"t": table.table_id, "c": column_id},
            )

    def _insert_column(
        self, table_id: int, *, column_id: int, order: int, name: str, type_name: str, nullable: bool
    ) -> None:
        self._run(
            "INSERT INTO ducklake_column VALUES"
            " (:id, :s, NULL, :t, :o, :n, :ty, NULL, 'NULL', :null, NULL, 'literal', 'duckdb')",
            {
                "id": column_id,
                "s": self.snapshot_id,
                "t": table_id,
                "o": order,
                "n": name,
                "ty": type_name,
                "null": nullable,
            },
        )

    def _altered(self, table_id: int) -> None:
        self._table_schema_changed(table_id)
        self._change(f"altered_table:{table_id}")

    def _table_schema_changed(self, table_id: int) -> None:
        if table_id not in self._schema_changed:
            self._schema_changed.add(table_id)
            self._bump_schema_version()

    def _bump_schema_version(self) -> None:
        if not self._ddl:
            self._ddl = True
            self.schema_version += 1

    # -- data ------------------------------------------------------------------------------------
    def add_data_file(self, table: LakeTable, file: NewFile) -> int:
        """Register a data file: row ids, table statistics and file column statistics."""
        data_file_id = self._file_id()
        stats = self._run(
            "SELECT record_count, next_row_id, file_size_bytes FROM ducklake_table_stats WHERE table_id = :t",
            {"t": table.table_id},
        ).one_or_none()
        row_id_start = int(stats.next_row_id) if stats is not None else 0
        self._run(
            "INSERT INTO ducklake_data_file VALUES (:id, :t, :s, NULL, NULL, :p, :rel, 'parquet', :n, :size, :footer,"
            " :row, NULL, NULL, NULL, NULL)",
            {
                "id": data_file_id,
                "t": table.table_id,
                "s": self.snapshot_id,
                "p": file.name,
                "rel": True,
                "n": file.record_count,
                "size": file.size_bytes,
                "footer": file.footer_size,
                "row": row_id_start,
            },
        )
        if stats is None:
            self._run(
                "INSERT INTO ducklake_table_stats VALUES (:t, :n, :n, :size)",
                {"t": table.table_id, "n": file.record_count, "size": file.size_bytes},
            )
        else:
            self._run(
                "UPDATE ducklake_table_stats SET record_count = :c, next_row_id = :r, file_size_bytes = :size"
                " WHERE table_id = :t",
                {
                    "t": table.table_id,
                    "c": int(stats.record_count) + file.record_count,
                    "r": row_id_start + file.record_count,
                    "size": int(stats.file_size_bytes) + file.size_bytes,
                },
            )
        if file.stats:
            self._run(
                "INSERT INTO ducklake_file_column_stats VALUES (:f, :t, :c, :size, :v, :nulls, :lo, :hi, NULL, NULL)",
                [
                    {
                        "f": data_file_id,
                        "t": table.table_id,
                        "c": s.column_id,
                        "size": s.size_bytes,
                        "v": s.value_count,
                        "nulls": s.null_count,
                        "lo": s.min_value,
                        "hi": s.max_value,
                    }
                    for s in file.stats
                ],
            )
            kinds = {c.column_id: stats_kind(c.type) for c in table.columns}
            for s in file.stats:
                self._widen(table.table_id, s, kinds.get(s.column_id))
        self._change(f"inserted_into_table:{table.table_id}")
        return data_file_id

    def _widen(self, table_id: int, file: ColumnStats, kind: Stats | None) -> None:
        """Widen the table bounds to cover a new file. No row means unknown bounds, and stays so."""
        row = self._run(
            "SELECT contains_null, min_value, max_value FROM ducklake_table_column_stats"
            " WHERE table_id = :t AND column_id = :c",
            {"t": table_id, "c": file.column_id},
        ).one_or_none()
        if row is None:
            return
        contains_null = bool(row.contains_null) or file.null_count > 0
        low, high = row.min_value, row.max_value
        if file.value_count:
            if kind is None or file.min_value is None or file.max_value is None:
                self._run(
                    "DELETE FROM ducklake_table_column_stats WHERE table_id = :t AND column_id = :c",
                    {"t": table_id, "c": file.column_id},
                )
                return
            if low is None or high is None:
                low, high = file.min_value, file.max_value
            else:
                low, high = widen(kind, low, high, file.min_value, file.max_value)
        self._run(
            "UPDATE ducklake_table_column_stats SET contains_null = :n, min_value = :lo, max_value = :hi"
            " WHERE table_id = :t AND column_id = :c",
            {"t": table_id, "c": file.column_id, "n": contains_null, "lo": low, "hi": high},
        )

    def new_delete_file_id(self) -> int:
        return self._file_id()

    def replace_delete_file(
        self,
        table: LakeTable,
        *,
        data_file: DataFile,
        delete_file_id: int,
        file: NewFile,
        begin_snapshot: int,
        partial: bool,
    ) -> None:
        """Make ``file`` the data file's one active delete file; the previous one is removed and scheduled to go."""
        current = self._run(
            "SELECT delete_file_id, path, path_is_relative FROM ducklake_delete_file"
            " WHERE data_file_id = :d AND end_snapshot IS NULL",
            {"d": data_file.data_file_id},
        ).one_or_none()
        active = self._run(
            "SELECT count(*) FROM ducklake_data_file WHERE data_file_id = :d AND end_snapshot IS NULL",
            {"d": data_file.data_file_id},
        ).scalar_one()
        if not active:
            raise CommitConflict(f"data file {data_file.data_file_id} is no longer active")
        expected = data_file.delete.delete_file_id if data_file.delete else None
        if (current.delete_file_id if current else None) != expected:
            raise CommitConflict(f"the delete file of data file {data_file.data_file_id} changed")
        if current is not None:
            self._run("DELETE FROM ducklake_delete_file WHERE delete_file_id = :d", {"d": current.delete_file_id})
            path = (table.relative_directory or "") + current.path if current.path_is_relative else current.path
            self._run(
                "INSERT INTO ducklake_files_scheduled_for_deletion VALUES (:d, :p, :rel, :t)",
                {
                    "d": current.delete_file_id,
                    "p": path,
                    "rel": bool(current.path_is_relative) and table.relative_directory is not None,
                    "t": _now(),
                },
            )
        self._run(
            "INSERT INTO ducklake_delete_file VALUES"
            " (:id, :t, :s, NULL, :d, :p, :rel, 'parquet', :n, :size, :footer, NULL, :pm)",
            {
                "id": delete_file_id,
                "t": table.table_id,
                "s": begin_snapshot,
                "d": data_file.data_file_id,
                "p": file.name,
                "rel": True,
                "n": file.record_count,
                "size": file.size_bytes,
                "footer": file.footer_size,
                "pm": self.snapshot_id if partial else None,
            },
        )
        self._change(f"deleted_from_table:{table.table_id}")

    def end_data_files(self, table: LakeTable) -> None:
        """Truncate: end every active data file of the table."""
        self._run(
            "UPDATE ducklake_data_file SET end_snapshot = :s WHERE table_id = :t AND end_snapshot IS NULL",
            {"s": self.snapshot_id, "t": table.table_id},
        )
        self._change(f"deleted_from_table:{table.table_id}")

    def _record_count(self, table_id: int) -> int:
        value = self._run("SELECT record_count FROM ducklake_table_stats WHERE table_id = :t", {"t": table_id}).scalar()
        return int(value or 0)

    def _catalog_id(self) -> int:
        value = self.next_catalog_id
        self.next_catalog_id += 1
        return value

    def _file_id(self) -> int:
        value = self.next_file_id
        self.next_file_id += 1
        return value

    def finish(self) -> None:
        for table_id in self._schema_changed:
            self._run(
                "INSERT INTO ducklake_schema_versions VALUES (:s, :v, :t)",
                {"s": self.snapshot_id, "v": self.schema_version, "t": table_id},
            )
        self._run(
            "INSERT INTO ducklake_snapshot VALUES (:s, :time, :v, :c, :f)",
            {
                "s": self.snapshot_id,
                "time": _now(),
                "v": self.schema_version,
                "c": self.next_catalog_id,
                "f": self.next_file_id,
            },
        )
        self._run(
            "INSERT INTO ducklake_snapshot_changes VALUES (:s, :c, :a, NULL, NULL)",
            {"s": self.snapshot_id, "c": ",".join(self.changes), "a": self.catalog.author},
        )


def _migrate_legacy_columns(conn: Connection) -> None:
    """Move attribute numbers recorded by earlier versions of this writer; their types stay unknown."""
    conn.exec_driver_sql(
        f"INSERT INTO {COLUMNS_TABLE} (table_id, column_id, attnum, type_oid, type_modifier)"
        f" SELECT table_id, column_id, attnum, {UNKNOWN_SOURCE_TYPE[0]}, {UNKNOWN_SOURCE_TYPE[1]}"
        f" FROM {LEGACY_COLUMNS_TABLE} o WHERE NOT EXISTS"
        f" (SELECT 1 FROM {COLUMNS_TABLE} n WHERE n.table_id = o.table_id AND n.column_id = o.column_id)"
    )
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {LEGACY_COLUMNS_TABLE}")


def _is_integer(text: str) -> bool:
    """Whether a statistics value reads as an integer (files written before a type change may hold others)."""
    return text.lstrip("-").isdigit()
