"""A plan template's run decided once (``NumpyBackend.bound``): for every operator of the
catalog, every type it takes and each input form (the output's shape, a one-element and a row
broadcast, pdpd's padded form where the operator takes it), the bound run writes the bytes the
backend's ``run`` writes, for arrays other than the ones it was bound with; it makes views only
where ``run`` makes them, and none where the work is shared among threads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tensorbits.core.backends import numpy_backend as nb
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits_protocol.dtypes import DataType, wire_dtype
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import OPERATORS, Encoding, Function, OperatorSpec
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

Arr = np.ndarray[Any, Any]
# Shapes of the inputs: the same, one element, a row, 0-d (a scalar), 0-d against one element.
FORMS = {
    "same": ((3, 5), (3, 5)), "one": ((3, 5), (1,)), "row": ((3, 5), (5,)), "0-d": ((), ()),
    "0-d and one": ((), (1,)),
}  # fmt: skip


def _parameters(op: OperatorSpec) -> dict[str, str]:
    if op.function is Function.SHIFT:
        return {"direction": "RIGHT"}
    if op.function is Function.COUNT:
        return {"output_datatype": "UINT8"}
    return {}


def _calls() -> Iterator[Any]:
    for op in OPERATORS:
        for dt in sorted({dt for row in op.support for dt in row.input_types}):
            for form, shapes in FORMS.items():
                specs = {n: TensorSpec(dt, s) for n, s in zip(op.inputs, shapes, strict=False)}
                try:
                    call = validate_call(op, specs, _parameters(op))
                except InvalidRequest:
                    continue  # a form the operator does not take
                yield pytest.param(call, dt, shapes[: len(op.inputs)], id=f"{op.name}-{dt}-{form}")


CALLS = list(_calls())


Shapes = tuple[tuple[int, ...], ...]


def _inputs(dt: DataType, shapes: Shapes, seed: int) -> list[Arr]:
    rng = np.random.default_rng(seed)
    dtype = wire_dtype(dt)
    arrays = []
    for shape in shapes:
        raw: Arr = rng.integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
        if dt is DataType.BOOL:
            raw = raw & 1
        arrays.append(raw.view(dtype).reshape(shape))
    return arrays


def test_every_operator_and_type_is_covered() -> None:
    named = {param.values[0].op.name for param in CALLS}
    assert named == {op.name for op in OPERATORS}
    assert any(param.values[0].op.encoding is Encoding.NATIVE_BITS for param in CALLS)


@pytest.mark.parametrize(("call", "dt", "shapes"), CALLS)
def test_a_bound_run_writes_what_run_writes(
    call: ResolvedCall, dt: DataType, shapes: Shapes
) -> None:
    backend = NumpyBackend(threads=1)
    run = backend.bound(call, _inputs(dt, shapes, 1))
    assert run is not None
    for seed in (2, 3):  # arrays other than the ones it was bound with
        inputs = _inputs(dt, shapes, seed)
        expected = np.empty(call.output_shape, wire_dtype(call.output_datatype))
        backend.run(call, inputs, expected)
        got = np.zeros_like(expected)
        run(inputs, got)
        assert got.tobytes() == expected.tobytes()


def test_views_are_made_only_where_run_makes_them() -> None:
    """A call on unsigned types in its own shapes runs its kernel on the arrays as they are; a
    signed DirectML call views them as its unsigned bits, and its answer is still run's."""
    backend = NumpyBackend(threads=1)
    op = next(op for op in OPERATORS if op.name == "DML_OPERATOR_ELEMENT_WISE_BIT_NOT")
    plain = validate_call(op, {"InputTensor": TensorSpec(DataType.UINT8, (4,))}, {})
    viewed = validate_call(op, {"InputTensor": TensorSpec(DataType.INT16, (4,))}, {})
    bound_plain = backend.bound(plain, _inputs(DataType.UINT8, ((4,),), 1))
    bound_viewed = backend.bound(viewed, _inputs(DataType.INT16, ((4,),), 1))
    assert bound_plain is not None
    assert bound_viewed is not None
    assert getattr(bound_plain, "args", None) is not None  # the kernel itself, arguments bound
    assert getattr(bound_viewed, "args", None) is None  # views made at each run
    x = np.array([1, -2, 300, -32768], np.int16)
    out = np.empty(4, np.int16)
    bound_viewed([x], out)
    assert out.tolist() == (~x).tolist()


def test_work_shared_among_threads_is_not_bound() -> None:
    op = next(op for op in OPERATORS if op.name == "DML_OPERATOR_ELEMENT_WISE_BIT_NOT")
    count = nb.PARALLEL_THRESHOLD_BYTES  # input and output: twice the threshold
    call = validate_call(op, {"InputTensor": TensorSpec(DataType.UINT8, (count,))}, {})
    x = np.zeros(count, np.uint8)
    assert NumpyBackend(threads=2).bound(call, [x]) is None
    assert NumpyBackend(threads=1).bound(call, [x]) is not None
