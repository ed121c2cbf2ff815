"""The CuPy backend: arrays on a CUDA device, kernels compiled by NVRTC on first use, each
thread's copies and kernels on a stream of its own (``ThreadStreams``).

CuPy is imported lazily, only when this backend is constructed, and the constructor proves the
device works by running the shift and popcount kernels on a few values before it says yes.
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tensorbits.core.backends.base import BackendUnavailable
from tensorbits.core.backends.cupy_graphs import FusedChain, GraphKernels
from tensorbits.core.backends.cupy_wide import WideKernels
from tensorbits.core.backends.pieces import run_pieces
from tensorbits.core.backends.pinned_pool import DEFAULT_POOL_BYTES, PinnedPool, install
from tensorbits.core.cuda_ipc import CupyDeviceMemory
from tensorbits.core.kernels import BitOps, DeviceArray, as_kernel_operands, run_kernel
from tensorbits.core.shared_memory import DeviceMemory
from tensorbits_protocol.operators import Function
from tensorbits_protocol.validation import ResolvedCall

logger = logging.getLogger("tensorbits.backend")

# The kernel bodies (public: scripts/gpu_probe.py compiles them in the GPU images, no device).
# CUDA's native << and >> are undefined past the width; these enforce docs/semantics.md rule 3.
# The count is compared as unsigned 64-bit: a negative signed count becomes huge, so one test
# covers "negative or at least the width".
SHIFT_BODY = """
const unsigned long long width = sizeof(T) * 8;
const bool is_signed = ((T)-1) < ((T)0);
if ((unsigned long long)y >= width) {
    z = (LEFT || !(is_signed && x < (T)0)) ? (T)0 : (T)-1;
} else if (LEFT) {
    z = (T)((unsigned long long)x << (unsigned long long)y);
} else {
    z = (T)(x >> y);
}
"""
POPCOUNT_BODY = """
z = (O)(sizeof(T) == 8 ? __popcll((unsigned long long)x) : __popc((unsigned int)x));
"""


def _device_memory(cupy: Any, device_id: int) -> CupyDeviceMemory | None:
    """CUDA IPC for CUDA shared memory, or None (refused then) where the driver library cannot
    be loaded by name; CuPy itself found it, so that is a broken install, said in the log."""
    try:
        return CupyDeviceMemory(cupy, device_id)
    except OSError as exc:
        logger.warning("CUDA shared memory is off: %s", exc)
        return None


# How many CUDA streams the backend launches on, handed to threads in turn (``ThreadStreams``):
# as many as the server runs at once at most (the event loop and anyio's 40 worker threads), so
# that no two running requests share one, and few enough that CuPy's memory pool, which keeps the
# blocks freed on each stream for that stream alone, does not cache for streams of threads long
# gone.
STREAMS = 48


class ThreadStreams:
    """A CUDA stream for each thread that launches, so that requests on two threads overlap on
    the device instead of queuing on the legacy default stream (which orders every launch of the
    process after the one before it), and each run waits for its own work alone.

    A thread's stream is given on its first launch (``current``; ``STREAMS`` of them, in turn)
    and made the thread's current stream (CuPy's is per thread), for good: every copy and kernel
    the thread issues through CuPy from then on, the backend's and any other of the request it
    runs, is ordered on it. The streams block with respect to the legacy stream
    (``non_blocking=False``): anything a library still issues there waits for them, and they for
    it, so nothing is left unordered; they overlap one another."""

    def __init__(self, cupy: Any, count: int = STREAMS) -> None:
        self._cupy = cupy
        self._streams: list[Any] = []  # made as threads first ask, up to ``count``
        self._count = count
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._thread = threading.local()

    def current(self) -> Any:
        """The calling thread's stream, its current stream from now on (with the device the
        caller has entered: a stream belongs to the device it was made on)."""
        stream = getattr(self._thread, "stream", None)
        if stream is None:
            stream = self._thread.stream = self._next()
        stream.use()  # cheap (a thread-local); again each time, in case a library changed it
        return stream

    def _next(self) -> Any:
        with self._lock:
            turn = next(self._turn) % self._count
            if turn == len(self._streams):
                self._streams.append(self._cupy.cuda.Stream(non_blocking=False))
            return self._streams[turn]

    def synchronize(self) -> None:
        """Wait for the work the calling thread launched (and only its stream's)."""
        self.current().synchronize()


class CupyPieces:
    """``pieces.PieceDevice`` on CuPy: each thread's three non-blocking streams (made on its
    first call in pieces and kept, as ``ThreadStreams`` keeps its stream: bounded by the
    server's threads), CUDA events, asynchronous copies between pinned staging from the
    backend's pool and device buffers, and the backend's kernels launched on a given stream."""

    def __init__(self, backend: CupyBackend) -> None:
        self._backend = backend
        self._cupy = backend.xp
        self._thread = threading.local()

    def streams(self) -> tuple[Any, Any, Any]:
        made: tuple[Any, Any, Any] | None = getattr(self._thread, "streams", None)
        if made is None:
            cuda = self._cupy.cuda
            made = self._thread.streams = (
                cuda.Stream(non_blocking=True),
                cuda.Stream(non_blocking=True),
                cuda.Stream(non_blocking=True),
            )
        return made

    def record(self, stream: Any) -> Any:
        event = self._cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream if stream is not None else self._backend.streams.current())
        return event

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def host_wait(self, event: Any) -> None:
        event.synchronize()

    def staging(self, nbytes: int) -> np.ndarray[Any, Any] | None:
        runtime = self._cupy.cuda.runtime
        try:
            pointer = self._backend.pinned.malloc(nbytes)
        except runtime.CUDARuntimeError as exc:
            if exc.status != runtime.errorMemoryAllocation:
                raise
            return None
        # The array holds the pointer, and the pointer the pool's lease, until it is dropped.
        return np.frombuffer(pointer, np.uint8, nbytes)

    def release(self, staging: np.ndarray[Any, Any]) -> None:
        """Nothing: the pool has its buffer back once the array's last reference goes."""

    def empty(self, nbytes: int) -> Any:
        return self._cupy.empty((nbytes,), np.uint8)

    def upload(self, stream: Any, device: Any, host: np.ndarray[Any, Any]) -> None:
        device.data.copy_from_host_async(ctypes.c_void_p(host.ctypes.data), host.nbytes, stream)

    def download(self, stream: Any, host: np.ndarray[Any, Any], device: Any) -> None:
        device.data.copy_to_host_async(ctypes.c_void_p(host.ctypes.data), host.nbytes, stream)

    def launch(self, stream: Any, call: ResolvedCall, inputs: Sequence[Any], out: Any) -> None:
        with stream:  # CuPy launches on the current stream
            self._backend.launch(call, inputs, out)


