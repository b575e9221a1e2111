"""The json_file store: etl's store contract suite, plus what is particular to one shared JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from etl.errors import StoreError
from etl.lsn import Lsn
from etl.store.base import APPLY_WORKER, TableState, TableStateKind
from etl.testing.store_contract import DurableStoreContract

from etl_plugin_example.json_file_store import JsonFileStore


class TestJsonFileStore(DurableStoreContract):
    store_class = JsonFileStore

    @pytest.fixture
    def store_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "state.json")}


def test_pipelines_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    one, two = JsonFileStore(path, 1), JsonFileStore(path, 2)
    one.upsert_progress(APPLY_WORKER, Lsn(10))
    two.upsert_progress(APPLY_WORKER, Lsn(20))  # saved after one's write: must keep it
    one.update_table_states({5: TableState(TableStateKind.READY)})  # and one keeps two's
    content = json.loads(path.read_text())
    assert sorted(content["pipelines"]) == ["1", "2"]
    assert JsonFileStore(path, 1).get_progress(APPLY_WORKER) == 10
    assert JsonFileStore(path, 2).get_progress(APPLY_WORKER) == 20
    assert list(tmp_path.glob("*.tmp")) == []


def test_failed_save_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    store = JsonFileStore(path, 1)
    store.upsert_progress(APPLY_WORKER, Lsn(5))
    path.with_name(f"{path.name}.write-lock").unlink()
    path.with_name(f"{path.name}.write-lock").mkdir()  # the save cannot take its lock
    with pytest.raises(StoreError, match="cannot open"):
        store.upsert_progress(APPLY_WORKER, Lsn(9))
    assert store.get_progress(APPLY_WORKER) == 5
    assert JsonFileStore(path, 1).get_progress(APPLY_WORKER) == 5


def test_unreadable_file_is_refused_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"something": "else"}')
    with pytest.raises(StoreError, match="not a state file") as caught:
        JsonFileStore(path, 1)
    assert caught.value.hint and "restore" in caught.value.hint


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    store = JsonFileStore(tmp_path / "absent" / "state.json", 1)
    with pytest.raises(StoreError, match="directory of `path` must exist"):
        store.upsert_progress(APPLY_WORKER, Lsn(1))
