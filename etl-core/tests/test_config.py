from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import structlog

from etl.config import PipelineConfig, load_config
from etl.destination.memory import MemoryDestination
from etl.errors import ConfigError
from etl.factory import validate_plugins
from etl.log import configure_logging, redact_text
from etl.pipeline import Pipeline
from etl.store.memory import MemoryStore

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


@pytest.mark.parametrize("pipeline_id", [2**63, 2**64, -1])
def test_pipeline_id_outside_a_signed_64_bit_integer_is_refused(tmp_path: Path, pipeline_id: int) -> None:
    """Stores keep the id in a signed 64-bit column: a larger one must fail the load, not ``etl status``."""
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, GOOD.replace("id = 1", f"id = {pipeline_id}")), environ={"PGPASSWORD": "x"})
    assert "pipeline.id" in str(err.value)
    config = load_config(write(tmp_path, GOOD.replace("id = 1", f"id = {2**63 - 1}")), environ={"PGPASSWORD": "x"})
    assert config.pipeline.id == 2**63 - 1


def test_several_hosts_take_one_port_each_and_the_writable_server(tmp_path: Path) -> None:
    """libpq's multi-host form: after a failover each connection goes to the new primary by itself."""
    text = GOOD.replace('host = "127.0.0.1"\nport = 5432', 'host = "pg1, pg2"\nport = [5432, 5433]')
    source = load_config(write(tmp_path, text), environ={"PGPASSWORD": "x"}).source
    params = source.conninfo()
    assert (params["host"], params["port"], params["target_session_attrs"]) == ("pg1,pg2", "5432,5433", "read-write")
    assert source.describe() == "postgres@pg1:5432,pg2:5433/postgres"
    text_ports = GOOD.replace('host = "127.0.0.1"\nport = 5432', 'host = "pg1,pg2"\nport = "${PGPORT}"')
    ports = load_config(write(tmp_path, text_ports), environ={"PGPASSWORD": "x", "PGPORT": "5432,5433"}).source.port
    assert ports == [5432, 5433], "libpq's text form, as an environment variable gives it"
    one_port = load_config(write(tmp_path, GOOD.replace('"127.0.0.1"', '"pg1,pg2"')), environ={"PGPASSWORD": "x"})
    assert one_port.source.conninfo()["port"] == "5432"
    assert (
        "target_session_attrs" not in load_config(write(tmp_path, GOOD), environ={"PGPASSWORD": "x"}).source.conninfo()
    )
    standbys = text.replace("port = [5432, 5433]", 'port = [5432, 5433]\ntarget_session_attrs = "standby"')
    assert (
        load_config(write(tmp_path, standbys), environ={"PGPASSWORD": "x"}).source.conninfo()["target_session_attrs"]
        == "standby"
    )


@pytest.mark.parametrize(
    ("hosts", "why"),
    [
        ('host = "pg1,,pg2"\nport = 5432', "an empty entry"),
        ('host = "pg1,pg2"\nport = [5432]', "one port per host"),
        ('host = "pg1"\nport = [70000]', "between 1 and 65535"),
        ('host = "pg1"\nport = 5432.5', "integer port"),
    ],
)
def test_bad_host_and_port_lists_are_refused(tmp_path: Path, hosts: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config(
            write(tmp_path, GOOD.replace('host = "127.0.0.1"\nport = 5432', hosts)), environ={"PGPASSWORD": "x"}
        )


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


def test_the_copy_section_reads_table_names_and_the_deprecated_copy_connections(tmp_path: Path) -> None:
    text = GOOD + '[copy]\nmode = "never"\nskip = ["audit", "Sales.\\"Order Items\\""]\n'
    copy = load_config(write(tmp_path, text), environ={"PGPASSWORD": "x"}).copy_
    assert (copy.mode, copy.connections, copy.skip) == ("never", 2, ["audit", 'Sales."Order Items"'])

    with structlog.testing.capture_logs() as logs:
        old = load_config(
            write(tmp_path, GOOD.replace('"my_pub"', '"my_pub"\ncopy_connections = 6')), environ={"PGPASSWORD": "x"}
        )
    assert old.copy_.connections == 6
    assert any("copy_connections is deprecated" in e["event"] for e in logs)

    both = GOOD.replace('"my_pub"', '"my_pub"\ncopy_connections = 6') + "[copy]\nconnections = 3\n"
    with pytest.raises(ConfigError, match=r"copy_connections and \[copy\] connections are both set"):
        load_config(write(tmp_path, both), environ={"PGPASSWORD": "x"})
    with pytest.raises(ConfigError, match=r"copy\.include: not a table name: 'a\.b\.c'"):
        load_config(write(tmp_path, GOOD + '[copy]\ninclude = ["a.b.c"]\n'), environ={"PGPASSWORD": "x"})
    with pytest.raises(ConfigError, match=r"copy\.mode: Input should be 'initial', 'never' or 'initial_only'"):
        load_config(write(tmp_path, GOOD + '[copy]\nmode = "always"\n'), environ={"PGPASSWORD": "x"})


def test_a_mistyped_key_is_one_line_that_says_what_was_meant(tmp_path: Path) -> None:
    """Not two lines (the key meant is missing, the key written is unknown): one, with the key meant."""
    path = write(tmp_path, GOOD.replace("publication =", "publicaton ="))
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"PGPASSWORD": "x"})
    lines = str(err.value).splitlines()[1:]
    assert lines == ['  pipeline.publicaton: unknown key; did you mean "publication"?']


