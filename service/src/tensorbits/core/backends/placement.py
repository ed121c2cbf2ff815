"""Placement: on a server with a CUDA device, where each piece of work computes, decided per
request by where its data lives and what the work is (``TENSORBITS_PLACEMENT``).

The rule (``choose``), as data:

- data in a CUDA region (device-borne) is computed on the device, whatever the setting: it
  never leaves the device, and the host cannot read it without copying it out and back;
- otherwise ``host`` or ``device`` forces the place;
- ``auto``: work of at least ``DEVICE_MIN_STEPS`` steps (a graph's nodes, a /v1 batch's
  dispatches) on the device, its intermediates staying there; one operator on host-borne data
  (the request's body or a system region) on the host, unless it moves at least
  ``OPERATOR_DEVICE_MIN_BYTES`` (no size, as measured).

``PlacedBackend`` is a CuPy server's backend under ``auto`` or ``host``: it owns the NumPy and
the CuPy backend and presents itself as a host backend (``host_memory``: the front ends write
results straight into their response buffers and stream system regions), so one operator runs
where its operands say (``run``: a CUDA region's device array among them sends it to the device,
as ``engine.run_into`` runs a device backend's call), and a graph or a batch asks for its whole
run's backend once (``placed``). ``device`` is the CuPy backend itself, as before placement.
Each decision is a debug record of ``tensorbits.placement`` with the fields ``placement``,
``work``, ``residence`` and ``bytes`` (and the request id, as every record)."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, get_args

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.engine import run_into
from tensorbits.core.kernels import DeviceArray
from tensorbits.core.shared_memory import DeviceMemory
from tensorbits_protocol.validation import ResolvedCall

PlacementSetting = Literal["auto", "host", "device"]
PLACEMENTS: tuple[str, ...] = get_args(PlacementSetting)

# One memory-bound operator on host-borne data goes to the device only from this many bytes
# (read and written); None: at no size. Measured on an H200 server, the CuPy backend against
# the NumPy backend, one element-wise operator on 64 MiB: over v2 binary HTTP 166.3 ms against
# 127.1 ms, through system shared memory 52.3 ms against 34.7 ms. Such an operator touches each
# byte once, so the copies to the device and back cost more than the host's whole kernel, and
# the host won at every size measured (the largest was 64 MiB). A streamed call (a system
# region's, core/run.py) reaches ``PlacedBackend.run`` a piece at a time: a size set here would
# be compared with a piece's, so setting one needs the request's size from its front end.
OPERATOR_DEVICE_MIN_BYTES: int | None = None
# Work of this many steps or more (graph nodes, batch dispatches) goes to the device under auto:
# its intermediates stay there (a fused graph is one kernel), so each byte crosses once in and
# once out however many steps read it, and the device's bandwidth pays for the crossing. One
# step is one operator: the operator's rule.
DEVICE_MIN_STEPS = 2

logger = logging.getLogger("tensorbits.placement")


class Place(StrEnum):
    HOST = "host"
    DEVICE = "device"


class Residence(StrEnum):
    """Where a request's tensors live, the farthest from the host of them."""

    BODY = "body"  # in the request and the response
    SYSTEM = "system"  # a system shared-memory region (host memory)
    CUDA = "cuda"  # a CUDA shared-memory region (the client's device memory)


class WorkKind(StrEnum):
    OPERATOR = "operator"
    GRAPH = "graph"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class Work:
    """What one request computes: its kind, where its data lives, the bytes it reads and
    writes, and its steps (graph nodes or batch dispatches; 1 for an operator)."""

    kind: WorkKind
    residence: Residence
    nbytes: int
    steps: int = 1


def choose(work: Work, setting: PlacementSetting) -> Place:
    """Where ``work`` computes under ``setting`` (the module's docstring says the rule)."""
    if work.residence is Residence.CUDA:
        return Place.DEVICE
    if setting != "auto":
        return Place(setting)
    if work.steps >= DEVICE_MIN_STEPS:
        return Place.DEVICE
    if OPERATOR_DEVICE_MIN_BYTES is not None and work.nbytes >= OPERATOR_DEVICE_MIN_BYTES:
        return Place.DEVICE
    return Place.HOST


