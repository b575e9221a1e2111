"""Pipeline configuration: a TOML file, validated into typed sections.

``${VAR}`` in any string reads the environment (``$$`` is a literal ``$``). Secrets are held as
``SecretStr`` and never appear in reprs, logs or error messages. Validation errors name the file,
the key and what was expected.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from etl.errors import ConfigError
from etl.log import redact_value

M = TypeVar("M", bound=BaseModel)

_ENV_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PostgresConnection(Section):
    """Connection settings shared by the source and the Postgres store."""

    host: str = "127.0.0.1"
    port: int = Field(5432, ge=1, le=65535)
    database: str = "postgres"
    user: str = "postgres"
    password: SecretStr | None = None
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = "prefer"
    sslrootcert: str | None = None
    sslcert: str | None = None
    sslkey: str | None = None
    connect_timeout: int = Field(10, ge=1, description="seconds")
    keepalives_idle: int = Field(30, ge=1, description="seconds before TCP keepalives start")
    keepalives_interval: int = Field(10, ge=1)
    keepalives_count: int = Field(3, ge=1)
    application_name: str = "etl"

    def conninfo(self, **overrides: str) -> dict[str, str]:
        """libpq connection parameters, password included (never log the result)."""
        params = {
            "host": self.host,
            "port": str(self.port),
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
        if self.password is not None:
            params["password"] = self.password.get_secret_value()
        params.update(overrides)
        return params

    def describe(self) -> str:
        """Where this connection goes, without secrets."""
        return f"{self.user}@{self.host}:{self.port}/{self.database}"


class PipelineSection(Section):
    id: int = Field(ge=0, description="unique per store; names the replication slots")
    publication: str = Field(min_length=1)
    table_sync_workers: int = Field(4, ge=1, description="tables copied at once")
    copy_connections: int = Field(2, ge=1, description="parallel COPY connections per table")
    invalidated_slot: Literal["stop", "recreate"] = "stop"
    """What to do when the slot was invalidated (WAL removed): stop with instructions, or recreate and resync."""
    install_ddl_trigger: bool = True
    """Install the source-side DDL event trigger when the role may (superuser)."""


class BatchSection(Section):
    max_fill_ms: int = Field(1000, ge=1, description="flush a batch after this long")
    max_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="flush a batch past this size")
    spill_threshold_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="spill an in-progress streamed transaction to disk past this"
    )


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


class PipelineConfig(Section):
    pipeline: PipelineSection
    source: PostgresConnection
    batch: BatchSection = BatchSection()
    store: PluginSection = PluginSection(type="memory")
    destination: PluginSection = PluginSection(type="memory")


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> PipelineConfig:
    """Read and validate a pipeline file; raise ``ConfigError`` naming the file and key on failure."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    raw = interpolate_env(raw, os.environ if environ is None else environ, str(path))
    return validate(PipelineConfig, raw, str(path))


def validate(model: type[M], data: Any, source: str, prefix: str = "") -> M:
    """Validate ``data`` into ``model``; errors name ``source`` and the dotted key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid configuration:\n" + format_errors(exc, prefix)) from None


def format_errors(exc: ValidationError, prefix: str = "") -> str:
    lines = []
    for err in exc.errors(include_url=False, include_input=False):
        key = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        message = err["msg"]
        if err["type"] == "missing":
            message = "required key is missing"
        elif err["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see docs/configuration.md)"
        lines.append(f"  {key}: {message}")
    return "\n".join(lines)


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
            raise ConfigError(
                f"{source}: {key}: environment variable {name} is not set",
                hint=f"export {name}=... before starting, or write the value in the file",
            )
        return str(environ[name])

    return _ENV_REF.sub(substitute, value)
