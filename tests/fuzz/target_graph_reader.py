"""Coverage-guided fuzz target: graph models, ``graphs.read_onnx`` on any bytes.

The input is the ONNX file itself, read under small bounds (``LIMITS``) so that small inputs
reach every one of them. The property: it gives a ``GraphSpec`` or raises a ``TensorbitsError``,
nothing else. A spec is then planned for its inputs' declared shapes (each symbolic dimension
2) and, when that is small, run fused and node by node on the NumPy backend: the plan is
refused with a ``TensorbitsError`` or runs, and both ways give the same bytes.

By hand::

    .venv/bin/python tests/fuzz/target_graph_reader.py -max_total_time=600 tests/fuzz/corpus_graph_reader
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness import fuzz, instrumented

with instrumented(__name__, "tensorbits", "tensorbits_protocol"):
    import numpy as np

    from tensorbits.core.backends.numpy_backend import NumpyBackend
    from tensorbits.core.graphs import GraphLimits, GraphPlan, plan_graph, read_onnx, run_graph
    from tensorbits_protocol.dtypes import numpy_dtype
    from tensorbits_protocol.errors import TensorbitsError

LIMITS = GraphLimits(
    max_model_bytes=1 << 16,
    max_nodes=16,
    max_initializers=4,
    max_initializer_bytes=4096,
    max_name_chars=32,
    max_depth=8,
    max_inputs=4,
    max_outputs=4,
    max_fields=1024,
)
MAX_ELEMENTS = 4096
BACKEND = NumpyBackend(1)


def _outputs(plan: GraphPlan) -> dict[str, np.ndarray[Any, Any]]:
    return {o.name: np.zeros(o.shape, numpy_dtype(o.datatype)) for o in plan.outputs}


def TestOneInput(data: bytes) -> None:  # noqa: N802 (the name atheris and libFuzzer use)
    try:
        spec = read_onnx(data, LIMITS)
    except TensorbitsError:
        return
    shapes = {
        d.name: tuple(s if isinstance(s, int) else 2 for s in d.dims or ()) for d in spec.inputs
    }
    try:
        plan = plan_graph(spec, shapes, piece_bytes=64)
    except TensorbitsError:
        return
    sizes = [int(np.prod(s.shape)) for s in plan.slots]
    if sum(sizes) > MAX_ELEMENTS:
        return
    inputs = {
        name: np.arange(int(np.prod(t.shape)), dtype=numpy_dtype(t.datatype)).reshape(t.shape)
        for name, t in plan.input_specs.items()
    }
    fused = _outputs(plan)
    run_graph(plan, BACKEND, inputs, fused)
    one_by_one = _outputs(plan)
    run_graph(dataclasses.replace(plan, fused=False), BACKEND, inputs, one_by_one)
    for name, array in fused.items():
        assert array.tobytes() == one_by_one[name].tobytes(), name


if __name__ == "__main__":
    fuzz(TestOneInput)
