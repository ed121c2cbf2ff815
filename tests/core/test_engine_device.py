"""A /v1 batch on a device backend allocates every buffer on the backend's device, never on the
calling thread's current one. CUDA's current device is per thread and a server's worker threads
start on device 0, so an allocation made outside the backend's context would land on device 0
whatever device the backend runs on. Here a backend "on device 1" over NumPy records the device
current at each allocation and refuses a fill run on another device; its results must equal
the NumPy backend's, byte for byte."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from support.v1 import rich_batch, run_planned

from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits_protocol.validation import ResolvedCall

DEVICE = 1
_threads = threading.local()
allocations: list[int] = []  # the device current at each allocation


def current() -> int:
    device: int = getattr(_threads, "device", 0)
    return device


@contextlib.contextmanager
def on(device: int) -> Iterator[None]:
    before, _threads.device = current(), device
    try:
        yield
    finally:
        _threads.device = before


class OnDevice(np.ndarray[Any, Any]):
    """An array of the stand-in device: ``device`` is its context, as a CuPy array's is."""

    made_on: int

    def __array_finalize__(self, obj: Any) -> None:
        self.made_on = getattr(obj, "made_on", current())

    @property
    def device(self) -> Any:
        return on(self.made_on)

    def fill(self, value: Any) -> None:
        assert current() == self.made_on, "filled under another device"
        super().fill(value)


def made(array: np.ndarray[Any, Any]) -> OnDevice:
    allocations.append(current())
    return array.view(OnDevice)


class _XP:
    """NumPy, recording where each array it makes is made."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def zeros(self, *args: Any, **kwargs: Any) -> OnDevice:
        return made(np.zeros(*args, **kwargs))

    def empty(self, *args: Any, **kwargs: Any) -> OnDevice:
        return made(np.empty(*args, **kwargs))


class DeviceOne:
    """A device backend on device 1 (NumPy underneath): every method enters its device, as
    ``CupyBackend`` does."""

    name = "device-stand-in"
    host_memory = False
    device = f"stand-in:{DEVICE}"
    device_memory = None

    def __init__(self) -> None:
        self.xp = _XP()
        self.numpy = NumpyBackend(1)

    def asarray(self, host: np.ndarray[Any, Any]) -> OnDevice:
        with on(DEVICE):
            return made(np.array(host))

    def to_host(self, array: Any, out: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:
        host = np.asarray(array).view(np.ndarray)
        if out is None:
            return host.copy()
        np.copyto(out, host)
        return out

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> OnDevice:
        with on(DEVICE):
            return made(np.empty(shape, dtype))

    def run(self, call: ResolvedCall, inputs: Sequence[Any], out: Any) -> None:
        with on(DEVICE):
            self.numpy.run(call, inputs, out)

    def synchronize(self) -> None:
        pass

    def memory_in_use(self) -> int | None:
        return None

    def close(self) -> None:
        self.numpy.close()


def test_batch_buffers_are_made_on_the_backends_device() -> None:
    for seed in range(3):
        header, payload = rich_batch(np.random.default_rng(seed))
        allocations.clear()
        got = run_planned(header, payload, DeviceOne())
        assert got == run_planned(header, payload, NumpyBackend(1))
        assert allocations, "the batch allocated nothing on the backend"
        assert set(allocations) == {DEVICE}, allocations
