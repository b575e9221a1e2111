"""What every worker of one pipeline shares."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from etl.config import PipelineConfig
from etl.destination.base import Destination
from etl.replication.schemas import SchemaTracker
from etl.replication.states import TableStates
from etl.store.base import Store


@dataclass
class WorkerContext:
    config: PipelineConfig
    store: Store
    destination: Destination
    states: TableStates
    schemas: SchemaTracker
    protocol_version: int
    streaming: bool
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def pipeline_id(self) -> int:
        return self.config.pipeline.id

    @property
    def publication(self) -> str:
        return self.config.pipeline.publication
