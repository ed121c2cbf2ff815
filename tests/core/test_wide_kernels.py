"""The CuPy backend's wide kernels, checked without a GPU.

Their launch plan runs on NumPy arrays as it does on CuPy's; their CUDA C++ is compiled for the
host with a shim for the few CUDA names it uses (vector types, the grid's indices, the population
count intrinsics) and run over a simulated grid, against NumPy: every function and element type,
sizes with and without a tail, a second operand of one element, in place. The device run of the
same kernels is tests/gpu/test_cupy.py. Skipped where no C++ compiler is found.
"""

from __future__ import annotations

import ctypes
import shutil
from collections.abc import Callable

import numpy as np
import pytest
from support.wide_kernel_cases import (
    HOST_SHIM,
    INTEGERS,
    Case,
    aligned,
    cases,
    compile_host_library,
    host_runner,
    random,
    shift_counts,
)

from tensorbits.core.backends.cupy_backend import POPCOUNT_BODY, SHIFT_BODY
from tensorbits.core.backends.cupy_wide import Launch, LaunchKey, kernel_source, plan_launch
from tensorbits_protocol.operators import Function

RUNNER = host_runner(
    "const void* a, const void* b, void* z, unsigned long long n, int b_scalar",
    "SPACE::NAME((const SPACE::T*)a, (const SPACE::T*)b, (SPACE::O*)z, n, b_scalar)",
)
# A small grid, so that the grid-stride loop goes round more than once; 32 threads cover any
# tail (at most 15 elements), as the device's 256 a block do.
BLOCKS, THREADS = 2, 16

CASES = list(cases())


def _launch(case: Case) -> Launch:
    launch = plan_launch(case.function, case.left, list(case.operands), case.out)
    assert launch is not None, case.name
    return launch


Runner = Callable[[Launch], None]


@pytest.fixture(scope="module")
def run_on_host(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++ or clang++) to build the kernels for the host")
    keys: dict[LaunchKey, str] = {}
    parts = [HOST_SHIM]
    for case in CASES:
        key = _launch(case).key
        if key in keys:
            continue
        name, code = kernel_source(key, SHIFT_BODY, POPCOUNT_BODY)
        unique = f"{name}_{len(keys)}"
        keys[key] = unique
        space = f"space_{len(keys)}"
        parts.append(
            f"namespace {space} {{\n{code.replace(f'void {name}(', f'void {unique}(')}\n}}"
        )
        parts.append(RUNNER.replace("SPACE", space).replace("NAME", unique))
    host = compile_host_library(compiler, tmp_path_factory.mktemp("wide"), "wide", parts)

    def run(launch: Launch) -> None:
        function = getattr(host, f"run_{keys[launch.key]}")
        function.restype = None
        function(
            ctypes.c_void_p(launch.a.ctypes.data),
            ctypes.c_void_p(launch.b.ctypes.data),
            ctypes.c_void_p(launch.z.ctypes.data),
            ctypes.c_ulonglong(launch.elements),
            ctypes.c_int(int(launch.b_scalar)),
            ctypes.c_uint(BLOCKS),
            ctypes.c_uint(THREADS),
        )

    return run


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_wide_kernel_matches_numpy(run_on_host: Runner, case: Case) -> None:
    case.out.view(np.uint8)[...] = 0xA5  # not a result any case expects everywhere
    run_on_host(_launch(case))
    np.testing.assert_array_equal(case.out, case.want)


def test_in_place_output_over_the_first_input(run_on_host: Runner) -> None:
    rng = np.random.default_rng(3)
    for dtype in INTEGERS:
        a = random(37, dtype, rng)
        want = ~a
        launch = plan_launch(Function.NOT, None, [a], a)
        assert launch is not None
        run_on_host(launch)
        np.testing.assert_array_equal(a, want)
        b = shift_counts(37, dtype, rng)
        want = np.right_shift(a, b)
        launch = plan_launch(Function.SHIFT_RIGHT, False, [a, b], a)
        assert launch is not None
        run_on_host(launch)
        np.testing.assert_array_equal(a, want)


