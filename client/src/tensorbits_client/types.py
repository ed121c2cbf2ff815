"""Public value types of the client: results, batch handles, shared-memory regions and the
parameter literals."""

from __future__ import annotations

from tensorbits_client._batch import Batch, Binding, Buffer
from tensorbits_client._codec import InferResult
from tensorbits_client._families import (
    DML,
    ONNX,
    AutoBroadcast,
    CountType,
    Direction,
    FeatureLevel,
    OpenVINO,
)
from tensorbits_client._shared_memory import AsyncSharedMemoryRegion, SharedMemoryRegion
from tensorbits_client._types import NOT_GIVEN, Array, Inputs, NotGiven, Parameters, TimeoutTypes
from tensorbits_protocol.dml import TensorDesc
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.v2 import (
    ModelConfigResponse,
    ModelStatisticsResponse,
    RepositoryIndexEntry,
)

__all__ = [
    "DML",
    "NOT_GIVEN",
    "ONNX",
    "Array",
    "AsyncSharedMemoryRegion",
    "AutoBroadcast",
    "Batch",
    "Binding",
    "Buffer",
    "CountType",
    "DataType",
    "Direction",
    "FeatureLevel",
    "InferResult",
    "Inputs",
    "ModelConfigResponse",
    "ModelStatisticsResponse",
    "NotGiven",
    "OpenVINO",
    "Parameters",
    "RepositoryIndexEntry",
    "SharedMemoryRegion",
    "TensorDesc",
    "TimeoutTypes",
]
