"""Pipeline configuration: a TOML file, validated into typed sections.

``${VAR}`` in any string reads the environment (``$$`` is a literal ``$``). Secrets are held as
``SecretStr`` and never appear in reprs, logs or error messages. Validation errors name the file,
the key and what was expected (``config_validation``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from etl.config_validation import validate
from etl.errors import ConfigError
from etl.log import redact_value
from etl.schema import TableName

log = structlog.get_logger(__name__)

_ENV_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _port(value: Any) -> int:
    if isinstance(value, float):
        raise ValueError(f"not a whole number: {value}")
    return int(value)


def _not_a_bool(value: Any) -> Any:
    # pydantic reads true/false as 1/0 for an int field; in a config file that is always a mistake
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got the boolean {str(value).lower()}")
    return value


Integer = Annotated[int, BeforeValidator(_not_a_bool)]
"""An ``int`` setting that refuses booleans but, unlike a strict int, still reads ``"5432"`` (from ``${VAR}``).

Plugin config models should use it for their integer settings too.
"""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PostgresConnection(Section):
    """Connection settings shared by the source and the Postgres store."""

    host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Server host name or address (libpq's `host`). Several, comma-separated (`pg1,pg2`), for a"
        " primary and its standbys: each connection goes to the first that `target_session_attrs` accepts, so after"
        " a failover the pipeline finds the new primary by itself.",
    )
    port: int | list[int] = Field(
        5432,
        description="Server port: one for every host, or one per host, as a list (`[5432, 5433]`) or in libpq's"
        ' form (`"5432,5433"`).',
    )
    target_session_attrs: Literal["any", "read-write", "read-only", "primary", "standby", "prefer-standby"] | None = (
        Field(
            None,
            description="As in libpq: which of several hosts a connection accepts. Unset: `read-write` when `host`"
            " names several (the pipeline follows the primary), libpq's `any` otherwise.",
        )
    )
    database: str = Field("postgres", description="Database to connect to.")
    user: str = Field("postgres", description="Role to connect as.")
    password: SecretStr | None = Field(
        None, description='Usually `"${PGPASSWORD}"`. Never shown: reprs, logs and errors print `**********`.'
    )
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = Field(
        "prefer", description="As in libpq. Use `verify-full` in production."
    )
    sslrootcert: str | None = Field(
        None, description="As in libpq: the file of CA certificates that verify the server."
    )
    sslcert: str | None = Field(None, description="As in libpq: the file of the client certificate.")
    sslkey: str | None = Field(None, description="As in libpq: the file of the client certificate's private key.")
    connect_timeout: Integer = Field(10, ge=1, description="Seconds to wait while connecting, as in libpq.")
    keepalives_idle: Integer = Field(
        30, ge=1, description="Seconds of silence before TCP keepalives start, so a dead peer is noticed."
    )
    keepalives_interval: Integer = Field(10, ge=1, description="Seconds between TCP keepalive probes.")
    keepalives_count: Integer = Field(
        3, ge=1, description="TCP keepalives that may go unanswered before the connection counts as dead."
    )
    application_name: str = Field(
        "etl", description="Shown in `pg_stat_activity` (and `pg_stat_replication` for replication connections)."
    )

    @field_validator("port", mode="before")
    @classmethod
    def _ports(cls, port: Any) -> int | list[int]:
        """An integer, a list of them, or libpq's text form (`"5432"`, `"5432,5433"`, as ``${PGPORT}`` gives it)."""
        values = port.split(",") if isinstance(port, str) else port if isinstance(port, list) else [port]
        for value in values:
            _not_a_bool(value)
        try:
            ports = [_port(v) for v in values]
        except (TypeError, ValueError):
            raise ValueError(f"expected an integer port or a list of them (5432, [5432, 5433]), got {port!r}") from None
        return ports if isinstance(port, list) or len(ports) > 1 else ports[0]

    @field_validator("port")
    @classmethod
    def _ports_in_range(cls, port: int | list[int]) -> int | list[int]:
        for value in port if isinstance(port, list) else [port]:
            if not 1 <= value <= 65535:
                raise ValueError(f"a port is between 1 and 65535, not {value}")
        return port

    @model_validator(mode="after")
    def _a_port_per_host(self) -> PostgresConnection:
        if any(not h.strip() for h in self.hosts):
            raise ValueError(f"host {self.host!r} has an empty entry; separate several hosts with commas: pg1,pg2")
        if isinstance(self.port, list) and len(self.port) != len(self.hosts):
            raise ValueError(
                f"port gives {len(self.port)} port(s) for {len(self.hosts)} host(s); give one port per host, or one"
                " port for all"
            )
        return self

    @property
    def hosts(self) -> list[str]:
        return [h.strip() for h in self.host.split(",")]

    @property
    def session_attrs(self) -> str | None:
        """The ``target_session_attrs`` the connections use (see the setting)."""
        if self.target_session_attrs is None and len(self.hosts) > 1:
            return "read-write"
        return self.target_session_attrs

    def conninfo(self, **overrides: str) -> dict[str, str]:
        """libpq connection parameters, password included (never log the result)."""
        params = {
            "host": ",".join(self.hosts),
            "port": ",".join(str(p) for p in self.port) if isinstance(self.port, list) else str(self.port),
            "dbname": self.database,
            "user": self.user,
            "sslmode": self.sslmode,
            "connect_timeout": str(self.connect_timeout),
            "keepalives": "1",
            "keepalives_idle": str(self.keepalives_idle),
            "keepalives_interval": str(self.keepalives_interval),
            "keepalives_count": str(self.keepalives_count),
            "application_name": self.application_name,
        }
        for key in ("sslrootcert", "sslcert", "sslkey"):
            value = getattr(self, key)
            if value is not None:
                params[key] = value
        if self.session_attrs is not None:
            params["target_session_attrs"] = self.session_attrs
        if self.password is not None:
            params["password"] = self.password.get_secret_value()
        params.update(overrides)
        return params

    def describe(self) -> str:
        """Where this connection goes, without secrets."""
        ports = self.port if isinstance(self.port, list) else [self.port] * len(self.hosts)
        return f"{self.user}@{','.join(f'{h}:{p}' for h, p in zip(self.hosts, ports, strict=True))}/{self.database}"


