from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from etl.config import load_config
from etl.errors import ConfigError
from etl.factory import validate_plugins
from etl.log import configure_logging

GOOD = """
[pipeline]
id = 1
publication = "my_pub"
[source]
host = "127.0.0.1"
port = 5432
database = "postgres"
user = "postgres"
password = "${PGPASSWORD}"
sslmode = "prefer"
[batch]
max_fill_ms = 1000
max_bytes = 8388608
[store]
type = "memory"
[destination]
type = "memory"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return path


def test_valid_file_loads_with_env_secret(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), environ={"PGPASSWORD": "s3cret-value"})
    assert config.pipeline.publication == "my_pub"
    assert config.source.password is not None
    assert config.source.password.get_secret_value() == "s3cret-value"
    assert config.source.conninfo()["password"] == "s3cret-value"
    assert "s3cret-value" not in repr(config)
    assert "s3cret-value" not in str(config)


def test_missing_env_var_names_key_and_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, GOOD), environ={})
    assert "source.password" in str(err.value)
    assert "PGPASSWORD" in str(err.value)


def test_missing_required_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('publication = "my_pub"\n', ""))
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"PGPASSWORD": "x"})
    message = str(err.value)
    assert str(path) in message
    assert "pipeline.publication: required key is missing" in message


def test_wrong_type_is_named_with_expectation(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("port = 5432", 'port = "five"'))
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"PGPASSWORD": "x"})
    assert "source.port" in str(err.value)
    assert "integer" in str(err.value)


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("max_bytes", "max_bites"))
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"PGPASSWORD": "x"})
    assert "batch.max_bites: unknown key" in str(err.value)


def test_unknown_destination_type_lists_installed_and_provider(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        GOOD.replace('type = "memory"\n"""', 'type = "snowflake"\n"""').replace(
            '[destination]\ntype = "memory"', '[destination]\ntype = "snowflake"'
        ),
    )
    config = load_config(path, environ={"PGPASSWORD": "x"})
    with pytest.raises(ConfigError) as err:
        validate_plugins(config, str(path))
    message = str(err.value)
    assert "destination.type" in message and "snowflake" in message
    assert "installed: " in message and "memory" in message


def test_missing_builtin_names_its_package(tmp_path: Path) -> None:
    from etl.plugins import load_registry

    registry = load_registry()
    registry.destinations.pop("ducklake", None)  # as if etl-spark were not installed
    path = write(tmp_path, GOOD.replace('[destination]\ntype = "memory"', '[destination]\ntype = "ducklake"'))
    config = load_config(path, environ={"PGPASSWORD": "x"})
    with pytest.raises(ConfigError) as err:
        validate_plugins(config, str(path), registry)
    assert "pip install etl-spark" in str(err.value)


def test_invalid_plugin_option_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('[destination]\ntype = "memory"', '[destination]\ntype = "memory"\ncolour = 1'))
    config = load_config(path, environ={"PGPASSWORD": "x"})
    with pytest.raises(ConfigError) as err:
        validate_plugins(config, str(path))
    assert "destination.colour: unknown key" in str(err.value)


def test_bad_toml_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[pipeline\nid=1")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and "TOML" in str(err.value)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    handlers = logging.getLogger().handlers[:]
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers[:] = handlers


def test_logs_redact_secrets(capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    configure_logging("json", "info")
    structlog.get_logger("t").info("connecting", password="hunter2", dsn="host=x password=hunter2 user=y")
    logging.getLogger("lib").warning("conninfo password=hunter2")
    err = capsys.readouterr().err
    assert "hunter2" not in err
    assert "connecting" in err and "conninfo" in err


def test_plugin_section_secrets_are_masked_in_repr(tmp_path: Path) -> None:
    text = GOOD.replace(
        '[store]\ntype = "memory"', '[store]\ntype = "postgres"\npassword = "store-pw"\nhost = "db"'
    ).replace(
        '[destination]\ntype = "memory"', '[destination]\ntype = "ducklake"\ncatalog = "postgresql://u:url-pw@h/d"'
    )
    config = load_config(write(tmp_path, text), environ={"PGPASSWORD": "x"})
    for shown in (repr(config), str(config), repr(config.store), repr(config.destination)):
        assert "store-pw" not in shown and "url-pw" not in shown
        assert "host='db'" in shown or "ducklake" in shown
    assert config.store.options()["password"] == "store-pw"  # the value itself is intact