def placed(backend: Backend, work: Work) -> Backend:
    """The backend ``work`` runs on as a whole: the one its placement chooses where ``backend``
    places work (``PlacedBackend``), else ``backend`` itself."""
    method: Callable[[Work], Backend] | None = getattr(backend, "backend_for", None)
    return backend if method is None else method(work)


def _on_device(array: Any) -> bool:
    return not isinstance(array, np.ndarray)


class PlacedBackend:
    """A CuPy server's backend under ``auto`` or ``host`` placement (see the module's
    docstring): ``host`` (NumPy) and ``device`` (CuPy) owned, each call or run placed."""

    host_memory = True  # presented as the host backend; device work is placed inside

    def __init__(self, host: Backend, device: Backend, setting: PlacementSetting) -> None:
        if setting == "device":
            raise ValueError("placement device is the device backend itself, not a placed one")
        self.host = host
        self.gpu = device
        self.setting = setting
        self.name = device.name
        self.device = device.device  # the selection's reason names the placement
        self.xp: Any = host.xp
        self.threads: int = getattr(host, "threads", 1)
        self.placements: Counter[tuple[WorkKind, Place]] = Counter()
        self._lock = threading.Lock()

    @property
    def device_memory(self) -> DeviceMemory | None:
        return self.gpu.device_memory

    def place(self, work: Work) -> Place:
        """Where ``work`` computes, counted and logged (debug) with the request in hand."""
        where = choose(work, self.setting)
        with self._lock:
            self.placements[(work.kind, where)] += 1
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "placed %s on the %s",
                work.kind.value,
                where.value,
                extra={
                    "placement": where.value,
                    "work": work.kind.value,
                    "residence": work.residence.value,
                    "bytes": work.nbytes,
                },
            )
        return where

    def counts(self) -> dict[tuple[str, str], int]:
        """The placements so far by (work kind, place), as the metrics show them
        (``tensorbits_placements_total``): a copy, taken under the lock ``place`` counts in."""
        with self._lock:
            return {(kind.value, where.value): n for (kind, where), n in self.placements.items()}

    def backend_for(self, work: Work) -> Backend:
        """The backend a graph's or a batch's whole run uses (``placed``)."""
        return self.gpu if self.place(work) is Place.DEVICE else self.host

    # --- one call: placed by its operands -------------------------------------------------------

    def run(self, call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray) -> None:
        operands = (*inputs, out)
        device_borne = any(_on_device(x) for x in operands)
        work = Work(
            WorkKind.OPERATOR,
            Residence.CUDA if device_borne else Residence.BODY,
            sum(int(x.nbytes) for x in operands),
        )
        if self.place(work) is Place.HOST:
            self.host.run(call, inputs, out)
            return
        # Host operands copied to the device, a host ``out`` written back from it, a device
        # ``out`` written in place and finished before this returns.
        run_into(self.gpu, call, inputs, out)

    # --- arrays: the host's, but a device array's own way back ----------------------------------

    def asarray(self, host: np.ndarray[Any, Any]) -> DeviceArray:
        return self.host.asarray(host)

    def to_host(
        self, array: DeviceArray, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        return (self.gpu if _on_device(array) else self.host).to_host(array, out)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> DeviceArray:
        return self.host.empty(shape, dtype)

    def share(self, tasks: Sequence[Callable[[], None]]) -> None:
        """The host backend's threads (a fused graph's ranges on the host)."""
        method = getattr(self.host, "share", None)
        if method is None:
            for task in tasks:
                task()
            return
        method(tasks)

    def synchronize(self) -> None:
        self.gpu.synchronize()

    def memory_in_use(self) -> int | None:
        return self.gpu.memory_in_use()

    def close(self) -> None:
        self.host.close()
        self.gpu.close()


__all__ = [
    "DEVICE_MIN_STEPS",
    "OPERATOR_DEVICE_MIN_BYTES",
    "PLACEMENTS",
    "Place",
    "PlacedBackend",
    "PlacementSetting",
    "Residence",
    "Work",
    "WorkKind",
    "choose",
    "placed",
]
