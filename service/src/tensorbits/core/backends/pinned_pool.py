"""The CuPy backend's host staging: a bounded pool of pinned (page-locked) host memory.

``cupy.asarray`` copies a host array to the device through a pinned staging buffer that it asks
of CuPy's pinned memory allocator: the array is copied into the buffer, the buffer to the device
asynchronously, and CuPy holds the buffer until the copy's event has passed (it checks at its
next pinned allocation). CuPy's own allocator is a pool that keeps every buffer it ever made, for
reuse, without a bound: pinned pages that neither admission nor the container's memory limit
knows of. This pool replaces it (``install``; CuPy's allocator is the process's, so the pool is
too):

- bounded: the pinned bytes it holds, in use and kept for reuse together, never pass its limit
  (TENSORBITS_PINNED_POOL_BYTES, one worker's share of it);
- falling back: a buffer that would pass the limit is refused with the CUDA runtime's
  out-of-memory error, which CuPy answers by copying from the host array itself, pageable and
  synchronously (slower, never failed), as Triton's pinned memory pool falls back; a refusal of
  the driver itself (no pinned host memory left) is answered the same way;
- reusing: a buffer given back is kept for a later one that fits in it and needs at least half
  of it; kept buffers are freed, largest first, to make room for one that fits none of them.

Device-to-host copies (``cupy.ndarray.get``) stage nothing in CuPy: they copy into the pageable
destination array directly (CUDA's driver stages them in its own small, fixed buffers). A large
call run in pieces (pieces.py) takes its staging, both ways, from this pool too (``malloc``).

Admission and the memory bound. The pool's bytes are not charged to the requests: the pool's
limit is a fixed addition to the bound on the server's memory, which is then
``max_inflight_bytes + pinned_pool_bytes + base`` (the Kubernetes manifests size their memory
limit by that sum: docker/k8s/base/deployment.yaml). Charging each staging buffer to its request
would count its bytes twice (a staged input is a copy of a host array the request's grant
already counts) and for the wrong time: the buffer is in use until the copy's event has passed
and CuPy next checks, possibly after the request is answered, and then stays pinned in the pool
for reuse, no request's bytes. A bound the process never passes, whatever the requests do, is
what the container's limit needs; and since a full pool copies from pageable memory, which takes
no host bytes beyond the request's own, it never makes a request wait or fail.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import warnings
import weakref
from typing import Any

logger = logging.getLogger("tensorbits.backend")

MiB = 1 << 20
# Triton's default (--pinned-memory-pool-byte-size): 256 MB.
DEFAULT_POOL_BYTES = 256 * MiB
# Buffers are made in whole pages (cudaHostAlloc pins pages), so that near sizes share them.
PAGE = 4096
# CuPy's words when it falls back (cupy._core: _alloc_async_transfer_buffer), a
# PerformanceWarning per copy; the pool counts its refusals and says so in the log once instead.
CUPY_FALLBACK_WARNING = r"Using synchronous transfer as pinned memory"


def _pages(nbytes: int) -> int:
    return -(-nbytes // PAGE) * PAGE


class _Lease:
    """One buffer lent to CuPy: what its ``PinnedMemoryPointer`` points into (``ptr``, ``size``),
    given back to the pool when CuPy drops it."""

    __slots__ = ("_block", "_pool", "ptr", "size")

    def __init__(self, block: Any, pool: weakref.ref[PinnedPool]) -> None:
        self._block = block
        self._pool = pool
        self.ptr: int = block.ptr
        self.size: int = block.size

    def __del__(self) -> None:
        pool = self._pool()
        if pool is not None:
            pool._give_back(self._block)
        # Without the pool the block goes with this lease, and CuPy's PinnedMemory frees it.


class PinnedPool:
    """Pinned host buffers for CuPy, at most ``limit`` bytes of them (0: none, every copy from
    pageable memory). ``malloc`` is CuPy's pinned memory allocator."""

    def __init__(self, cupy: Any, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"a pinned pool's limit is at least 0, not {limit}")
        self.cupy = cupy
        self.limit = limit
        self.held = 0  # pinned bytes made and not freed: lent and kept
        self.lent = 0  # of those, in CuPy's hands now
        self.fallbacks = 0  # buffers refused: copies CuPy made from pageable memory
        # Kept buffers by size, then age: (size, number, block).
        self._kept: list[tuple[int, int, Any]] = []
        self._numbers = itertools.count()
        # Re-entrant: a lease dropped by the garbage collector gives back from any frame.
        self._lock = threading.RLock()
        self._ref = weakref.ref(self)

    @property
    def kept(self) -> int:
        """Bytes kept for reuse (held, not lent)."""
        return self.held - self.lent

    def malloc(self, nbytes: int) -> Any:
        """A ``PinnedMemoryPointer`` to at least ``nbytes`` pinned bytes, or the CUDA runtime's
        out-of-memory error (CuPy's cue to copy from pageable memory) past the limit."""
        cuda = self.cupy.cuda
        if nbytes <= 0:
            return cuda.PinnedMemoryPointer(cuda.PinnedMemory(0), 0)
        size = _pages(nbytes)
        with self._lock:
            block = self._reuse(size)
            if block is None:
                block = self._make(size)
            if block is not None:
                self.lent += block.size
                return cuda.PinnedMemoryPointer(_Lease(block, self._ref), 0)
            self.fallbacks += 1
            first, held = self.fallbacks == 1, self.held
        if first:
            logger.warning(
                "pinned pool full (%d of %d bytes held, %d more asked): host-to-device copies "
                "that do not fit are made from pageable memory, slower; "
                "TENSORBITS_PINNED_POOL_BYTES sizes the pool (docs/gpu.md)",
                held,
                self.limit,
                size,
            )
        raise cuda.runtime.CUDARuntimeError(cuda.runtime.errorMemoryAllocation)

    def _reuse(self, size: int) -> Any:
        """The smallest kept buffer of ``size`` to ``2 * size`` bytes, taken; or None."""
        at = bisect.bisect_left(self._kept, (size,))
        if at == len(self._kept) or self._kept[at][0] > 2 * size:
            return None
        return self._kept.pop(at)[2]

    def _make(self, size: int) -> Any:
        """A new buffer of ``size`` bytes within the limit, kept ones freed to make room; None
        where the limit or the driver will not have it."""
        if self.lent + size > self.limit:
            return None
        self._free_kept(self.limit - size)
        runtime = self.cupy.cuda.runtime
        try:
            block = self.cupy.cuda.PinnedMemory(size, runtime.hostAllocPortable)
        except runtime.CUDARuntimeError as exc:
            if exc.status != runtime.errorMemoryAllocation:
                raise
            if not self._kept:
                return None
            self._free_kept(0)  # the host is short of pinned memory: give back what is idle
            try:
                block = self.cupy.cuda.PinnedMemory(size, runtime.hostAllocPortable)
            except runtime.CUDARuntimeError as again:
                if again.status != runtime.errorMemoryAllocation:
                    raise
                return None
        self.held += block.size
        return block

    def _free_kept(self, most: int) -> None:
        """Free kept buffers, largest first, until at most ``most`` bytes are held."""
        while self._kept and self.held > most:
            size, _, block = self._kept.pop()
            self.held -= size
            del block  # CuPy's PinnedMemory frees its pages once unreferenced

    def _give_back(self, block: Any) -> None:
        with self._lock:
            self.lent -= block.size
            if self.held > self.limit:  # the limit was lowered while this was lent
                self.held -= block.size
                return
            bisect.insort(self._kept, (block.size, next(self._numbers), block))

    def resize(self, limit: int) -> None:
        """A new limit; kept buffers past it are freed now, lent ones once given back."""
        with self._lock:
            self.limit = limit
            self._free_kept(limit)

    def trim(self) -> None:
        """Free every kept buffer (the backend's ``close``): only lent ones stay pinned."""
        with self._lock:
            self._free_kept(0)


_installed: PinnedPool | None = None
_install_lock = threading.Lock()


def install(cupy: Any, limit: int) -> PinnedPool:
    """The process's pool as CuPy's pinned memory allocator, with ``limit``: made and installed
    on first use (the buffers CuPy's own pool kept are freed), resized by later backends of the
    same CuPy."""
    global _installed
    with _install_lock:
        if _installed is not None and _installed.cupy is cupy:
            _installed.resize(limit)
            return _installed
        pool = PinnedPool(cupy, limit)
        cupy.cuda.set_pinned_memory_allocator(pool.malloc)
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        # The fallback is counted and logged once by the pool, not warned of at every copy.
        warnings.filterwarnings("ignore", message=CUPY_FALLBACK_WARNING)
        _installed = pool
        return pool


__all__ = ["DEFAULT_POOL_BYTES", "PinnedPool", "install"]
