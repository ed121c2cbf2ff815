"""A v2 inference of a graph model, protocol-neutral: a decoded ``InferRequest`` checked against
the model and planned (``plan_request``), then run into host arrays the front end provides
(``run_request``). Inputs are matched to the graph's by name; the outputs asked for (every one
when the request names none) come back in the order asked, each as binary data or JSON data by
the request's and the output's ``binary_data`` parameters. Shared memory is not taken for a
graph model's tensors."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from tensorbits.backends.base import Backend
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.graphs.program import ModelPlan, PlannedTensor
from tensorbits.core.graphs.refusals import invalid
from tensorbits.core.plan import check_output
from tensorbits_protocol.dtypes import wire_dtype
from tensorbits_protocol.infer import UNSUPPORTED_OUTPUT_PARAMETERS, InferRequest, RequestLimits

HostArray = np.ndarray[Any, Any]
JSON_BYTES_PER_ELEMENT = 8


class AnsweredOutput(NamedTuple):
    """An output the response carries: the plan's, and whether as binary data."""

    planned: PlannedTensor
    binary: bool


class GraphRequest(NamedTuple):
    """A checked inference of a graph model, ready to run."""

    model: GraphModel
    plan: ModelPlan
    inputs: Mapping[str, HostArray]
    answered: tuple[AnsweredOutput, ...]
    request_id: str | None

    @property
    def needed_bytes(self) -> int:
        """Memory the run holds beyond the request's own bytes: the graph's inputs, outputs and
        work (``ModelPlan.needed_bytes``), and JSON text for outputs sent as JSON."""
        return self.plan.needed_bytes + sum(
            math.prod(a.planned.shape) * JSON_BYTES_PER_ELEMENT
            for a in self.answered
            if not a.binary
        )

    @property
    def work_bytes(self) -> int:
        return self.needed_bytes


def _answered(
    plan: ModelPlan, request: InferRequest, limits: RequestLimits
) -> tuple[AnsweredOutput, ...]:
    by_name = {o.name: o for o in plan.outputs}
    default = request.binary_output
    if request.outputs is None:
        chosen = [(o, default) for o in plan.outputs]
    else:
        chosen = []
        seen: set[str] = set()
        for output in request.outputs:
            name = output.name[:100]
            if output.name not in by_name:
                raise invalid(
                    name, "unknown_output",
                    f"the model has no output of that name (outputs: {', '.join(by_name)})",
                )  # fmt: skip
            if output.name in seen:
                raise invalid(name, "duplicate_output", "the output is requested more than once")
            seen.add(output.name)
            if output.shared_memory is not None:
                raise invalid(
                    name, "shared_memory", "a graph model's outputs do not go to shared memory"
                )
            for key, what in UNSUPPORTED_OUTPUT_PARAMETERS.items():
                if key in output.parameters:
                    raise invalid(
                        name, "unsupported_parameter", f"parameters.{key}: {what} is not supported"
                    )
            binary = default if output.binary is None else output.binary
            chosen.append((by_name[output.name], binary))
    for planned, binary in chosen:
        check_output(planned.name, planned.datatype, planned.shape, binary, limits)
    return tuple(AnsweredOutput(p, b) for p, b in chosen)


def plan_request(model: GraphModel, request: InferRequest, limits: RequestLimits) -> GraphRequest:
    """``request`` checked against ``model`` and planned (a refusal names the tensor, or the
    node whose rule the shapes break, and the rule)."""
    declared = {decl.name: decl for decl in model.inputs}
    for tensor in request.inputs:
        name = tensor.name[:100]
        if tensor.shared_memory is not None:
            raise invalid(
                name, "shared_memory", "a graph model's inputs do not come from shared memory"
            )
        decl = declared.get(tensor.name)
        if decl is not None and tensor.datatype != decl.datatype:
            raise invalid(
                name,
                "datatype",
                f"{tensor.datatype.value}; the model takes {decl.datatype.value}",
            )
    plan = model.program.plan({t.name: t.shape for t in request.inputs})
    answered = _answered(plan, request, limits)
    arrays = {tensor.name: tensor.array() for tensor in request.inputs}
    return GraphRequest(model, plan, arrays, answered, request.id)


def output_arrays(request: GraphRequest) -> dict[str, HostArray]:
    """A fresh host array for every output of the plan."""
    return {o.name: np.empty(o.shape, wire_dtype(o.datatype)) for o in request.plan.outputs}


def run_request(
    request: GraphRequest, backend: Backend, outputs: Mapping[str, HostArray] | None = None
) -> dict[str, HostArray]:
    """Run the plan: every output of the graph into ``outputs`` where given (host arrays of the
    output's type and shape: the front end's response buffers), the others into fresh arrays.
    Returns every output's array by name."""
    arrays = output_arrays(request) if outputs is None else dict(outputs)
    for output in request.plan.outputs:
        if output.name not in arrays:
            arrays[output.name] = np.empty(output.shape, wire_dtype(output.datatype))
    request.model.program.run(request.plan, backend, request.inputs, arrays)
    return arrays


__all__ = [
    "AnsweredOutput",
    "GraphRequest",
    "output_arrays",
    "plan_request",
    "run_request",
]
