"""The repository's packages are released together: one version, in ``VERSION``, and each package's dependency on
another pinned to that release."""

from __future__ import annotations

import importlib.metadata as md
import re
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from hatchling.builders.sdist import SdistBuilder
from hatchling.builders.wheel import WheelBuilder

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


def _wheel_licenses(root: Path, directory: Path) -> dict[str, bytes]:
    wheel = next(WheelBuilder(str(root)).build(directory=str(directory)))
    with zipfile.ZipFile(wheel) as archive:
        return {n.split(".dist-info/")[1]: archive.read(n) for n in archive.namelist() if ".dist-info/licenses/" in n}


@pytest.mark.parametrize("package", PACKAGES)
def test_the_wheel_and_the_sdist_carry_the_license(package: str, tmp_path: Path) -> None:
    """The wheel and the sdist hold the repository's LICENSE, the sdist as one plain file, so that a wheel built
    from the unpacked sdist holds it too."""
    license_text = (ROOT / "LICENSE").read_bytes()
    assert _wheel_licenses(ROOT / package, tmp_path / "wheel") == {"licenses/LICENSE": license_text}
    sdist = next(SdistBuilder(str(ROOT / package)).build(directory=str(tmp_path / "sdist")))
    with tarfile.open(sdist) as archive:
        top = archive.getmembers()[0].name.split("/")[0]
        licenses = [m for m in archive.getmembers() if m.name == f"{top}/LICENSE"]
        assert [m.isfile() for m in licenses] == [True], "the sdist must hold LICENSE once, as a file, not a link"
        assert archive.extractfile(licenses[0]).read() == license_text
        archive.extractall(tmp_path / "unpacked", filter="data")
    assert _wheel_licenses(tmp_path / "unpacked" / top, tmp_path / "from-sdist") == {"licenses/LICENSE": license_text}


def test_the_plugin_template_depends_on_the_release() -> None:
    questions = yaml.safe_load((ROOT / "plugins-template" / "copier.yml").read_text(encoding="utf-8"))
    assert questions["etl_version"]["default"] == VERSION
