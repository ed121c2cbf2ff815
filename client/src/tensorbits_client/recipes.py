"""Worked examples built on the public API.

``hamming_distances``: all pairwise Hamming distances between two sets of packed binary codes
(rows of ``np.packbits`` output), as one /v1 batch per block of rows:

    XOR      every (i, j) pair of code words   -> "diff"    (stays on the server)
    COUNT    set bits of each XORed word       -> "counts"  (one byte per word comes back)

No pair is materialised on the client and the XOR result never crosses the network: the pairs
are strided views (a stride of 0 repeats a row, DirectML's only way to broadcast), and only the
per-word counts come back, to be summed here. Words are the widest unsigned type dividing the
code length (UINT64 for 8-byte multiples), so the counts are 1/8 of the XOR's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from tensorbits_client._batch import Batch
from tensorbits_client._client import AsyncClient, Client
from tensorbits_client._families import FeatureLevel
from tensorbits_client._types import Array
from tensorbits_protocol.dtypes import DataType, itemsize
from tensorbits_protocol.operators import feature_level_index

__all__ = ["async_hamming_distances", "hamming_distances"]

#: Bound on the server-side XOR buffer of one batch; more rows go in further batches.
DEFAULT_MAX_INTERMEDIATE_BYTES = 64 << 20


def _codes(name: str, codes: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    array = np.asarray(codes)
    if array.dtype != np.uint8 or array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"{name}: packed codes are a non-empty 2-D uint8 array (np.packbits)")
    return np.ascontiguousarray(array)


def _word(code_bytes: int, feature_level: FeatureLevel) -> DataType:
    # UINT64 operands arrive with DirectML feature level 4_1.
    wide = feature_level_index(feature_level) >= feature_level_index("4_1")
    for datatype in (DataType.UINT64, DataType.UINT32, DataType.UINT16, DataType.UINT8):
        if code_bytes % itemsize(datatype) == 0 and (wide or datatype != DataType.UINT64):
            return datatype
    raise AssertionError("UINT8 divides every length")


def _blocks(a: Array, b: Array, max_intermediate_bytes: int) -> Iterator[tuple[int, int]]:
    rows = max(1, max_intermediate_bytes // (b.shape[0] * b.shape[1]))
    for start in range(0, a.shape[0], rows):
        yield start, min(start + rows, a.shape[0])


def _plan(batch: Batch[Any], a: Array, b: Array, feature_level: FeatureLevel) -> None:
    word = _word(a.shape[1], feature_level)
    words = a.shape[1] // itemsize(word)
    pairs = (a.shape[0], b.shape[0], words)
    # Pair (i, j) reads row i of a (stride 0 along j) and row j of b (stride 0 along i).
    left = batch.input("a", a).tensor(word, pairs, strides=(words, 0, 1))
    right = batch.input("b", b).tensor(word, pairs, strides=(0, words, 1))
    diff = batch.bit_xor(left, right, out="diff", feature_level=feature_level)
    counts = batch.bit_count(diff, out="counts", feature_level=feature_level)
    batch.output(counts)


def _distances(results: dict[str, Array]) -> npt.NDArray[np.uint32]:
    distances: npt.NDArray[np.uint32] = results["counts"].sum(axis=2, dtype=np.uint32)
    return distances


def _checked(a: npt.ArrayLike, b: npt.ArrayLike) -> tuple[Array, Array]:
    left, right = _codes("a", a), _codes("b", b)
    if left.shape[1] != right.shape[1]:
        raise ValueError(f"codes differ in length: {left.shape[1]} and {right.shape[1]} bytes")
    return left, right


def hamming_distances(
    client: Client,
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    feature_level: FeatureLevel = "6_4",
    max_intermediate_bytes: int = DEFAULT_MAX_INTERMEDIATE_BYTES,
) -> npt.NDArray[np.uint32]:
    """Hamming distance of every row of ``a`` to every row of ``b`` (uint8 packed codes of
    equal length), as an ``(len(a), len(b))`` uint32 array."""
    left, right = _checked(a, b)
    out = np.empty((left.shape[0], right.shape[0]), dtype=np.uint32)
    for start, stop in _blocks(left, right, max_intermediate_bytes):
        batch = client.batch()
        _plan(batch, left[start:stop], right, feature_level)
        out[start:stop] = _distances(batch.run())
    return out


async def async_hamming_distances(
    client: AsyncClient,
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    feature_level: FeatureLevel = "6_4",
    max_intermediate_bytes: int = DEFAULT_MAX_INTERMEDIATE_BYTES,
) -> npt.NDArray[np.uint32]:
    """``hamming_distances`` for an ``AsyncClient``."""
    left, right = _checked(a, b)
    out = np.empty((left.shape[0], right.shape[0]), dtype=np.uint32)
    for start, stop in _blocks(left, right, max_intermediate_bytes):
        batch = client.batch()
        _plan(batch, left[start:stop], right, feature_level)
        out[start:stop] = _distances(await batch.run())
    return out
