"""The plugin template (``plugins-template/``, a copier template) renders a plugin project that installs, passes
its own tests (etl's destination and store contract suites) and registers its plugins with etl."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import copier

TEMPLATE = Path(__file__).resolve().parents[1] / "plugins-template"


def test_a_rendered_plugin_installs_passes_its_tests_and_registers(tmp_path: Path) -> None:
    project = tmp_path / "etl-acme"
    copier.run_copy(
        str(TEMPLATE),
        project,
        data={"project_name": "etl-acme", "destination_name": "acme_files", "store_name": "acme_json"},
        defaults=True,
        quiet=True,
    )
    assert (project / "src" / "etl_acme" / "destination.py").is_file()

    # A fresh virtualenv that sees this one's packages (etl-core, pytest) and gets the rendered project installed.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    parents = dict.fromkeys(sysconfig.get_path(kind) for kind in ("purelib", "platlib"))
    lines = "".join(f"import site; site.addsitedir({parent!r})\n" for parent in parents)
    (Path(site_packages) / "_parent_env.pth").write_text(lines)
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps"]
    subprocess.run([*install, "--no-build-isolation", str(project)], check=True, timeout=300)

    tests = subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
        check=False,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert " passed" in tests.stdout and "skipped" not in tests.stdout

    # Its own import contract: etl's plugin API only (etl.api, etl.testing), as its pyproject.toml declares.
    contract = [python, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"]
    kept = subprocess.run(contract, check=False, cwd=project, capture_output=True, text=True, timeout=120)
    assert kept.returncode == 0 and "1 kept, 0 broken" in kept.stdout, kept.stdout + kept.stderr
    # a module that reaches into the engine, in the installed package (what the contract analyses)
    (Path(site_packages) / "etl_acme" / "internal.py").write_text("from etl.pipeline import Pipeline\n")
    broken = subprocess.run(contract, check=False, cwd=project, capture_output=True, text=True, timeout=120)
    assert broken.returncode == 1 and "etl_acme.internal -> etl.pipeline" in broken.stdout, broken.stdout

    listed = subprocess.run(
        [python, "-c", "import sys; from etl.cli import main; sys.exit(main())", "plugins"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "acme_files" in listed.stdout and "acme_json" in listed.stdout
    assert "etl-acme" in listed.stdout
