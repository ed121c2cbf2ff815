"""The call pools of ``GRPCInferenceService`` and the table of which RPC takes a slot of which.

Every call's capacity is bounded before its message is read, and probes share none of it
(``RPC_RULES``): ModelInfer calls take a slot of the inference pool (this worker's share of
TENSORBITS_MAX_INFLIGHT_REQUESTS), ModelStreamInfer streams one of a stream pool of the same
size, the other RPCs but the probes one of a small control pool, and each holds it until its
answer (a stream: until its end); past any, UNAVAILABLE at once. ServerLive, ServerReady and
ModelReady take no slot: a flood of stalled or oversized calls cannot make a liveness probe
fail. Every RPC but ModelInfer and ModelStreamInfer takes a message of at most
``SMALL_MESSAGE_BYTES`` (protobuf parses it on the event loop).

Kept apart from the RPCs' bodies (``service.py``) and the stream (``streams.py``), which both
take their slots here: the rules are one table, read in one place, and the server
(``server.py``) reads it too, to register each RPC as unary or streaming.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import NamedTuple

from tensorbits.config import Settings
from tensorbits_protocol.errors import Overloaded

# The largest message of every RPC but ModelInfer: names, keys, a 64-byte CUDA handle. Parsed on
# the event loop, so bounded well below what would hold it up.
SMALL_MESSAGE_BYTES = 64 << 10
# Calls of the control RPCs (metadata, configuration, statistics, repository, shared memory) in
# progress at once, stalled ones included.
CONTROL_SLOTS = 32


class Pool(enum.Enum):
    """Which capacity a call holds from its start to its answer."""

    NONE = "none"  # probes: never refused for capacity
    INFERENCE = "inference"  # this worker's share of TENSORBITS_MAX_INFLIGHT_REQUESTS
    # Open ModelStreamInfer streams: as many as the inference pool, apart from it, so that idle
    # streams (one message a minute keeps one open) never leave ModelInfer without a slot; each
    # message is admitted for its work like any request.
    STREAMS = "streams"
    CONTROL = "control"  # CONTROL_SLOTS


class RpcRule(NamedTuple):
    pool: Pool
    max_message_bytes: int | None  # None: TENSORBITS_MAX_BODY_BYTES, grpcio's bound
    streaming: bool = False  # a stream of requests and one of answers (``stream``), not unary


_PROBE = RpcRule(Pool.NONE, SMALL_MESSAGE_BYTES)
_CONTROL = RpcRule(Pool.CONTROL, SMALL_MESSAGE_BYTES)
# Every RPC of inference.proto's service: the capacity it holds and its message bound (the
# service checks the table is complete).
RPC_RULES: Mapping[str, RpcRule] = {
    "ServerLive": _PROBE,
    "ServerReady": _PROBE,
    "ModelReady": _PROBE,
    "ModelInfer": RpcRule(Pool.INFERENCE, None),
    # One slot for the stream's life, however many messages it carries (``stream``).
    "ModelStreamInfer": RpcRule(Pool.STREAMS, None, streaming=True),
    # A graph model's file comes with it: TENSORBITS_MAX_BODY_BYTES bounds it, as HTTP's body.
    "RepositoryModelLoad": RpcRule(Pool.CONTROL, None),
    **{
        rpc: _CONTROL
        for rpc in (
            "ServerMetadata", "ModelMetadata", "ModelConfig", "ModelStatistics",
            "RepositoryIndex", "RepositoryModelUnload",
            "SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
            "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus",
            "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
        )
    },
}  # fmt: skip


class Slots:
    """A pool of call slots: ``take`` or Overloaded at once (never a queue), ``give`` back."""

    __slots__ = ("capacity", "name", "setting", "taken")

    def __init__(self, capacity: int, name: str, setting: str) -> None:
        self.capacity = capacity
        self.name = name
        self.setting = setting
        self.taken = 0

    def take(self) -> None:
        # No await between the check and the increment: on one event loop this is atomic.
        if self.taken >= self.capacity:
            raise Overloaded(
                f"server busy: {self.taken} {self.name} calls in progress (limit "
                f"{self.capacity}, {self.setting}); retry later"
            )
        self.taken += 1

    def give(self) -> None:
        self.taken -= 1


def worker_pools(settings: Settings) -> dict[Pool, Slots]:
    """This worker's pools, each sized: every ``Pool`` but NONE, which probes hold."""
    inflight = "TENSORBITS_MAX_INFLIGHT_REQUESTS" + (
        f" shared by {settings.workers} workers" if settings.workers > 1 else ""
    )
    return {
        Pool.INFERENCE: Slots(settings.worker_inflight_requests, "ModelInfer", inflight),
        Pool.STREAMS: Slots(settings.worker_inflight_requests, "ModelStreamInfer", inflight),
        Pool.CONTROL: Slots(CONTROL_SLOTS, "metadata and control", "the server's"),
    }


__all__ = [
    "CONTROL_SLOTS",
    "RPC_RULES",
    "SMALL_MESSAGE_BYTES",
    "Pool",
    "RpcRule",
    "Slots",
    "worker_pools",
]