def test_a_value_of_the_wrong_form_says_the_form_not_the_pattern(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + '[metrics]\nlisten = "9187"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"PGPASSWORD": "x"})
    assert str(err.value).splitlines()[1:] == ["  metrics.listen: expected host:port, for example 127.0.0.1:9187"]


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
    logging.captureWarnings(False)


def test_logs_redact_secrets(capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    configure_logging("json", "info")
    structlog.get_logger("t").info("connecting", password="hunter2", dsn="host=x password=hunter2 user=y")
    logging.getLogger("lib").warning("conninfo password=hunter2")
    err = capsys.readouterr().err
    assert "hunter2" not in err
    assert "connecting" in err and "conninfo" in err


def test_a_library_warning_is_a_log_event(capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    """A ``warnings.warn`` of a library (pandas, PySpark) comes as an event of the log, not as bare text."""
    configure_logging("json", "info")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("arrow optimisation fell back", UserWarning, stacklevel=1)
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [e["level"] for e in events if "arrow optimisation fell back" in e["event"]] == ["warning"]


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


# -- sharp edges of input ------------------------------------------------------------------------------


def test_file_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_bytes(GOOD.replace('"my_pub"', '"caf\xe9"').encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"PGPASSWORD": "x"})
    assert str(path) in err.value.message and "not UTF-8" in err.value.message
    assert "line 4" in err.value.message and err.value.hint is not None and "UTF-8" in err.value.hint


def test_directory_instead_of_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert err.value.message == f"{tmp_path}: is a directory, not a config file"


def test_unreadable_file(tmp_path: Path) -> None:
    # root reads any file whatever its mode; a write-only sysctl file is refused to root too (EACCES)
    path = write(tmp_path, GOOD)
    if os.geteuid() == 0:
        path = Path("/proc/sys/vm/compact_memory")
        if not path.exists():
            pytest.skip("running as root, and no file here that root may not read")
    else:
        path.chmod(0)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.message == f"{path}: permission denied reading the config file"
    assert err.value.hint is not None and "readable" in err.value.hint


def test_booleans_are_not_integers_but_numbers_from_the_environment_are(tmp_path: Path) -> None:
    for old, new, key in [
        ("id = 1", "id = true", "pipeline.id"),
        ("port = 5432", "port = false", "source.port"),
        ("max_bytes = 8388608", "max_bytes = true", "batch.max_bytes"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(write(tmp_path, GOOD.replace(old, new)), environ={"PGPASSWORD": "x"})
        assert f"{key}: expected an integer, got the boolean {new.split()[-1]}" in err.value.message
    # not a strict int: ${VAR} gives text, which still reads as a number
    path = write(tmp_path, GOOD.replace("port = 5432", 'port = "${PGPORT}"').replace("id = 1", 'id = "${ID}"'))
    config = load_config(path, environ={"PGPASSWORD": "x", "PGPORT": "6543", "ID": "7"})
    assert (config.source.port, config.pipeline.id) == (6543, 7)


def test_shutdown_timeout_defaults_to_30_and_is_at_least_1(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, GOOD), environ={"PGPASSWORD": "x"}).pipeline.shutdown_timeout_s == 30
    path = write(tmp_path, GOOD.replace("[source]", "shutdown_timeout_s = 0\n[source]"))
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={"PGPASSWORD": "x"})
    assert "pipeline.shutdown_timeout_s: Input should be greater than or equal to 1" in err.value.message


def test_a_batch_grows_while_busy_up_to_busy_max_bytes_never_below_max_bytes(tmp_path: Path) -> None:
    batch = load_config(write(tmp_path, GOOD), environ={"PGPASSWORD": "x"}).batch
    assert (batch.max_bytes, batch.busy_limit) == (8 * 2**20, 64 * 2**20)
    raised = GOOD.replace("max_bytes = 8388608", "max_bytes = 134217728")  # above the default busy_max_bytes
    assert load_config(write(tmp_path, raised), environ={"PGPASSWORD": "x"}).batch.busy_limit == 128 * 2**20
    both = GOOD.replace("max_bytes = 8388608", "max_bytes = 8388608\nbusy_max_bytes = 1048576")
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, both), environ={"PGPASSWORD": "x"})
    assert "batch: busy_max_bytes (1048576) is below max_bytes (8388608)" in err.value.message


