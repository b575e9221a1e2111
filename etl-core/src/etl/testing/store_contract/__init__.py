"""The store contract: tests every store must pass, for built-in and third-party stores alike.

Subclass the contract your store meets, name your store class and give one fixture, its config:

- ``StoreContract``: every store;
- ``DurableStoreContract``: the state outlives the process and a pipeline lock guards it;
- ``ConcurrentStoreContract``: durable, and several open instances of one pipeline write to the
  storage without undoing each other's writes (stores that write row by row, like the SQL stores).

::

    from etl.testing.store_contract import DurableStoreContract

    class TestMyStore(DurableStoreContract):
        store_class = MyStore

        @pytest.fixture
        def store_config(self, tmp_path):
            return {"path": str(tmp_path / "state")}

The tests open stores the way ``etl run`` does (``Config`` then ``from_config``) through the
``make_store(pipeline_id=1)`` factory fixture; every store it opens with the same config shares the
same backing storage, and all are closed after the test. The lock test starts a real subprocess that
builds the store from the same config (passed as JSON on stdin), so the config must be
JSON-serialisable.
"""

from etl.testing.store_contract.durable import ConcurrentStoreContract, DurableStoreContract
from etl.testing.store_contract.every_store import StoreContract
from etl.testing.store_contract.samples import MakeStore

__all__ = ["ConcurrentStoreContract", "DurableStoreContract", "MakeStore", "StoreContract"]
