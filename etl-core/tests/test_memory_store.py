"""The memory store: the store contract, plus what is particular to it."""

from __future__ import annotations

from typing import Any

import pytest

from etl.errors import ConfigError, StoreError
from etl.lsn import Lsn
from etl.plugins import load_registry
from etl.store.base import TableState, TableStateKind
from etl.store.cached import STATE_HISTORY_LIMIT
from etl.store.memory import MemoryStore
from etl.testing.store_contract import StoreContract


class TestMemoryStoreContract(StoreContract):
    store_class = MemoryStore

    @pytest.fixture
    def store_config(self) -> dict[str, Any]:
        return {}


def test_registered_as_the_memory_store() -> None:
    assert load_registry().store("memory") is MemoryStore


def test_from_config_validates_a_mapping() -> None:
    assert MemoryStore.from_config({}, 3).pipeline_id == 3
    with pytest.raises(ConfigError, match=r"store\.path: unknown key"):
        MemoryStore.from_config({"path": "x"}, 3)


def test_instances_do_not_share_state() -> None:
    first, second = MemoryStore(1), MemoryStore(1)
    first.update_table_states({1: TableState.init()})
    second.acquire_lock()  # nothing to exclude: the state cannot be shared with another process
    assert second.get_table_states() == {}


def test_history_keeps_the_newest_states_only() -> None:
    store = MemoryStore(1)
    for lsn in range(STATE_HISTORY_LIMIT + 5):
        store.update_table_states({1: TableState(TableStateKind.SYNC_DONE, Lsn(lsn))})
    rolled_back = [store.rollback_table_state(1) for _ in range(STATE_HISTORY_LIMIT - 1)]
    assert rolled_back[-1] == TableState(TableStateKind.SYNC_DONE, Lsn(5))
    with pytest.raises(StoreError, match="no previous state"):
        store.rollback_table_state(1)


def test_bad_pipeline_id_is_refused() -> None:
    with pytest.raises(ValueError, match="pipeline id"):
        MemoryStore(-1)
