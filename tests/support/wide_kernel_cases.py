"""The cases the CuPy backend's wide kernels are checked on, on the host (compiled with a shim)
and on a device: every function and integer type, sizes with and without a tail, a second
operand of one element; operands 16-byte aligned, as the kernels require."""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tensorbits.core.backends.cupy_wide import VECTOR_BYTES
from tensorbits_protocol.operators import Function

# What a CUDA kernel's source needs to compile as C++ on the host: the vector types, the grid's
# indices (set by each test's runner before it calls the kernel as a plain function, thread by
# thread) and the device intrinsics the kernels use.
HOST_SHIM = """
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
struct Index { unsigned int x; };
static Index blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline int __popc(unsigned int v) { return __builtin_popcount(v); }
static inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
"""
INTEGERS = [np.dtype(t) for t in ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8")]
UNSIGNED = [t for t in INTEGERS if t.kind == "u"]
SIZES = [1, 3, 15, 16, 17, 37, 100, 257]
BITWISE = {
    Function.AND: np.bitwise_and,
    Function.OR: np.bitwise_or,
    Function.XOR: np.bitwise_xor,
}
# (function, shift direction: True is left, None for no shift, the NumPy function)
BINARY = [
    *((function, None, ufunc) for function, ufunc in BITWISE.items()),
    (Function.SHIFT_LEFT, True, np.left_shift),
    (Function.SHIFT_RIGHT, False, np.right_shift),
    (Function.SHIFT, True, np.left_shift),
    (Function.SHIFT, False, np.right_shift),
]


def aligned(count: int, dtype: np.dtype[Any], offset: int = 0) -> np.ndarray[Any, Any]:
    """``count`` elements whose first lies ``offset`` bytes past a 16-byte boundary."""
    raw = np.empty(count * dtype.itemsize + 2 * VECTOR_BYTES, np.uint8)
    start = -raw.ctypes.data % VECTOR_BYTES + offset
    return raw[start : start + count * dtype.itemsize].view(dtype)


def random(count: int, dtype: np.dtype[Any], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    out = aligned(count, dtype)
    out[...] = rng.integers(0, 256, count * dtype.itemsize, np.uint8).view(dtype)
    return out


def shift_counts(
    count: int, dtype: np.dtype[Any], rng: np.random.Generator
) -> np.ndarray[Any, Any]:
    """Counts inside the width, at it, past it, and negative where the type is signed."""
    width = 8 * dtype.itemsize
    low = -width - 2 if dtype.kind == "i" else 0
    high = min(2 * width + 2, int(np.iinfo(dtype).max))
    out = aligned(count, dtype)
    out[...] = rng.integers(low, high + 1, count).astype(dtype)
    return out


class Case(NamedTuple):
    name: str
    function: Function
    left: bool | None
    operands: list[np.ndarray[Any, Any]]
    out: np.ndarray[Any, Any]
    want: np.ndarray[Any, Any]


def _case(
    name: str,
    function: Function,
    left: bool | None,
    operands: list[np.ndarray[Any, Any]],
    want: np.ndarray[Any, Any],
) -> Case:
    """A case whose output is an aligned block of ``want``'s size and data type."""
    return Case(name, function, left, operands, aligned(want.size, want.dtype), want)


def cases() -> Iterator[Case]:
    rng = np.random.default_rng(7)
    for dtype in INTEGERS:
        for size in SIZES:
            a, b = random(size, dtype, rng), random(size, dtype, rng)
            one = random(1, dtype, rng)
            counts = shift_counts(size, dtype, rng)
            scalar = np.array([rng.integers(0, 8 * dtype.itemsize + 3)], dtype)
            scalar_in = aligned(1, dtype)
            scalar_in[...] = scalar
            for function, left, ufunc in BINARY:
                # A second operand of the first's size, then of one element.
                second = (b, one) if left is None else (counts, scalar_in)
                for tag, other in zip(("", "-scalar"), second, strict=True):
                    side = "" if left is None else f"-{left}"
                    name = f"{function.name}{side}-{dtype}-{size}{tag}"
                    yield _case(name, function, left, [a, other], ufunc(a, other))
            yield _case(f"NOT-{dtype}-{size}", Function.NOT, None, [a], ~a)
            if dtype == np.uint8:
                # BOOL: the logical operations, any nonzero byte true (NumPy's rules).
                p, q = a.view(np.bool_), b.view(np.bool_)
                for function, ufunc in BITWISE.items():
                    yield _case(f"{function.name}-bool-{size}", function, None, [p, q], ufunc(p, q))
                yield _case(f"NOT-bool-{size}", Function.NOT, None, [p], ~p)
            if dtype in UNSIGNED:
                for out_type in (np.dtype(np.uint8), np.dtype(np.uint32)):
                    yield _case(
                        f"COUNT-{dtype}-{out_type}-{size}",
                        Function.COUNT,
                        None,
                        [a],
                        np.bitwise_count(a).astype(out_type),
                    )


def compile_host_library(compiler: str, folder: Path, name: str, parts: list[str]) -> ctypes.CDLL:
    """``parts`` (``HOST_SHIM`` first, then kernels and their runners) built as one shared
    library with ``compiler`` in ``folder``, and loaded."""
    source_path, library = folder / f"{name}.cpp", folder / f"{name}.so"
    source_path.write_text("\n".join(parts))
    subprocess.run(
        [compiler, "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(library), str(source_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return ctypes.CDLL(str(library))


def host_runner(parameters: str, call: str) -> str:
    """A C function ``run_NAME(<parameters>, blocks, threads)`` that runs the kernel ``call``
    names once for every thread of a grid of ``blocks`` x ``threads``, in order, with the
    shim's indices set as the device would set them (NAME and SPACE replaced by the caller)."""
    return f"""
extern "C" void run_NAME({parameters}, unsigned blocks, unsigned threads) {{
    gridDim.x = blocks;
    blockDim.x = threads;
    for (unsigned block = 0; block < blocks; ++block) {{
        for (unsigned thread = 0; thread < threads; ++thread) {{
            blockIdx.x = block;
            threadIdx.x = thread;
            {call};
        }}
    }}
}}
"""
