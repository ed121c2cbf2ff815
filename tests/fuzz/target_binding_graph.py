"""Coverage-guided fuzz target: binding graph models, ``read_binding_graph`` on any bytes.

The input is the model's file (``model.json``), read under small bounds (``LIMITS``: a few
buffers and dispatches, small headers and tensors) so that small inputs reach every one of
them. The property: it gives a program or raises a ``TensorbitsError``, nothing else; a program
then runs on inputs of its declared shapes, and answers each output with the bytes the same
buffers and dispatches give as a /v1 batch (``batch.run_batch``; a buffer padded past its tensor,
as DirectML sizes buffers, answered up to the tensor's end), whatever the caller's output arrays
held before.

By hand::

    .venv/bin/python tests/fuzz/target_binding_graph.py -max_total_time=600 tests/fuzz/corpus_binding_graph
"""

from __future__ import annotations

from typing import Any

from harness import fuzz, instrumented

with instrumented(__name__, "tensorbits", "tensorbits_protocol"):
    import numpy as np

    from tensorbits.core.backends.numpy_backend import NumpyBackend
    from tensorbits.core.batch import BatchLimits, run_batch
    from tensorbits.core.graphs.binding_graph import BindingPlan, read_binding_graph
    from tensorbits.core.limits import CoreLimits
    from tensorbits_protocol.dtypes import numpy_dtype
    from tensorbits_protocol.errors import TensorbitsError

LIMITS = BatchLimits.of(
    CoreLimits(
        max_tensors=8,
        max_tensor_elements=4096,
        max_json_elements=4096,
        max_json_depth=16,
        max_buffers=6,
        max_dispatches=8,
        max_batch_header_bytes=1 << 14,
        max_body_bytes=1 << 16,
    )
)
BACKEND = NumpyBackend(1)


def _as_batch(plan: BindingPlan, data: dict[int, bytes]) -> list[bytes]:
    """The output buffers as a /v1 batch of the same plan answers them: the input buffers'
    bytes in the body, in declaration order."""
    body = bytearray(b"".join(data[i] for i in sorted(data)))
    sinks = [bytearray(plan.batch.buffers[i].byte_size) for i in plan.batch.outputs]
    run_batch(plan.batch, body, BACKEND, [memoryview(s) for s in sinks])
    return [bytes(s) for s in sinks]


def TestOneInput(data: bytes) -> None:  # noqa: N802 (the name atheris and libFuzzer use)
    try:
        graph = read_binding_graph(data, LIMITS)
    except TensorbitsError:
        return
    # A binding graph's shapes are fixed: every dimension a size.
    plan = graph.plan(
        {d.name: [s for s in d.dims or () if isinstance(s, int)] for d in graph.inputs}
    )
    inputs = {
        name: np.arange(int(np.prod(t.shape)), dtype=numpy_dtype(t.datatype)).reshape(t.shape)
        for name, t in plan.input_specs.items()
    }
    outputs: dict[str, np.ndarray[Any, Any]] = {}
    for output in plan.outputs:
        dtype = numpy_dtype(output.datatype)
        held = np.full(int(np.prod(output.shape)) * dtype.itemsize, 0xA5, np.uint8)
        outputs[output.name] = held.view(dtype).reshape(output.shape)  # a response's old bytes
    graph.run(plan, BACKEND, {k: v.copy() for k, v in inputs.items()}, outputs)
    data_buffers = {  # each input's bytes, padded with zeros to its buffer's size
        i: inputs[n].tobytes().ljust(plan.batch.buffers[i].byte_size, b"\0")
        for i, n in plan.input_buffers.items()
    }
    answered = dict(zip(plan.batch.outputs, _as_batch(plan, data_buffers), strict=True))
    for output in plan.outputs:
        got = outputs[output.name].tobytes()  # a buffer's padding past its tensor not answered
        assert got == answered[output.buffer][: len(got)], output.name


if __name__ == "__main__":
    fuzz(TestOneInput)
