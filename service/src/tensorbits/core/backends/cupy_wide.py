"""Wide kernels for the CuPy backend: each thread loads up to 16 bytes of every operand at once.

CuPy's element-wise kernels give each thread one element, so a one-byte type moves a byte per load
and per store: on an NVIDIA H100 a UINT8 BIT_NOT over 256 MiB ran at 14 % of the device's copy
bandwidth, a UINT64 one at 96 % (bench/results/gpu.md). These kernels give each thread a vector of
elements, as many as fill 16 bytes of the wider of the input and output types, loaded and stored as
one word each; the elements are computed one by one with the same rules as the element-wise kernels
(the shift rule of docs/semantics.md and the population count are the very same source text).

They serve the common case: contiguous operands of the output's element count, or a second
operand of one element (a shift count, a mask), native byte order, every pointer 16-byte aligned.
``WideKernels.run`` says False for anything else, and the backend runs its element-wise kernels
as before. BOOL has bodies of its own: OpenVINO's logical operations, any nonzero byte true,
as NumPy computes them.

The kernel source is plain CUDA C++ made by ``source`` from a few type names and a body, so
that it can also be compiled for the host with a small shim and checked there against NumPy,
on machines without a GPU (tests/core/test_wide_kernels.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tensorbits.core.kernels import DeviceArray
from tensorbits_protocol.operators import Function

VECTOR_BYTES = 16  # one uint4: the widest word a thread loads or stores in one instruction
THREADS = 256
MAX_BLOCKS = (1 << 31) - 1  # CUDA's limit on a grid's x dimension; past it, the loop strides

_BOOL = np.dtype(np.bool_)
# C names of the element types a kernel may take (native byte order only).
C_TYPES: dict[np.dtype[Any], str] = {
    _BOOL: "unsigned char",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int8): "signed char",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.int16): "short",
    np.dtype(np.uint32): "unsigned int",
    np.dtype(np.int32): "int",
    np.dtype(np.uint64): "unsigned long long",
    np.dtype(np.int64): "long long",
}
# The word a vector is loaded or stored as, by its size.
_WORDS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}
# The unsigned type a bitwise operator's operands may be seen as, by how many bytes divide them.
_WIDEST_UNSIGNED = (np.dtype(np.uint64), np.dtype(np.uint32), np.dtype(np.uint16))

# The functions whose result bits depend on each input bit alone: any element type, so their
# operands may be seen as the widest unsigned words that tile them.
_BITWISE_BODIES = {
    Function.AND: "return (O)(x & y);",
    Function.OR: "return (O)(x | y);",
    Function.XOR: "return (O)(x ^ y);",
    Function.NOT: "return (O)(~x);",
}
# OpenVINO's BOOL rules: the logical operations, a nonzero byte true, the result 0 or 1.
_BOOL_BODIES = {
    Function.AND: "return (O)((x != 0) & (y != 0));",
    Function.OR: "return (O)((x != 0) | (y != 0));",
    Function.XOR: "return (O)((x != 0) ^ (y != 0));",
    Function.NOT: "return (O)(x == 0);",
}
_SHIFTS = {Function.SHIFT_LEFT, Function.SHIFT_RIGHT, Function.SHIFT}
_COUNT_TYPES = (np.dtype(np.uint8), np.dtype(np.uint32))  # BIT_COUNT's output types

TEMPLATE = """
typedef TYPE_T T;
typedef TYPE_O O;
typedef WORD_IN WI;
typedef WORD_OUT WO;
#define LANES (16 / (sizeof(T) > sizeof(O) ? sizeof(T) : sizeof(O)))
union InVector { WI w; T e[LANES]; };
union OutVector { WO w; O e[LANES]; };

__device__ __forceinline__ O lane(T x, T y) {
BODY
}

extern "C" __global__ void NAME(const T* a, const T* b, O* z, unsigned long long n,
                                int b_scalar) {
    const unsigned long long vectors = n / LANES;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
    const T y0 = b_scalar ? b[0] : (T)0;
    for (unsigned long long v = first; v < vectors; v += step) {
        InVector x, y;
        OutVector r;
        x.w = reinterpret_cast<const WI*>(a)[v];
        if (!b_scalar) {
            y.w = reinterpret_cast<const WI*>(b)[v];
        }
#pragma unroll
        for (int l = 0; l < (int)LANES; ++l) {
            r.e[l] = lane(x.e[l], b_scalar ? y0 : y.e[l]);
        }
        reinterpret_cast<WO*>(z)[v] = r.w;
    }
    // The tail: fewer than LANES elements past the last whole vector, one thread each.
    const unsigned long long tail = vectors * LANES + first;
    if (tail < n) {
        z[tail] = lane(a[tail], b_scalar ? y0 : b[tail]);
    }
}
"""


def lanes(t: np.dtype[Any], o: np.dtype[Any]) -> int:
    """How many elements one thread computes at a time: 16 bytes of the wider type."""
    return VECTOR_BYTES // max(t.itemsize, o.itemsize)


def lane_body(function: Function, boolean: bool, shift_body: str, popcount_body: str) -> str:
    """The C body of ``lane(x, y)`` for ``function`` (on BOOL elements when ``boolean``):
    returns one output element. A shift's body keeps the word ``LEFT_FLAG`` for ``true`` or
    ``false``."""
    if boolean:
        return _BOOL_BODIES[function]
    if function in _BITWISE_BODIES:
        return _BITWISE_BODIES[function]
    if function in _SHIFTS:
        return f"O z;\n{shift_body.replace('LEFT', 'LEFT_FLAG')}\nreturn z;"
    if function is Function.COUNT:
        return f"O z;\n{popcount_body}\nreturn z;"
    raise KeyError(function)


def source(name: str, t: np.dtype[Any], o: np.dtype[Any], body: str) -> str:
    """The CUDA C++ of one kernel ``name`` for element type ``t`` in and ``o`` out."""
    vector = lanes(t, o)
    return (
        TEMPLATE.replace("TYPE_T", C_TYPES[t])
        .replace("TYPE_O", C_TYPES[o])
        .replace("WORD_IN", _WORDS[vector * t.itemsize])
        .replace("WORD_OUT", _WORDS[vector * o.itemsize])
        .replace("BODY", body)
        .replace("NAME", name)
    )


LaunchKey = tuple[Function, bool, str, str]  # function, shift left, element type in, out


class Launch(NamedTuple):
    """One wide kernel's operands, as its arguments take them: the arrays' data pointers, and
    how many elements of the key's types they hold."""

    key: LaunchKey
    a: DeviceArray
    b: DeviceArray
    z: DeviceArray
    elements: int  # how many elements of a (and z) the kernel runs over
    b_scalar: bool


