"""The README's install lines, run as a new user would from a clone: wheels from ``./dev wheels``, a fresh
virtualenv, ``etl-core`` alone, then the plugins, then a DuckLake pipeline (``etl demo``) with what they
installed."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pip installs pyspark and duckdb into a fresh virtualenv; see docs/testing.md

ROOT = Path(__file__).resolve().parents[1]
VERSION = (ROOT / "VERSION").read_text(encoding="utf-8").strip()


def readme_install_lines() -> list[list[str]]:
    """The ``pip install`` lines of the README's Installing section, as argument lists."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Installing", 1)[1].split("\n## ", 1)[0]
    lines = re.findall(r"^pip install (.+?)\s+#", section, re.MULTILINE)
    return [[arg.strip('"') for arg in line.split()] for line in lines]


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False, env=env or os.environ
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def plugins(venv: Path, cwd: Path) -> set[tuple[str, str]]:
    listed = run(venv / "bin" / "etl", "plugins", cwd=cwd).splitlines()[1:]
    return {(line.split()[0], line.split()[1]) for line in listed}


def test_the_readme_install_lines_give_a_working_etl_and_a_ducklake_pipeline(tmp_path: Path) -> None:
    installs = readme_install_lines()
    assert [line[-1] for line in installs] == ["etl-core", "etl-store-sqlite", "etl-spark[duckdb]"]
    run(ROOT / "dev", "wheels", tmp_path / "wheelhouse", cwd=ROOT)
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check", "--quiet"]

    def install(line: list[str]) -> None:  # the README's lines, with the wheelhouse the test built
        run(*pip, "install", *[tmp_path / a if a == "wheelhouse" else a for a in line], cwd=tmp_path)

    core, *with_plugins = installs
    install(core)
    assert run(venv / "bin" / "etl", "--version", cwd=tmp_path).strip() == f"etl {VERSION}"
    assert plugins(venv, tmp_path) == {("memory", "destination"), ("null", "destination"), ("memory", "store")}

    for line in with_plugins:
        install(line)
    assert {("ducklake", "destination"), ("bigquery", "destination"), ("sqlite", "store")} <= plugins(venv, tmp_path)

    # Spark's class archive for this virtualenv's jars goes with the test's files, not into the user's cache
    demo_env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    try:
        shown = run(
            venv / "bin" / "etl", "demo", "--rows", "20", "--dir", tmp_path / "demo", cwd=tmp_path, env=demo_env
        )
    finally:
        stop_processes_with(f"XDG_CACHE_HOME={demo_env['XDG_CACHE_HOME']}")
    assert "public.orders: 20 rows as DuckDB" in shown and "(same as the source's 20)" in shown, shown


def stop_processes_with(variable: str) -> None:
    """SIGKILL the process groups of the processes whose environment holds ``variable``: the class-archive build
    that ``etl demo`` began in the background for the throwaway virtualenv (its Python and JVM would run on after
    the test, for an archive no one uses)."""
    wanted, ours = variable.encode(), os.getpgid(0)
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):  # gone, or not ours to read
            if entry.name.isdigit() and wanted in (entry / "environ").read_bytes().split(b"\0"):
                group = os.getpgid(int(entry.name))
                if group != ours:  # a child of the demo's own, exiting with it: not the test's whole group
                    os.killpg(group, signal.SIGKILL)
