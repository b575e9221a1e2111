from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from etl.errors import PluginError
from etl.plugins import load_registry


def make_distribution(root: Path, name: str, module: str, source: str, entry_name: str) -> None:
    """A throwaway installed distribution: a module and its .dist-info with an ``etl`` entry point."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[etl]\n{entry_name} = {module}\n")


GOOD_PLUGIN = """
from etl.plugins import hookimpl
from etl.destination.memory import MemoryDestination

class EchoDestination(MemoryDestination):
    name = "echo"

@hookimpl
def etl_destinations():
    return [EchoDestination]
"""


def run_etl(*args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "etl.cli", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_plugins_lists_core_memory_plugins() -> None:
    result = run_etl("plugins")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.split()[:3] == ["memory", "destination", "etl-core"] for line in lines), result.stdout
    assert any(line.split()[:3] == ["memory", "store", "etl-core"] for line in lines), result.stdout


def test_broken_plugin_is_reported_and_hides_nothing(tmp_path: Path) -> None:
    make_distribution(tmp_path, "broken-plugin", "broken_etl_plugin", "raise ImportError('no module named zz')\n", "b")
    make_distribution(tmp_path, "echo-plugin", "echo_etl_plugin", GOOD_PLUGIN, "echo")
    result = run_etl("plugins", path=tmp_path)
    assert result.returncode == 1
    assert "broken-plugin" in result.stdout and "no module named zz" in result.stdout
    names = {tuple(line.split()[:3]) for line in result.stdout.splitlines()}
    assert ("echo", "destination", "echo-plugin") in names
    assert ("memory", "destination", "etl-core") in names
    assert ("memory", "store", "etl-core") in names


def test_two_plugins_claiming_one_name_is_an_error_naming_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_distribution(tmp_path, "echo-one", "echo_one_plugin", GOOD_PLUGIN, "one")
    make_distribution(tmp_path, "echo-two", "echo_two_plugin", GOOD_PLUGIN, "two")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as err:
        load_registry()
    assert "echo-one" in str(err.value) and "echo-two" in str(err.value) and "'echo'" in str(err.value)


def test_version_flag() -> None:
    result = run_etl("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("etl 0.")


MISSPELT_PLUGIN = GOOD_PLUGIN.replace("def etl_destinations", "def etl_destination")


def test_a_misspelt_hook_makes_its_plugin_broken_naming_the_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_distribution(tmp_path, "misspelt-plugin", "misspelt_etl_plugin", MISSPELT_PLUGIN, "misspelt")
    make_distribution(tmp_path, "echo-plugin", "echo_etl_plugin", GOOD_PLUGIN, "zz_echo")  # loads after it
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = load_registry()
    [broken] = registry.broken
    assert broken.distribution == "misspelt-plugin"
    assert "unknown hook etl_destination" in broken.error and "etl_destinations" in broken.error
    assert "echo" in registry.destinations and "memory" in registry.stores


def test_a_module_implementing_no_hook_is_a_broken_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unmarked = GOOD_PLUGIN.replace("@hookimpl\n", "")
    make_distribution(tmp_path, "unmarked-plugin", "unmarked_etl_plugin", unmarked, "unmarked")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = load_registry()
    [broken] = registry.broken
    assert broken.distribution == "unmarked-plugin" and "implements none of etl's hooks" in broken.error
    assert "echo" not in registry.destinations


def test_a_failing_hook_is_its_own_plugins_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = GOOD_PLUGIN.replace("return [EchoDestination]", "raise RuntimeError('no destinations today')")
    make_distribution(tmp_path, "failing-plugin", "failing_etl_plugin", failing, "failing")
    other = GOOD_PLUGIN.replace('name = "echo"', 'name = "echo2"')
    make_distribution(tmp_path, "echo2-plugin", "echo2_etl_plugin", other, "zz_echo2")  # loads after it
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = load_registry()
    [broken] = registry.broken
    assert broken.distribution == "failing-plugin" and "no destinations today" in broken.error
    assert "echo2" in registry.destinations


@pytest.mark.parametrize("body", ["return None", "pass"])
def test_a_hook_returning_nothing_is_a_broken_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str
) -> None:
    module = f"silent_{body.replace(' ', '_').lower()}_etl_plugin"
    make_distribution(tmp_path, "silent-plugin", module, GOOD_PLUGIN.replace("return [EchoDestination]", body), "s")
    monkeypatch.syspath_prepend(str(tmp_path))
    [broken] = load_registry().broken
    assert broken.distribution == "silent-plugin" and "etl_destinations hook returned nothing" in broken.error