def _address(x: DeviceArray) -> int:
    """Where ``x``'s first element lies: a CuPy array's device pointer (a NumPy array's
    address, for the host checks of the launch plan)."""
    data = x.data
    return int(data.ptr) if hasattr(data, "ptr") else int(x.ctypes.data)


def _aligned(x: DeviceArray) -> bool:
    return bool(x.flags.c_contiguous) and _address(x) % VECTOR_BYTES == 0


def _native(dtype: np.dtype[Any]) -> bool:
    return dtype.byteorder in ("=", "|") and dtype in C_TYPES


def plan_launch(
    function: Function, shift_left: bool | None, operands: list[DeviceArray], out: DeviceArray
) -> Launch | None:
    """The wide kernel's launch for these operands, or None where it does not apply. The
    arrays are passed as they are (a raw kernel takes their data pointers alone): seeing them
    as other words is the launch key's element type, no view is made (each costs microseconds,
    which a 64 MiB kernel of about 70 us would feel)."""
    a = operands[0]
    b = operands[1] if len(operands) > 1 else a
    count = int(out.size)
    t, o = a.dtype, out.dtype
    if count == 0 or a.size != count or not (_native(t) and _native(o)):
        return None
    b_scalar = len(operands) == 1 or (b.size == 1 and count > 1)
    if b.dtype != t or (b.size != count and not b_scalar):
        return None
    if not (_aligned(a) and _aligned(out) and (b_scalar or _aligned(b))):
        return None
    if t == _BOOL:
        if function not in _BOOL_BODIES or o != _BOOL:
            return None
    elif function is Function.COUNT:
        if t.kind != "u" or o not in _COUNT_TYPES:
            return None
    elif function in _SHIFTS or function in _BITWISE_BODIES:
        if o != t:
            return None
        if function in _BITWISE_BODIES and (len(operands) == 1 or not b_scalar):
            # Any element type: seen as the widest unsigned words that tile every operand.
            nbytes = count * t.itemsize
            wide = next((w for w in _WIDEST_UNSIGNED if nbytes % w.itemsize == 0), None)
            if wide is not None and wide.itemsize > t.itemsize:
                t = o = wide
                count = nbytes // wide.itemsize
    else:
        return None
    return Launch((function, bool(shift_left), t.str, o.str), a, b, out, count, b_scalar)


def kernel_source(key: LaunchKey, shift_body: str, popcount_body: str) -> tuple[str, str]:
    """The name and CUDA C++ of the kernel a launch ``key`` runs."""
    function, left, t, o = key
    body = lane_body(function, np.dtype(t) == _BOOL, shift_body, popcount_body)
    body = body.replace("LEFT_FLAG", "true" if left else "false")
    name = f"tensorbits_wide_{function.name.lower()}{'_left' if left else ''}"
    return name, source(name, np.dtype(t), np.dtype(o), body)


class WideKernels:
    """The wide kernels of one CuPy backend, compiled (by NVRTC, cached by CuPy) on first use."""

    def __init__(self, cupy: Any, shift_body: str, popcount_body: str) -> None:
        self._cupy = cupy
        self._shift_body = shift_body
        self._popcount_body = popcount_body
        self._kernels: dict[LaunchKey, Any] = {}

    def _kernel(self, key: LaunchKey) -> Any:
        kernel = self._kernels.get(key)
        if kernel is None:
            name, code = kernel_source(key, self._shift_body, self._popcount_body)
            kernel = self._cupy.RawKernel(code, name)
            self._kernels[key] = kernel
        return kernel

    def run(
        self,
        function: Function,
        shift_left: bool | None,
        operands: list[DeviceArray],
        out: DeviceArray,
    ) -> bool:
        """Run ``function`` into ``out`` with a wide kernel; False (nothing run) where none
        applies to these operands."""
        launch = plan_launch(function, shift_left, operands, out)
        if launch is None:
            return False
        # A thread a vector (a streaming kernel reaches the device's bandwidth with a full grid);
        # at least one block, whose threads also run the tail.
        _, _, t, o = launch.key
        vectors = max(1, launch.elements // lanes(np.dtype(t), np.dtype(o)))
        blocks = min(MAX_BLOCKS, -(-vectors // THREADS))
        self._kernel(launch.key)(
            (blocks,),
            (THREADS,),
            (
                launch.a,
                launch.b,
                launch.z,
                np.uint64(launch.elements),
                np.int32(1 if launch.b_scalar else 0),
            ),
        )
        return True