class CupyBackend:
    name = "cupy"
    host_memory = False

    def __init__(self, device_id: int = 0, pinned_pool_bytes: int = DEFAULT_POOL_BYTES) -> None:
        try:
            cupy = importlib.import_module("cupy")
        except Exception as exc:  # ImportError, or a broken CUDA library raising anything
            raise BackendUnavailable(f"CuPy could not be imported: {exc}") from exc
        try:
            count = cupy.cuda.runtime.getDeviceCount()
            if count <= device_id:
                raise BackendUnavailable(f"CUDA device {device_id} not found ({count} present)")
            # CUDA's current device is per thread, and work runs on the server's worker threads
            # too (device 0 unless told): every call that allocates or launches enters this.
            self._device = cupy.cuda.Device(device_id)
            self._device.use()
            # Each thread's launches on its own stream (``ThreadStreams``), the probe's too.
            self.streams = ThreadStreams(cupy)
            # Host-to-device copies stage in a bounded pinned pool, pageable past it (even the
            # probe's: installed before any copy).
            self.pinned: PinnedPool = install(cupy, pinned_pool_bytes)
            props = cupy.cuda.runtime.getDeviceProperties(device_id)
            name = props["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            self._shift_left = cupy.ElementwiseKernel(
                "T x, T y", "T z", SHIFT_BODY.replace("LEFT", "true"), "tensorbits_shl"
            )
            self._shift_right = cupy.ElementwiseKernel(
                "T x, T y", "T z", SHIFT_BODY.replace("LEFT", "false"), "tensorbits_shr"
            )
            self._popcount = cupy.ElementwiseKernel("T x", "O z", POPCOUNT_BODY, "tensorbits_popc")
            # Public: tests/gpu runs the wide kernels on their own, beside the whole backend.
            self.wide = WideKernels(cupy, SHIFT_BODY, POPCOUNT_BODY)
            self.graphs = GraphKernels(cupy, SHIFT_BODY, POPCOUNT_BODY)
            self.xp: Any = cupy
            self._cupy = cupy
            self.device = f"cuda:{device_id} {name}"
            # Public: tests/gpu times the pieces' copies and kernels through it.
            self.pieces = CupyPieces(self)
            self.ops = BitOps(popcount=self._run_popcount, shift=self._run_shift)
            self._probe()
            self.device_memory: DeviceMemory | None = _device_memory(cupy, device_id)
        except BackendUnavailable:
            raise
        except Exception as exc:  # no driver, no device, NVRTC missing, kernel failure
            raise BackendUnavailable(f"CuPy is installed but no CUDA device works: {exc}") from exc

    def _probe(self) -> None:
        """Run the shift and popcount kernels, element-wise and wide, on known values; refuse
        the device if they differ."""
        # The wide kernels: 37 values are two whole vectors and a tail of five.
        x = np.arange(-18, 19, dtype=np.int8)
        counts = np.resize(np.array([1, 9, -1, 2, 0, 7], np.int8), x.size)
        wide_not, wide_shift = self.empty(x.shape, x.dtype), self.empty(x.shape, x.dtype)
        ran = self.wide.run(Function.NOT, None, [self.asarray(x)], wide_not) and self.wide.run(
            Function.SHIFT_RIGHT, False, [self.asarray(x), self.asarray(counts)], wide_shift
        )
        # NumPy's shifts follow the rule (as the element-wise probe below relies on too).
        if not (
            ran
            and np.array_equal(self.to_host(wide_not), ~x)
            and np.array_equal(self.to_host(wide_shift), np.right_shift(x, counts))
        ):
            raise BackendUnavailable("the CUDA probe kernels returned wrong results (wide)")
        x = np.array([-16, 1, -1, 5], dtype=np.int8)
        y = np.array([1, 9, -1, 2], dtype=np.int8)
        got = np.empty_like(x)
        self._run_shift(
            self.asarray(x), self.asarray(y), out := self.empty(x.shape, x.dtype), False
        )
        self.to_host(out, got)
        want = np.right_shift(x, y)
        counts = self.empty(x.shape, np.dtype(np.uint8))
        self._run_popcount(self.asarray(x.view(np.uint8)), counts)
        if not np.array_equal(got, want) or self.to_host(counts).tolist() != [4, 1, 8, 2]:
            raise BackendUnavailable("the CUDA probe kernels returned wrong results")

    def _run_popcount(self, x: DeviceArray, out: DeviceArray) -> None:
        self._popcount(x, out)

    def _run_shift(self, x: DeviceArray, count: DeviceArray, out: DeviceArray, left: bool) -> None:
        (self._shift_left if left else self._shift_right)(x, count, out)

    def asarray(self, host: np.ndarray[Any, Any]) -> DeviceArray:
        # CuPy arrays are native-endian only; a big-endian host array is converted (values kept).
        with self._device:
            self.streams.current()  # the copy is ordered on the thread's stream
            return self._cupy.asarray(host.astype(host.dtype.newbyteorder("="), copy=False))

    def to_host(
        self, array: DeviceArray, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        with self._device:
            # After the thread's launches on its stream (``get`` copies on the current stream
            # and waits for it).
            self.streams.current()
            if out is not None and not (out.flags.c_contiguous and out.dtype == array.dtype):
                # cupy.ndarray.get(out=) refuses a strided or differently typed (big-endian) out.
                np.copyto(out, array.get())
                return out
            result: np.ndarray[Any, Any] = array.get(out=out)
            return result

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> DeviceArray:
        with self._device:
            # CuPy's pool gives blocks per stream: allocated for the stream that will use it.
            self.streams.current()
            return self._cupy.empty(shape, dtype)

    def run(self, call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray) -> None:
        with self._device:
            self.streams.current()
            self.launch(call, inputs, out)

    def launch(self, call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray) -> None:
        """The call's kernel on the current stream, whichever it is (``run``: the thread's; a
        piece's: its compute stream)."""
        operands, target = as_kernel_operands(call, inputs, out)
        if not self.wide.run(call.op.function, call.shift_left, operands, target):
            run_kernel(self._cupy, self.ops, call, operands, target)

    def run_pieces(
        self,
        call: ResolvedCall,
        inputs: Sequence[np.ndarray[Any, Any] | DeviceArray],
        out: np.ndarray[Any, Any],
    ) -> bool:
        """A large element-wise call on host data in pieces whose copies overlap its kernels,
        finished before this returns (backends/pieces.py); False, nothing run, where it does
        not qualify or the pinned pool cannot lend its staging (``engine.run_into`` then runs
        it one-shot)."""
        with self._device:
            self.streams.current()  # the device buffers from the thread's stream's pool
            return run_pieces(self.pieces, call, inputs, out)

    def run_fused(
        self,
        plan: FusedChain,
        values: dict[int, DeviceArray],
        into: Mapping[int, DeviceArray] | None = None,
    ) -> bool:
        """A fused graph plan in one kernel (``backends.base.run_fused``), writing each output
        value into ``into``'s array for its slot where given (a CUDA region's)."""
        with self._device:
            self.streams.current()
            return self.graphs.run(plan, values, self.empty, into or {})

    def when_done(self, done: Callable[[BaseException | None], None]) -> None:
        """``done`` called once the calling thread's stream has run everything issued on it so
        far: from the driver's thread, with None, or the CUDA error the stream met
        (core/device_wait.py, which hands it to the event loop; a callback makes no CUDA
        call). What the event loop waits on instead of ``synchronize``."""
        runtime = self._cupy.cuda.runtime

        def fired(stream: Any, status: int, arg: Any) -> None:
            done(None if status == 0 else runtime.CUDARuntimeError(status))

        with self._device:
            self.streams.current().add_callback(fired, None)

    def synchronize(self) -> None:
        """Wait for the calling thread's launches: its stream, not the legacy default stream
        (which would wait for nothing launched on the streams, or for every thread's)."""
        with self._device:
            self.streams.synchronize()

    def memory_in_use(self) -> int | None:
        used: int = self._cupy.get_default_memory_pool().used_bytes()
        return used

    def close(self) -> None:
        self._cupy.get_default_memory_pool().free_all_blocks()
        self.pinned.trim()
