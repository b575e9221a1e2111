"""The product's modules import one way (docs/architecture.md's code map): no import circle between them.

Imports under ``if TYPE_CHECKING:`` and inside functions count too: a circle that only the type checker or a late
import walks is still one the layering hides, and the next runtime import along it closes it.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(init.parent.name for init in ROOT.glob("*/src/*/__init__.py"))
"""The product's packages, one under each ``*/src/``: ``etl``, ``etl_spark`` and the stores'."""


def import_graph(*packages: str) -> grimp.ImportGraph:
    return grimp.build_graph(
        *packages, include_external_packages=False, exclude_type_checking_imports=False, cache_dir=None
    )


def import_circles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """Each set of modules that import each other round (directly or through others), sorted: a module is in a
    circle with every module that both imports it and is imported by it."""
    circles = set()
    for module in graph.modules:
        around = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        if around:
            circles.add(tuple(sorted({module, *around})))
    return sorted(circles)


def one_round(graph: grimp.ImportGraph, circle: tuple[str, ...]) -> str:
    """A shortest way round ``circle`` from its first module, as ``module:line -> ...``: the line of each module that
    imports the next."""
    start = circle[0]
    chains = (
        graph.find_shortest_chain(importer=m, imported=start) for m in graph.find_modules_directly_imported_by(start)
    )
    path = [start, *min((c for c in chains if c), key=len)]
    steps = []
    for importer, imported in pairwise(path):
        lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
        steps.append(f"{importer}:{lines[0]}" if lines else importer)
    return " -> ".join([*steps, start])


def test_the_products_modules_import_in_no_circle() -> None:
    assert {"etl", "etl_spark", "etl_store_sqlite", "etl_store_postgres"} <= set(PACKAGES)
    graph = import_graph(*PACKAGES)
    circles = import_circles(graph)
    assert not circles, "import circles (each module:line imports the next):\n" + "\n".join(
        f"{', '.join(circle)}\n    {one_round(graph, circle)}" for circle in circles
    )


def test_a_circle_through_a_type_checking_import_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a circle closed only under ``TYPE_CHECKING`` is found, and the modules outside it are not
    named."""
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from circled.high import High\n"
    )
    (package / "middle.py").write_text("from circled import low\n")
    (package / "high.py").write_text("from circled import middle\n\nclass High: ...\n")
    (package / "top.py").write_text("from circled import high\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = import_graph("circled")
    assert import_circles(graph) == [("circled.high", "circled.low", "circled.middle")]
    assert one_round(graph, ("circled.high", "circled.low", "circled.middle")) == (
        "circled.high:1 -> circled.middle:1 -> circled.low:4 -> circled.high"
    )