class PipelineSection(Section):
    id: Integer = Field(
        ge=0,
        le=2**63 - 1,  # stores keep it in a signed 64-bit column
        description="Unique per store, from 0 to 2^63 - 1. Names the replication slots (`etl_apply_<id>`,"
        " `etl_sync_<id>_<table oid>`) and scopes the stored state.",
    )
    publication: str = Field(min_length=1, description="The Postgres publication to replicate.")
    table_sync_workers: Integer = Field(
        4,
        ge=1,
        description=(
            "Tables copied at the same time. Each snapshot copy needs a replication slot and a WAL sender while it"
            " copies; an incremental copy's chunks are read on as many copy threads, one chunk per table at a time."
        ),
    )
    invalidated_slot: Literal["stop", "recreate"] = Field(
        "stop",
        description="When a slot cannot go on — the source dropped the WAL it needed (`wal_status = lost`), or it is"
        " gone although the store holds progress for it (dropped outside etl, or lost in a failover): stop with"
        " instructions (`etl reset --recopy`), or recreate it and copy again (every table for the apply slot; the one"
        " table for a table sync slot).",
    )
    failover_slots: bool = Field(
        True,
        description="Make the pipeline's slots failover slots (Postgres 17+, on a primary that sets"
        " `synchronized_standby_slots`), which standbys with `sync_replication_slots = on` keep in step: after a"
        " failover the pipeline goes on from the promoted standby with nothing copied again. No effect before 17, on"
        " a standby source, or without `synchronized_standby_slots`; see"
        " [configuration.md](configuration.md#source-failover).",
    )
    table_error_retry_delay_ms: Integer = Field(
        10_000,
        ge=1,
        description="First wait before an errored table whose failure may pass (a destination failure) is copied"
        " again; each further attempt waits twice as long."
        " See [architecture.md](architecture.md#errored-tables-and-timed-retries).",
    )
    table_error_retry_max_attempts: Integer = Field(
        5,
        ge=0,
        description="Timed retries of an errored table whose failure may pass (the wait doubles each time) before"
        " it waits for `etl resync`.",
    )
    install_ddl_trigger: bool = Field(
        True,
        description="Install the source-side DDL event trigger when the role may (superuser). Without it schema"
        " changes are still picked up from the replication stream; see [schema-changes.md](schema-changes.md).",
    )
    shutdown_timeout_s: Integer = Field(
        30,
        ge=1,
        description="After SIGTERM/SIGINT, how long `etl run` lets the pipeline drain (finish the write in flight,"
        " store its progress, close connections) before it exits anyway with code 3."
        " See [Stopping `etl run`](#stopping-etl-run).",
    )


CopyMode = Literal["initial", "never", "initial_only"]