def test_bitwise_operands_are_seen_as_the_widest_words_that_tile_them() -> None:
    rng = np.random.default_rng(1)
    for size, wide in ((64, np.uint64), (36, np.uint32), (34, np.uint16), (33, np.uint8)):
        a, b = random(size, np.dtype(np.uint8), rng), random(size, np.dtype(np.uint8), rng)
        launch = plan_launch(Function.XOR, None, [a, b], aligned(size, np.dtype(np.uint8)))
        assert launch is not None
        assert launch.key[2] == launch.key[3] == np.dtype(wide).str
        assert launch.elements == size // np.dtype(wide).itemsize
    # A shift and a scalar mask keep their element type: their lanes are the elements.
    a, one = random(64, np.dtype(np.int8), rng), random(1, np.dtype(np.int8), rng)
    for function in (Function.SHIFT_LEFT, Function.AND):
        launch = plan_launch(function, True, [a, one], aligned(64, np.dtype(np.int8)))
        assert launch is not None
        assert launch.key[2] == np.dtype(np.int8).str
        assert launch.elements == 64
        assert launch.b_scalar


def test_what_the_wide_kernels_leave_to_the_element_wise_ones() -> None:
    rng = np.random.default_rng(2)
    u8, i16 = np.dtype(np.uint8), np.dtype(np.int16)
    a, b = random(40, u8, rng), random(40, u8, rng)
    refused = {
        "unaligned input": ([aligned(40, u8, offset=1), b], aligned(40, u8)),
        "unaligned output": ([a, b], aligned(40, u8, offset=1)),
        "strided input": ([random(80, u8, rng)[::2], b], aligned(40, u8)),
        "broadcast first operand": ([a[:1], b], aligned(40, u8)),
        "other element count": ([a, b[:20]], aligned(40, u8)),
        "mixed types": ([a, random(40, np.dtype(np.int8), rng)], aligned(40, u8)),
        "bool with uint8": ([a.view(np.bool_), b], aligned(40, u8)),
        "big-endian": (
            [aligned(20, i16).view(">i2"), aligned(20, i16).view(">i2")],
            aligned(20, i16).view(">i2"),
        ),
        "empty": ([a[:0], b[:0]], aligned(0, u8)),
    }
    for why, (operands, out) in refused.items():
        assert plan_launch(Function.AND, None, operands, out) is None, why
    # BOOL has no shift and no population count.
    flags = a.view(np.bool_)
    assert plan_launch(Function.SHIFT_LEFT, True, [flags, flags], aligned(40, flags.dtype)) is None
    assert plan_launch(Function.COUNT, None, [flags], aligned(40, u8)) is None
    # Population counts of signed elements, or into another type, stay element-wise.
    signed = random(16, np.dtype(np.int8), rng)
    assert plan_launch(Function.COUNT, None, [signed], aligned(16, u8)) is None
    assert plan_launch(Function.COUNT, None, [a], aligned(40, np.dtype(np.uint16))) is None


def test_every_function_has_a_lane_body_or_is_refused() -> None:
    a = aligned(32, np.dtype(np.uint8))
    for function in Function:
        launch = plan_launch(function, True, [a, a], aligned(32, np.dtype(np.uint8)))
        if launch is not None:
            name, code = kernel_source(launch.key, SHIFT_BODY, POPCOUNT_BODY)
            assert f"void {name}(" in code
            assert "BODY" not in code
            assert "LEFT" not in code


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17])
def test_launch_covers_exactly_the_elements(size: int) -> None:
    a = aligned(size, np.dtype(np.uint32))
    launch = plan_launch(Function.NOT, None, [a], aligned(size, np.dtype(np.uint32)))
    if size == 0:
        assert launch is None
        return
    assert launch is not None
    assert launch.elements * np.dtype(launch.key[2]).itemsize == size * 4
