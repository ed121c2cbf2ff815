"""What a graph model runs, whatever it was made from: its declared inputs and outputs, a plan
for one request's input shapes, and the run of a plan into the caller's output arrays.

Two kinds of graph meet this one interface, so the front ends, the model registry, metadata and
admission never ask which kind a model is: an ONNX file (``OnnxGraph``: ``reader``, ``plan``,
``run``) and a graph in the /v1 binding model (``binding_graph.BindingGraph``: buffers and
dispatches as DirectML binds them)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.graphs.plan import GraphPlan, PlanCache
from tensorbits.core.graphs.run import run_graph
from tensorbits.core.graphs.spec import GraphSpec, ValueDecl
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.validation import Shape, TensorSpec

HostArray = np.ndarray[Any, Any]


class PlannedTensor(Protocol):
    """An output as a plan gives it: its name, type and shape for this request."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> DataType: ...
    @property
    def shape(self) -> Shape: ...


class ModelPlan(Protocol):
    """A graph checked for one request's input shapes: what it takes, what it gives, and the
    memory a run holds (inputs, outputs, intermediates) for admission."""

    @property
    def input_specs(self) -> Mapping[str, TensorSpec]: ...
    @property
    def outputs(self) -> Sequence[PlannedTensor]: ...
    @property
    def needed_bytes(self) -> int: ...
    @property
    def step_count(self) -> int:
        """The kernels a run launches node by node (a graph's nodes, a binding graph's
        dispatches): what placement weighs against the copies to a device."""
        ...


class GraphProgram(Protocol):
    """A graph model's executable part (see the module's docstring)."""

    @property
    def inputs(self) -> tuple[ValueDecl, ...]: ...
    @property
    def outputs(self) -> tuple[ValueDecl, ...]: ...

    def plan(
        self, shapes: Mapping[str, Sequence[int]], outputs: Collection[str] | None = None
    ) -> ModelPlan:
        """The plan for inputs of ``shapes`` (by name) computing ``outputs`` (names of the
        model's; every one when None), or the refusal naming the input, or the node or
        dispatch whose rule they break. A plan's ``outputs`` are those it computes: the ones
        asked for, or more where the program cannot leave one out (a binding graph's
        dispatches write every buffer)."""
        ...

    def run(
        self,
        plan: ModelPlan,
        backend: Backend,
        inputs: Mapping[str, HostArray],
        outputs: Mapping[str, HostArray],
    ) -> None:
        """Run ``plan`` (one of this program's) on ``inputs``, writing every output into
        ``outputs[name]`` (arrays of the plan's types and shapes): host arrays, or on a device
        backend arrays on its device too (a CUDA region's), read and written where they are."""
        ...


class OnnxGraph:
    """An ONNX file read into a ``GraphSpec``: planned once per distinct input shapes
    (``PlanCache``), run fused where it can be (``run_graph``)."""

    __slots__ = ("plans", "spec")

    def __init__(self, spec: GraphSpec) -> None:
        self.spec = spec
        self.plans = PlanCache(spec)

    @property
    def inputs(self) -> tuple[ValueDecl, ...]:
        return self.spec.inputs

    @property
    def outputs(self) -> tuple[ValueDecl, ...]:
        return self.spec.outputs

    def plan(
        self, shapes: Mapping[str, Sequence[int]], outputs: Collection[str] | None = None
    ) -> GraphPlan:
        return self.plans.plan(shapes, outputs)

    def run(
        self,
        plan: ModelPlan,
        backend: Backend,
        inputs: Mapping[str, HostArray],
        outputs: Mapping[str, HostArray],
    ) -> None:
        assert isinstance(plan, GraphPlan)  # plans come from this program's plan()
        run_graph(plan, backend, inputs, outputs)


__all__ = ["GraphProgram", "ModelPlan", "OnnxGraph", "PlannedTensor"]
