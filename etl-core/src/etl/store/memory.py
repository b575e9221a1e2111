"""The memory store: pipeline state that lives as long as the process.

For tests, examples and pipelines that may start over from scratch after every restart (a restart
copies every table again). It keeps no lock: its state cannot be shared with another process, so
resync requests reach only a pipeline of this process (``Pipeline.resync``), never ``etl resync``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from etl.config_validation import validate
from etl.schema import TableId
from etl.store.base import merged_request
from etl.store.cached import CachedStore


class MemoryStore(CachedStore):
    name: ClassVar[str] = "memory"

    class Config(BaseModel):
        """No options."""

        model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def from_config(cls, config: Config | Mapping[str, Any], pipeline_id: int) -> MemoryStore:
        if not isinstance(config, cls.Config):
            validate(cls.Config, config, "store", "store")
        return cls(pipeline_id)

    def __init__(self, pipeline_id: int) -> None:
        super().__init__(pipeline_id)
        self._resync_requests: dict[TableId, str | None] = {}

    def _persist_resync_request(self, table_id: TableId, where: str | None) -> None:
        self._resync_requests[table_id] = merged_request(self._resync_requests, table_id, where)

    def _take_resync_requests(self) -> dict[TableId, str | None]:
        taken, self._resync_requests = self._resync_requests, {}
        return taken
