"""The third-party store example of docs/stores.md, run through the durable store contract.

The example is taken from the document itself, so the published code is the tested code.
"""

from __future__ import annotations

import atexit
import importlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from etl.errors import StoreError
from etl.lsn import Lsn
from etl.store.base import APPLY_WORKER, TableState, TableStateKind
from etl.testing.store_contract import DurableStoreContract

DOCS = Path(__file__).resolve().parents[2] / "docs" / "stores.md"
MODULE = "etl_docs_example_json_dir_store"


def _example_source() -> str:
    found = re.search(r"<!-- example-store: json_dir_store\.py -->\n```python\n(.*?)```", DOCS.read_text(), re.S)
    assert found, f"{DOCS} lost its example store block"
    return found.group(1)


# The lock test imports the store class in a subprocess by module name, so the example becomes a module file.
_MODULE_DIR = tempfile.mkdtemp(prefix="etl-docs-example-")
atexit.register(shutil.rmtree, _MODULE_DIR, True)
Path(_MODULE_DIR, f"{MODULE}.py").write_text(_example_source())
sys.path.insert(0, _MODULE_DIR)
JsonDirStore: Any = importlib.import_module(MODULE).JsonDirStore


@pytest.fixture(autouse=True)
def _importable_in_subprocesses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (_MODULE_DIR, os.environ.get("PYTHONPATH")) if p))


class TestJsonDirStore(DurableStoreContract):
    store_class = JsonDirStore

    @pytest.fixture
    def store_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"directory": str(tmp_path)}


def test_failed_save_changes_nothing(tmp_path: Path) -> None:
    store = JsonDirStore(tmp_path, 1)
    store.update_table_states({1: TableState(TableStateKind.DATA_SYNC)})
    store.upsert_progress(APPLY_WORKER, Lsn(5))
    blocker = store.file.with_name(store.file.name + ".tmp")
    blocker.mkdir()  # the temporary file cannot be written
    with pytest.raises(StoreError, match="saving the state failed"):
        store.upsert_progress(APPLY_WORKER, Lsn(9))
    with pytest.raises(StoreError, match="saving the state failed"):
        store.reset_tables_for_resync()
    assert store.get_progress(APPLY_WORKER) == 5
    assert store.get_table_states() == {1: TableState(TableStateKind.DATA_SYNC)}
    with pytest.raises(StoreError, match="no previous state"):
        store.rollback_table_state(1)
    blocker.rmdir()
    assert store.upsert_progress(APPLY_WORKER, Lsn(9)) == 9
    assert JsonDirStore(tmp_path, 1).get_progress(APPLY_WORKER) == 9


def test_document_of_another_pipeline_is_refused(tmp_path: Path) -> None:
    JsonDirStore(tmp_path, 1).upsert_progress(APPLY_WORKER, Lsn(5))
    (tmp_path / "pipeline-1.json").rename(tmp_path / "pipeline-2.json")
    with pytest.raises(StoreError, match="cannot read"):
        JsonDirStore(tmp_path, 2)
