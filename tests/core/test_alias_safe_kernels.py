"""The NumPy kernels that may write their output over an input (``NumpyBackend.alias_safe``):
for every operator of the catalog, every data type it takes and every input of the output's type
and shape, the call run with ``out`` that input gives the bytes a separate ``out`` gets, in one
pass and in parallel chunks. A kernel that read an input after writing ``out`` (a second pass, a
sign looked at after the shift) would differ here. Every case proven is one the one rule of
writing over an input allows (``engine.writes_over``, which the HTTP front end's answer over the
request's body and a region's output over an input read from one both ask), and that rule allows
nothing else: not the broadcast input, not a popcount into another type, not a backend without
proven kernels.

The same holds when the other input is broadcast (one element, a row, a column, pdpd's padded
form), a view of separate memory read at many positions: the output written over the input of
its shape, whichever position that input has (a shift's value or its counts), gives the bytes a
separate ``out`` gets, and the broadcast input is left as it was."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tensorbits.core.backends import numpy_backend as nb
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.engine import run_into, writes_over
from tensorbits_protocol.dtypes import DataType, wire_dtype
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import OPERATORS, Function, OperatorSpec
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

Arr = np.ndarray[Any, Any]
SHIFTS = (Function.SHIFT, Function.SHIFT_LEFT, Function.SHIFT_RIGHT)
# Over 3 alignment blocks of 1-byte elements, not a multiple of any: the chunks end unevenly.
COUNT = 3 * nb.CHUNK_ALIGN_BYTES + 5
SHAPE = (COUNT,)


def _parameter_sets(op: OperatorSpec) -> list[dict[str, str]]:
    if op.function is Function.SHIFT:
        return [{"direction": "LEFT"}, {"direction": "RIGHT"}]
    if op.function is Function.COUNT:
        return [{"output_datatype": "UINT8"}, {"output_datatype": "UINT32"}]
    return [{}]


def _types(op: OperatorSpec) -> set[DataType]:
    return {dt for row in op.support for dt in row.input_types}


def _cases() -> Iterator[Any]:
    """Every (operator, type, parameters, input) whose input has the output's type and shape."""
    for op in OPERATORS:
        for dt in sorted(_types(op)):
            for params in _parameter_sets(op):
                call = validate_call(op, {n: TensorSpec(dt, SHAPE) for n in op.inputs}, params)
                if call.output_datatype != dt:
                    continue  # a popcount into another type: never written over its input
                for position in range(len(op.inputs)):
                    words = "-".join(params.values())
                    yield pytest.param(
                        op, dt, params, position, id=f"{op.name}-{dt}-{words}-over{position}"
                    )


CASES = list(_cases())


def _values(dt: DataType, rng: np.random.Generator, shape: tuple[int, ...] = SHAPE) -> Arr:
    dtype = wire_dtype(dt)
    count = math.prod(shape)
    if dt is DataType.BOOL:
        return rng.integers(0, 2, count).astype(dtype).reshape(shape)
    raw = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def _counts(dt: DataType, rng: np.random.Generator, shape: tuple[int, ...] = SHAPE) -> Arr:
    """Shift counts in range, at and past the width, negative where the type is signed, and the
    type's extremes (as many of them as there are elements)."""
    dtype = wire_dtype(dt)
    bits = dtype.itemsize * 8
    low = -3 if dtype.kind == "i" else 0
    counts = rng.integers(low, bits + 4, math.prod(shape)).astype(dtype)
    info = np.iinfo(dtype.str)  # by name: the stubs take an integer type only
    extremes = (info.min, info.max, bits, bits - 1)[: counts.size]
    counts[: len(extremes)] = extremes
    return counts.reshape(shape)


def _inputs(op: OperatorSpec, dt: DataType, seed: int) -> list[Arr]:
    rng = np.random.default_rng(seed)
    arrays = [_values(dt, rng) for _ in op.inputs]
    if op.function in SHIFTS:
        arrays[1] = _counts(dt, rng)
    return arrays


