"""etl-core's messages about a plugin's config section, for the plugins this project ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.checks import run_checks
from etl.config import load_config
from etl.errors import ConfigError
from etl.factory import validate_plugins

PIPELINE = """
[pipeline]
id = 1
publication = "pub"
[source]
host = "127.0.0.1"
port = 1
user = "postgres"
connect_timeout = 2
[destination]
type = "ducklake"
catalog = "sqlite:////tmp/catalog.sqlite"
data_path = "/tmp/lake/"
"""


def config_with(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(PIPELINE + line + "\n")
    return path


def test_an_unknown_key_like_no_other_lists_the_keys_of_its_section(tmp_path: Path) -> None:
    path = config_with(tmp_path, "zzz = 1")
    with pytest.raises(ConfigError) as err:
        validate_plugins(load_config(path), str(path))
    assert "destination.zzz: unknown key; the keys here are catalog, data_path, spark," in err.value.message


def test_check_points_a_destination_section_at_its_guide(tmp_path: Path) -> None:
    """A mistyped key says what was meant, and the fix names the destination's own guide."""
    path = config_with(tmp_path, "catalgo = 'x'")
    (destination,) = [c for c in run_checks(load_config(path), str(path)) if c.name == "destination"]
    assert 'destination.catalgo: unknown key; did you mean "catalog"?' in destination.detail
    assert destination.fix == "fix the section, see docs/destinations/ducklake.md"
