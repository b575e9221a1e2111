"""The plugin API (``etl.api``, ``etl.api.sql``) is what docs/plugins.md lists, name for name."""

from __future__ import annotations

import re
from pathlib import Path

import etl.api
import etl.api.sql

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def test_the_guide_lists_every_name_of_the_api_and_no_other() -> None:
    section = GUIDE.read_text(encoding="utf-8").split("## The plugin API", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| ") and "names in" not in line)
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", table)) - {"etl", "api", "sql"}
    assert listed == {*etl.api.__all__, *etl.api.sql.__all__}
