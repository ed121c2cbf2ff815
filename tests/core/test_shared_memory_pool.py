"""The input buffers of shared-memory requests: reused by size past POOLED_MIN_BYTES, never more
than the pool's bound held idle, never handed to two requests at once."""

from __future__ import annotations

from tensorbits.core.shared_memory import POOLED_MIN_BYTES, BufferPool


def test_large_buffers_are_reused_small_ones_not() -> None:
    pool = BufferPool(max_bytes=4 * POOLED_MIN_BYTES)
    large = pool.take(POOLED_MIN_BYTES)
    pool.give(large)
    assert pool.held == POOLED_MIN_BYTES
    assert pool.take(POOLED_MIN_BYTES) is large  # the same memory, pages already touched
    assert pool.held == 0
    assert pool.take(POOLED_MIN_BYTES) is not large  # taken: never handed out twice
    small = pool.take(16)
    pool.give(small)
    assert pool.held == 0
    assert pool.take(16) is not small


def test_idle_buffers_are_bounded() -> None:
    pool = BufferPool(max_bytes=2 * POOLED_MIN_BYTES)
    buffers = [pool.take(POOLED_MIN_BYTES) for _ in range(3)]
    for buffer in buffers:
        pool.give(buffer)
    assert pool.held == 2 * POOLED_MIN_BYTES  # the third is dropped, not kept
    other = pool.take(2 * POOLED_MIN_BYTES)  # another size: a new buffer
    assert len(other) == 2 * POOLED_MIN_BYTES
    assert pool.held == 2 * POOLED_MIN_BYTES
