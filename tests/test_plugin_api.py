"""The plugin API (``etl.api``, ``etl.api.sql``) is what docs/plugins.md lists, name for name, each loaded when
first used."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import etl.api
import etl.api.sql
import etl_spark.ducklake.catalog

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def test_the_guide_lists_every_name_of_the_api_and_no_other() -> None:
    section = GUIDE.read_text(encoding="utf-8").split("## The plugin API", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| ") and "names in" not in line)
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", table)) - {"etl", "api", "sql"}
    assert listed == {*etl.api.__all__, *etl.api.sql.__all__}


@pytest.mark.parametrize("module", [etl.api, etl_spark.ducklake.catalog], ids=lambda m: m.__name__)
def test_each_name_is_its_home_modules_own_and_the_type_checkers_see_the_same(module: ModuleType) -> None:
    """For the modules whose names load on first use (PEP 562): the plugin API, and the DuckLake catalog."""
    tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
    checked = next(n for n in tree.body if isinstance(n, ast.If))  # the `if TYPE_CHECKING:` block
    typed = {a.name: n.module for n in checked.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert typed == module._HOMES
    assert sorted(module.__all__) == sorted(typed) == dir(module)
    for name, home in typed.items():
        assert getattr(module, name) is getattr(importlib.import_module(str(home)), name)


def test_a_plugin_loads_only_the_modules_of_the_names_it_uses() -> None:
    """A store takes its names without pyarrow or the copy's libpq code: `etl status` and `etl check` start quick."""
    code = (
        "import sys; from etl.api import Check, StoreError, TableState; "
        "print(sorted(m for m in ('pyarrow', 'etl.postgres.copy', 'prometheus_client') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]"