def test_messages_about_secret_keys_survive_log_redaction(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as unset:
        load_config(write(tmp_path, GOOD), environ={})
    path = write(tmp_path, GOOD.replace('password = "${PGPASSWORD}"', "password = 5"))
    with pytest.raises(ConfigError) as invalid:
        load_config(path)
    for error in (unset.value, invalid.value):
        assert redact_text(error.message) == error.message, error.message
        assert error.hint is None or redact_text(error.hint) == error.hint, error.hint
    assert "environment variable PGPASSWORD, used by source.password, is not set" in unset.value.message
    assert "source.password (secret): Input should be a valid string" in invalid.value.message
    # ... while real secrets in text are still masked
    assert "hunter2" not in redact_text("password: hunter2") and "hunter2" not in redact_text("PGPASSWORD=hunter2")


def test_logs_leave_out_keys_without_a_value(capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    configure_logging("json", "info")
    structlog.get_logger("t").error("no such table", hint=None, table="public.t", rows=0)
    line = json.loads(capsys.readouterr().err)
    assert "hint" not in line and line["table"] == "public.t" and line["rows"] == 0
    configure_logging("console", "info")
    structlog.get_logger("t").error("no such table", hint=None)
    assert "hint" not in capsys.readouterr().err


def test_logs_give_times_in_iso_8601(capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    when = datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
    configure_logging("json", "info")
    structlog.get_logger("t").warning("table errored", retry_at=when, day=when.date())
    line = json.loads(capsys.readouterr().err)
    assert (line["retry_at"], line["day"]) == ("2030-05-06T07:08:09+00:00", "2030-05-06")
    configure_logging("console", "info")
    structlog.get_logger("t").warning("table errored", retry_at=when)
    err = capsys.readouterr().err
    assert "retry_at=2030-05-06T07:08:09+00:00" in err and "datetime" not in err


def embedded_pipeline() -> Pipeline:
    config = PipelineConfig.model_validate(
        {"pipeline": {"id": 1, "publication": "pub"}, "source": {"host": "127.0.0.1", "password": "hunter2"}}
    )
    return Pipeline(config, MemoryStore(1), MemoryDestination())


def test_an_embedded_pipeline_logs_through_stdlib_logging_with_secrets_masked(
    caplog: pytest.LogCaptureFixture, restore_logging: None
) -> None:
    structlog.reset_defaults()  # a program that never configured structlog
    embedded_pipeline()
    with caplog.at_level(logging.INFO, logger="etl"):
        structlog.get_logger("etl.embedded").info("connecting", password="hunter2", dsn="postgresql://u:hunter2@h/db")
    [record] = [r for r in caplog.records if r.name == "etl.embedded"]
    assert record.getMessage() == "event=connecting password=********** dsn=postgresql://u:**********@h/db"


def test_an_embedding_programs_own_structlog_configuration_is_kept(restore_logging: None) -> None:
    structlog.reset_defaults()
    mine = [structlog.processors.KeyValueRenderer()]
    structlog.configure(processors=mine)
    embedded_pipeline()
    assert structlog.get_config()["processors"] == mine
