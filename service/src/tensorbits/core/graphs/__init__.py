"""Graph models: a chain of the family's operators served as a model, whatever file it came
from (``program.GraphProgram``: declared inputs and outputs, a plan per input shapes, a run).
An ONNX file is read under bounds (``reader.read_onnx``, ``limits.GraphLimits``), planned once
per distinct input shapes (``plan.plan_graph``, ``plan.PlanCache``) and run fused where it can
be (``run.run_graph``); a graph in the /v1 binding model is checked by the batch planner and run
as its batch runs (``binding_graph``). The configuration says which (``triton_config.FORMATS``).
Protocol-neutral: the front ends load the files and serve the requests."""

from tensorbits.core.graphs.limits import GraphLimits
from tensorbits.core.graphs.plan import GraphPlan, PlanCache, plan_graph
from tensorbits.core.graphs.reader import read_onnx
from tensorbits.core.graphs.run import run_graph
from tensorbits.core.graphs.spec import GraphNode, GraphSpec, ValueDecl

__all__ = [
    "GraphLimits",
    "GraphNode",
    "GraphPlan",
    "GraphSpec",
    "PlanCache",
    "ValueDecl",
    "plan_graph",
    "read_onnx",
    "run_graph",
]