class CopySection(Section):
    """Which tables are copied before they stream, and whether the pipeline streams at all after the copies."""

    mode: CopyMode = Field(
        "initial",
        description="`initial`: copy each table, then stream its changes. `never`: copy nothing; every table streams"
        " from the moment the pipeline takes it on (its destination table starts empty). `initial_only`: copy each"
        " table, then stop once all are copied, dropping the pipeline's slots."
        " See [Copy control](configuration.md#copy-control).",
    )
    include: list[str] | None = Field(
        None,
        description="Only these tables (`schema.table`, or `table` in `public`) are copied; the other published"
        " tables are streamed without a copy. Unset: every published table is copied.",
    )
    skip: list[str] = Field(
        default_factory=list, description="These tables are not copied, only streamed (applied after `include`)."
    )
    connections: Integer = Field(
        2,
        ge=1,
        description="Parallel `COPY` connections per table (ctid ranges), or per chunk of an `incremental` copy"
        " (key ranges of at least 1,000 rows each, in the snapshot of the chunk's first connection).",
    )
    method: Literal["snapshot", "incremental"] = Field(
        "snapshot",
        description="`snapshot`: each table in one exported snapshot, over `connections` parallel ranges, while a"
        " slot of its own keeps the WAL until the table catches up. `incremental`: each table in chunks of"
        " `chunk_rows` in key order, each read in a short transaction of its own while every table streams;"
        " resumes after a crash from the last chunk written, and holds back no vacuum on the source for the"
        " length of the copy. Any key orders the chunks (primary key or replica identity index, of any columns and"
        " types); tables with none, and partitioned tables published through their root, are copied by `snapshot`."
        " See [Incremental copy](configuration.md#incremental-copy).",
    )
    chunk_rows: Integer = Field(
        50_000, ge=1, description="Rows of one chunk of an `incremental` copy (one read, one write, one record)."
    )
    on_type_change: Literal["stop", "resync"] = Field(
        "stop",
        description="A column's type changed (`ALTER COLUMN ... TYPE`) to one the destination cannot give its"
        " existing table. `stop`: the table goes errored and waits for `etl resync` (the other tables stream on)."
        " `resync`: the table is copied again at once with the new type, its destination table replaced.",
    )

    @field_validator("include", "skip")
    @classmethod
    def _table_names(cls, names: list[str] | None) -> list[str] | None:
        for name in names or []:
            TableName.parse(name)  # TableNameError is a ValueError: the key is named, with what was wrong
        return names

    def copies(self, table: TableName) -> bool:
        """Whether a table the pipeline takes on for the first time is copied (rather than only streamed)."""
        if self.mode == "never" or table in self.skipped:
            return False
        return self.include is None or table in {TableName.parse(n) for n in self.include}

    @property
    def skipped(self) -> set[TableName]:
        return {TableName.parse(n) for n in self.skip}

    def unpublished(self, published: set[TableName]) -> list[TableName]:
        """The tables ``include`` and ``skip`` name that are not in ``published``: a typo there would copy a table
        meant to be skipped (or skip one meant to be copied) without a word."""
        named = {TableName.parse(n) for n in (*(self.include or ()), *self.skip)}
        return sorted(named - published)


class BatchSection(Section):
    max_fill_ms: Integer = Field(
        1000,
        ge=1,
        description="A batch is handed to the destination this long after its first change, or as soon after as the"
        " previous write has ended and the destination's least interval between writes has passed, if it has one"
        " (the `bigquery` destination's `min_apply_interval_s`); until then it keeps filling, up to `max_bytes`"
        " (`busy_max_bytes` while that write runs or that interval lasts).",
    )
    max_bytes: Integer = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="A batch is also handed over once it holds this many bytes of change data, as soon as the"
        " destination is free for it.",
    )
    busy_max_bytes: Integer = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="While the destination is busy (the previous write still runs, or its least interval between"
        " writes lasts), the next batch keeps filling past `max_bytes`, up to this many bytes (never less than"
        " `max_bytes`); only then does it go, once the write has ended, and reading pauses meanwhile. Changes arriving"
        " faster than the destination writes them thus go in fewer, larger writes, which pay each write's fixed costs"
        " (per table, per job, per quota unit) less often. Set it to `max_bytes` to cut every batch there.",
    )
    spill_threshold_bytes: Integer = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Large in-progress transactions (protocol 2 streaming) spill to local files past this.",
    )
    spill_directory: str | None = Field(
        None,
        min_length=1,
        description="An existing directory on a local disk (relative to the working directory) where the spill files"
        " go: each stream of the pipeline makes a directory of its own in it on first use, and removes it when it"
        " ends. Those of pipelines that died (killed, out of memory) are removed when a pipeline using the same place"
        " starts. Default: the system's temporary directory (`TMPDIR`); choose one with room for the largest"
        " transactions, not a memory-backed `/tmp`, and not storage shared between hosts.",
    )

    @model_validator(mode="after")
    def _busy_not_below_max(self) -> BatchSection:
        if "busy_max_bytes" in self.model_fields_set and self.busy_max_bytes < self.max_bytes:
            raise ValueError(
                f"busy_max_bytes ({self.busy_max_bytes}) is below max_bytes ({self.max_bytes}): a batch grows past"
                " max_bytes while the destination is busy, up to busy_max_bytes; set it to max_bytes or more"
            )
        return self

    @property
    def busy_limit(self) -> int:
        """The size a batch fills up to while the destination is busy: ``busy_max_bytes``, at least ``max_bytes``
        (which may be set above the default ``busy_max_bytes`` alone)."""
        return max(self.max_bytes, self.busy_max_bytes)