def _both_ways(backend: NumpyBackend, call: ResolvedCall, arrays: list[Arr], over: int) -> None:
    apart = np.empty(call.output_shape, wire_dtype(call.output_datatype))
    run_into(backend, call, [x.copy() for x in arrays], apart)
    inputs = [x.copy() for x in arrays]
    run_into(backend, call, inputs, inputs[over])
    assert inputs[over].tobytes() == apart.tobytes()
    for position, (x, given) in enumerate(zip(inputs, arrays, strict=True)):
        if position != over:
            assert x.tobytes() == given.tobytes()  # the other input untouched


def test_every_function_of_the_catalog_is_covered_here() -> None:
    """Every function the backend calls safe has cases here, and so has every operator."""
    covered = {case.values[0].function for case in CASES}
    assert NumpyBackend.alias_safe <= covered
    assert {case.values[0].name for case in CASES} == {op.name for op in OPERATORS}


@pytest.mark.parametrize(("op", "dt", "params", "over"), CASES)
def test_the_output_over_an_input_is_the_output_apart(
    op: OperatorSpec, dt: DataType, params: dict[str, str], over: int
) -> None:
    call = validate_call(op, {n: TensorSpec(dt, SHAPE) for n in op.inputs}, params)
    backend = NumpyBackend(threads=1)
    assert writes_over(call, backend, over, wire_dtype(dt), SHAPE)
    try:
        _both_ways(backend, call, _inputs(op, dt, seed=over), over)
    finally:
        backend.close()


@pytest.mark.parametrize(("op", "dt", "params", "over"), CASES)
def test_the_output_over_an_input_is_the_output_apart_in_chunks(
    op: OperatorSpec, dt: DataType, params: dict[str, str], over: int, monkeypatch: Any
) -> None:
    # Every call split into chunks on two threads, whatever its size.
    monkeypatch.setattr(nb, "PARALLEL_THRESHOLD_BYTES", 0)
    monkeypatch.setattr(nb, "MIN_CHUNK_BYTES", 1)
    call = validate_call(op, {n: TensorSpec(dt, SHAPE) for n in op.inputs}, params)
    backend = NumpyBackend(threads=2)
    try:
        _both_ways(backend, call, _inputs(op, dt, seed=7 + over), over)
    finally:
        backend.close()


# --- a broadcast input beside the one written over ----------------------------------------------
# The output: rows of a length that is no multiple of any alignment, so that the parallel chunks
# (split along the rows when an operand is broadcast) end unevenly.
ROWS, ROW = 7, nb.CHUNK_ALIGN_BYTES // 2 + 3
OUT = (ROWS, ROW)
# (name, the broadcast input's shape as sent, parameters): each broadcast onto ``OUT``; pdpd's
# second input is aligned on the first from ``axis``, its shape padded with 1s for the kernel.
FORMS: tuple[tuple[str, tuple[int, ...], dict[str, str | int]], ...] = (
    ("one", (1,), {}),
    ("one-2d", (1, 1), {}),
    ("row", (ROW,), {}),
    ("row-2d", (1, ROW), {}),
    ("column", (ROWS, 1), {}),
    ("pdpd-column", (ROWS,), {"auto_broadcast": "pdpd", "axis": 0}),
)


def _broadcast_cases() -> Iterator[Any]:
    """Every (operator, type, parameters, shapes sent, position of the input of the output's
    shape) of a binary operator that broadcasts, the other input in each form it accepts."""
    for op in OPERATORS:
        if len(op.inputs) != 2:
            continue
        for dt in sorted(_types(op)):
            for params in _parameter_sets(op):
                for form, shape, extra in FORMS:
                    for over in (0, 1):
                        shapes = (OUT, shape) if over == 0 else (shape, OUT)
                        given: dict[str, str | int] = {**params, **extra}
                        try:
                            _call(op, dt, given, shapes)
                        except InvalidRequest:
                            continue  # no broadcasting (DML), or pdpd onto the second input
                        words = "-".join(params.values())
                        yield pytest.param(
                            op,
                            dt,
                            given,
                            shapes,
                            over,
                            id=f"{op.name}-{dt}-{words}-{form}-over{over}",
                        )


