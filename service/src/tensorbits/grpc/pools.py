"""The call pools of ``GRPCInferenceService`` and the table of which RPC takes a slot of which.

Every call's capacity is bounded before its message is read, and probes share none of it
(``RPC_RULES``): ModelInfer calls take a slot of the inference pool (this worker's share of
TENSORBITS_MAX_INFLIGHT_REQUESTS), ModelStreamInfer streams one of a stream pool of the same
size, the other RPCs but the probes one of a small control pool, and each holds it until its
answer (a stream: until its end); past any, UNAVAILABLE at once. One connection holds at most
half of each pool (``connection_share``): a client holding calls open without sending them
leaves the others slots, for inferences as for RepositoryIndex or ModelConfig. ServerLive,
ServerReady and ModelReady take no slot: a flood of stalled or oversized calls cannot make a
liveness probe fail. Every RPC but ModelInfer and ModelStreamInfer takes a message of at most
``SMALL_MESSAGE_BYTES`` (protobuf parses it on the event loop).

Kept apart from the RPCs' bodies (``service.py``) and the stream (``streams.py``), which both
take their slots here: the rules are one table, read in one place, and the server
(``server.py``) reads it too, to register each RPC as unary or streaming.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import NamedTuple

from tensorbits.config.settings import Settings
from tensorbits_protocol.errors import Overloaded

# The largest message of every RPC but ModelInfer: names, keys, a 64-byte CUDA handle. Parsed on
# the event loop, so bounded well below what would hold it up.
SMALL_MESSAGE_BYTES = 64 << 10
# Calls of the control RPCs (metadata, configuration, statistics, repository, shared memory) in
# progress at once, stalled ones included.
CONTROL_SLOTS = 32
# How much of each pool one connection may hold (``connection_share``).
CONNECTION_SHARE_WORDS = "half the pool, rounded up"


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
    # A graph model's file comes with it: bounded by the load's bound as HTTP's load body is
    # (``load_bounds.max_load_bytes``, from TENSORBITS_MAX_MODEL_BYTES), checked on the message
    # before anything of it is read; grpcio's receive bound (None here) only caps it.
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
    """A pool of call slots: ``take`` or Overloaded at once (never a queue), ``give`` back.

    ``per_peer``: the most one connection (grpc's peer, its address and port) holds at once
    (None: no share, the pool is the bound), so that one client holding calls open without
    sending cannot take every slot from the others."""

    __slots__ = ("by_peer", "capacity", "name", "per_peer", "setting", "taken")

    def __init__(self, capacity: int, name: str, setting: str, per_peer: int | None = None) -> None:
        self.capacity = capacity
        self.name = name
        self.setting = setting
        self.per_peer = per_peer
        self.taken = 0
        # Slots held by each connection holding one: at most ``capacity`` entries.
        self.by_peer: dict[str, int] = {}

    def take(self, peer: str) -> None:
        # No await between the checks and the increments: on one event loop this is atomic.
        held = self.by_peer.get(peer, 0)
        if self.per_peer is not None and held >= self.per_peer:
            raise Overloaded(
                f"server busy: this connection has {held} {self.name} calls in progress, its "
                f"share of the {self.capacity} slots ({self.setting}; one connection holds at "
                f"most {CONNECTION_SHARE_WORDS}); retry later, or on another connection",
                field="peer",
                rule="connection_share",
            )
        if self.taken >= self.capacity:
            raise Overloaded(
                f"server busy: {self.taken} {self.name} calls in progress (limit "
                f"{self.capacity}, {self.setting}); retry later",
                field="rpc",
                rule=self.setting.removeprefix("TENSORBITS_").lower(),
            )
        self.taken += 1
        self.by_peer[peer] = held + 1

    def give(self, peer: str) -> None:
        self.taken -= 1
        held = self.by_peer.pop(peer) - 1
        if held:
            self.by_peer[peer] = held


def connection_share(capacity: int) -> int:
    """The slots of a pool of ``capacity`` one connection may hold: half, rounded up (a pool of
    one slot is its one connection's)."""
    return (capacity + 1) // 2


def worker_pools(settings: Settings) -> dict[Pool, Slots]:
    """This worker's pools, each sized: every ``Pool`` but NONE, which probes hold."""
    inflight = "TENSORBITS_MAX_INFLIGHT_REQUESTS" + (
        f" shared by {settings.workers} workers" if settings.workers > 1 else ""
    )
    inference = settings.worker_inflight_requests
    share = connection_share(inference)
    return {
        Pool.INFERENCE: Slots(inference, "ModelInfer", inflight, share),
        Pool.STREAMS: Slots(inference, "ModelStreamInfer", inflight, share),
        Pool.CONTROL: Slots(
            CONTROL_SLOTS, "metadata and control", "the server's", connection_share(CONTROL_SLOTS)
        ),
    }


__all__ = [
    "CONNECTION_SHARE_WORDS",
    "CONTROL_SLOTS",
    "RPC_RULES",
    "SMALL_MESSAGE_BYTES",
    "Pool",
    "RpcRule",
    "Slots",
    "connection_share",
    "worker_pools",
]