class PluginSection(BaseModel):
    """``type`` picks the plugin; the other keys are validated by the plugin's own config model."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str = Field(min_length=1)

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # Plugin options are untyped here, so secrets among them are masked by name and by shape.
        yield "type", self.type
        for key, value in self.options().items():
            yield key, redact_value(key, value)


class MetricsSection(Section):
    """Prometheus metrics and health checks (see docs/observability.md)."""

    listen: str | None = Field(
        None,
        pattern=r"^(\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]+):[0-9]{1,5}$",
        json_schema_extra={"form": "host:port"},
        examples=["127.0.0.1:9187"],
        description="`host:port` serving `/metrics` (Prometheus text format), `/healthz` and `/readyz`"
        " (`127.0.0.1:9187`; `0.0.0.0:9187` or `[::]:9187` for a scraper or kubelet on another host). Unset: no"
        " listener. A port in use fails the start with a hint.",
    )
    sample_interval_s: Integer = Field(
        10,
        ge=1,
        description="How often the source is asked for its WAL position and its slots' retained WAL"
        " (`etl_replication_lag_bytes`, `etl_slot_retained_wal_bytes`): one short query on a normal connection.",
    )
    stuck_after_s: Integer = Field(
        120,
        ge=1,
        description="`/readyz` fails when the apply worker's read loop has not turned, or its destination write has"
        " run, for this long (a destination write that hangs). Set it above the longest batch write you expect.",
    )


class PipelineConfig(Section):
    pipeline: PipelineSection
    source: PostgresConnection
    copy_: CopySection = Field(CopySection(), alias="copy")
    batch: BatchSection = BatchSection()
    store: PluginSection = PluginSection(type="memory")
    destination: PluginSection = PluginSection(type="memory")
    metrics: MetricsSection | None = None
    """With a ``[metrics]`` section the source is sampled for lag and retained WAL; with ``listen`` also served."""

    @model_validator(mode="before")
    @classmethod
    def _copy_connections_moved(cls, data: Any) -> Any:
        """``[pipeline] copy_connections`` is read as ``[copy] connections``, with a deprecation warning."""
        pipeline = data.get("pipeline") if isinstance(data, dict) else None
        if not isinstance(pipeline, dict) or "copy_connections" not in pipeline:
            return data
        copy = data.get("copy", {})
        if isinstance(copy, dict) and "connections" in copy:
            raise ValueError(
                "[pipeline] copy_connections and [copy] connections are both set; keep [copy] connections only"
            )
        log.warning("[pipeline] copy_connections is deprecated; it is read as [copy] connections, write that instead")
        pipeline = {k: v for k, v in pipeline.items() if k != "copy_connections"}
        copy = {**copy, "connections": data["pipeline"]["copy_connections"]} if isinstance(copy, dict) else copy
        return {**data, "pipeline": pipeline, "copy": copy}


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> PipelineConfig:
    """Read and validate a pipeline file; raise ``ConfigError`` naming the file and key on failure."""
    path = Path(path)
    text = _read_text(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    raw = interpolate_env(raw, os.environ if environ is None else environ, str(path))
    return validate(PipelineConfig, raw, str(path))


def _read_text(path: Path) -> str:
    """The file's text, decoded as UTF-8 (what TOML requires); ``ConfigError`` when it cannot be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such config file", hint="check the path given to -c/--config (or in $ETL_CONFIG)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            f"{path}: is a directory, not a config file", hint="give the path of the pipeline's TOML file"
        ) from None
    except PermissionError:
        raise ConfigError(
            f"{path}: permission denied reading the config file",
            hint="make the file readable by the user that runs etl (chmod/chown), or run etl as its owner",
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")  # tolerate the byte order mark some editors write
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: not UTF-8 text: byte 0x{data[exc.start]:02x} on line {line} cannot be decoded",
            hint="TOML files are UTF-8: save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from None


def interpolate_env(value: Any, environ: Any, source: str, key: str = "") -> Any:
    """Replace ``${VAR}`` in every string of a parsed TOML document."""
    if isinstance(value, dict):
        return {k: interpolate_env(v, environ, source, f"{key}.{k}" if key else k) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate_env(v, environ, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        if name not in environ:
            # Worded so that no key sits before a colon: "password: ..." would be masked as a secret in logs.
            raise ConfigError(
                f"{source}: environment variable {name}, used by {key}, is not set",
                hint=f"export {name} in the environment of etl before starting it, or write the value in the file",
            )
        return str(environ[name])

    return _ENV_REF.sub(substitute, value)