def _call(
    op: OperatorSpec,
    dt: DataType,
    params: dict[str, str | int],
    shapes: tuple[tuple[int, ...], ...],
) -> ResolvedCall:
    specs = {n: TensorSpec(dt, s) for n, s in zip(op.inputs, shapes, strict=True)}
    return validate_call(op, specs, params)


BROADCAST_CASES = list(_broadcast_cases())


def _broadcast_inputs(
    op: OperatorSpec, dt: DataType, shapes: tuple[tuple[int, ...], ...], seed: int
) -> list[Arr]:
    rng = np.random.default_rng(seed)
    arrays = [_values(dt, rng, shape) for shape in shapes]
    if op.function in SHIFTS:
        arrays[1] = _counts(dt, rng, shapes[1])
    return arrays


def test_every_binary_function_of_the_catalog_is_covered_broadcast() -> None:
    """Every function the backend calls safe that takes two inputs has broadcast cases here, in
    every form it takes and over either input; the others take one input, which cannot be
    broadcast."""
    binary = {op.function for op in OPERATORS if len(op.inputs) == 2}
    assert all(len(op.inputs) == 1 for op in OPERATORS if op.function not in binary)
    for function in NumpyBackend.alias_safe & binary:
        cases = [case.values for case in BROADCAST_CASES if case.values[0].function is function]
        assert {over for *_, over in cases} == {0, 1}, function
        pdpd = any(o.function is function and "axis" in o.parameter_index for o in OPERATORS)
        for form, shape, extra in FORMS:
            if "axis" in extra and not pdpd:
                continue  # no operator of the function takes pdpd's rule
            assert any(
                shapes[1 - over] == shape and extra.items() <= params.items()
                for _, _, params, shapes, over in cases
            ), (function, form)


@pytest.mark.parametrize("threads", [1, 2], ids=["whole", "chunks"])
@pytest.mark.parametrize(("op", "dt", "params", "shapes", "over"), BROADCAST_CASES)
def test_the_output_over_an_input_beside_a_broadcast_is_the_output_apart(
    op: OperatorSpec,
    dt: DataType,
    params: dict[str, str | int],
    shapes: tuple[tuple[int, ...], ...],
    over: int,
    threads: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if threads > 1:  # every call split into chunks on two threads, whatever its size
        monkeypatch.setattr(nb, "PARALLEL_THRESHOLD_BYTES", 0)
        monkeypatch.setattr(nb, "MIN_CHUNK_BYTES", 1)
    call = _call(op, dt, params, shapes)
    assert call.output_shape == OUT
    backend = NumpyBackend(threads=threads)
    assert writes_over(call, backend, over, wire_dtype(dt), shapes[over])
    assert not writes_over(call, backend, 1 - over, wire_dtype(dt), shapes[1 - over])
    try:
        _both_ways(backend, call, _broadcast_inputs(op, dt, shapes, seed=over + threads), over)
    finally:
        backend.close()


class _UnprovenHost:
    """A backend on host memory whose kernels are not proven to write over an input: one that
    may place a call on a device keeps its output apart."""

    host_memory = True


def test_the_rule_allows_only_what_is_proven() -> None:
    """``writes_over`` for every operator, type and parameter set, over every input: allowed
    exactly where the output has that input's type and shape (the cases proven above), never
    for another backend, nor for an input of another type or shape than the output's."""
    backend = NumpyBackend(threads=1)
    try:
        proven = {(op.name, dt, tuple(params.items()), over) for op, dt, params, over in
                  (case.values for case in CASES)}  # fmt: skip
        for op in OPERATORS:
            for dt in sorted(_types(op)):
                for params in _parameter_sets(op):
                    call = validate_call(op, {n: TensorSpec(dt, SHAPE) for n in op.inputs}, params)
                    for over in range(len(op.inputs)):
                        allowed = writes_over(call, backend, over, wire_dtype(dt), SHAPE)
                        key = (op.name, dt, tuple(params.items()), over)
                        assert allowed == (key in proven), key
                        unproven: Any = _UnprovenHost()  # host memory, no proven kernels
                        assert not writes_over(call, unproven, over, wire_dtype(dt), SHAPE)
                        bigger = (COUNT + 1,)
                        assert not writes_over(call, backend, over, wire_dtype(dt), bigger)
    finally:
        backend.close()
