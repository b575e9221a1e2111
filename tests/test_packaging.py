"""The repository's packages are released together: one version, in ``VERSION``, and each package's dependency on
another pinned to that release."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["etl-core", "etl-spark", "etl-store-sqlite", "etl-store-postgres"]
VERSION = (ROOT / "VERSION").read_text(encoding="utf-8").strip()


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_takes_its_version_from_the_one_file(package: str) -> None:
    project = tomllib.loads((ROOT / package / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert (ROOT / package / "VERSION").resolve() == ROOT / "VERSION"
    assert md.version(package) == VERSION  # as installed in this environment


@pytest.mark.parametrize("package", PACKAGES)
def test_dependencies_between_packages_are_pinned_to_the_release(package: str) -> None:
    project = tomllib.loads((ROOT / package / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project.get("optional-dependencies", {}).values()
    requirements = [*project["dependencies"], *(r for rs in extras for r in rs)]
    others = set(PACKAGES) - {package}  # an extra may name its own package, for its other extras
    internal = [r for r in requirements if re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0] in others]
    assert internal if package != "etl-core" else not internal
    assert all(r.endswith(f"=={VERSION}") for r in internal), internal


def test_the_plugin_template_depends_on_the_release() -> None:
    questions = yaml.safe_load((ROOT / "plugins-template" / "copier.yml").read_text(encoding="utf-8"))
    assert questions["etl_version"]["default"] == VERSION
