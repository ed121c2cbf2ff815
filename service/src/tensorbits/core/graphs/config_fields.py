"""What this server does with each field of Triton's ``ModelConfig`` (``model_config.proto``,
whole) in a graph model's configuration: honoured, taken and not acted on (with why it changes
nothing here), or refused (with why it cannot be honoured). The rules are data: the reader
(``triton_config.read_config``) applies them, docs/graph-models.md shows them ("Coming from
Triton"), and a test holds every field of the schema to a row, so a field Triton adds is
refused until it has one.

A refused field is refused only when it says something: a message holding nothing, an empty
list, a value at its default is as if left out (protobuf does not tell them apart)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple


class Treatment(StrEnum):
    HONOURED = "honoured"
    IGNORED = "ignored"
    REFUSED = "refused"


class FieldRule(NamedTuple):
    treatment: Treatment
    reason: str


def _honoured(reason: str) -> FieldRule:
    return FieldRule(Treatment.HONOURED, reason)


def _ignored(reason: str) -> FieldRule:
    return FieldRule(Treatment.IGNORED, reason)


def _refused(reason: str) -> FieldRule:
    return FieldRule(Treatment.REFUSED, reason)


NO_MERGING = "this server runs each request as it comes, on its own: it merges none into a batch"

# ModelConfig's fields, in the proto's order.
MODEL_FIELDS: Mapping[str, FieldRule] = MappingProxyType(
    {
        "name": _honoured("the model's name: must be the name it is loaded under"),
        "platform": _honoured(
            "which format the file is: onnxruntime_onnx (model.onnx) or tensorbits_graph "
            "(model.json); any other is refused"
        ),
        "backend": _honoured(
            "which format the file is: onnxruntime (model.onnx) or tensorbits (model.json); any "
            "other is refused"
        ),
        "runtime": _ignored(
            "the library that runs a backend: here the server's own reader runs the format "
            "that backend or platform names"
        ),
        "version_policy": _honoured(
            "which version is served: latest (the highest), specific, or all; one version of a "
            "graph model is served, so a policy selecting several of the versions present is "
            "refused"
        ),
        "max_batch_size": _honoured(
            "above 0, each input's and output's first dimension is the batch, left out of dims; "
            "a request's batch is at most max_batch_size"
        ),
        "input": _honoured("each must agree with the file (name, data_type, dims)"),
        "output": _honoured("each must agree with the file (name, data_type, dims)"),
        "batch_input": _refused(
            f"a tensor the dynamic batcher makes when it merges requests: {NO_MERGING}, so "
            "nothing would make it"
        ),
        "batch_output": _refused(
            f"an output the dynamic batcher scatters over merged requests: {NO_MERGING}"
        ),
        "optimization": _ignored(
            "how a backend tunes its run (graph optimization level, accelerators, CUDA graphs, "
            "priority, pinned memory): the answers are the same tensors; the operators here run "
            "on the server's own backend"
        ),
        "dynamic_batching": _ignored(
            f"{NO_MERGING}; merging would change when an answer comes, not what it is, and "
            "would not pay: one launch for 16 or 64 small requests saves 4-8% of a request's "
            "server CPU, the rest being HTTP, parsing and answering (docs/benchmarks.md, Settled)"
        ),
        "sequence_batching": _refused(
            "a sequence batcher routes a sequence's requests to one instance, feeds the model "
            "control tensors and keeps state between them: this server keeps no sequence and "
            "feeds no control tensor"
        ),
        "ensemble_scheduling": _refused(
            "an ensemble runs other models in steps: a graph model here is one file (chain the "
            "operators in one ONNX graph)"
        ),
        "instance_group": _ignored(
            "how many copies of the model run, and on which device: this server runs every "
            "graph model on its own backend and threads, and a copy computes what any other does"
        ),
        "default_model_filename": _honoured(
            "the file in a version folder: model.onnx (model.json for a binding graph), the only "
            "name read; another is refused"
        ),
        "cc_model_filenames": _ignored(
            "a file per GPU compute capability (TensorRT plans): the graph here is one file for "
            "every device"
        ),
        "metric_tags": _ignored(
            "labels for Triton's metrics: /metrics here labels a model's series by its name"
        ),
        "parameters": _ignored(
            "settings for the backend that runs the model: the operators here take theirs from "
            "the graph's nodes, not from the configuration"
        ),
        "model_warmup": _ignored(
            "requests run before the model is served, to warm caches: a graph model here is "
            "planned when it is loaded, and its first request computes what any other does"
        ),
        "model_operations": _refused(
            "a library of custom operators to load: this server runs the family's operators only"
        ),
        "model_transaction_policy": _refused(
            "decoupled: a model answering a request with any number of responses: a graph model "
            "here answers each request once"
        ),
        "model_repository_agents": _refused(
            "agents that change the repository's files before the load (decryption, checksums): "
            "this server runs none, and would read such a file unchanged"
        ),
        "response_cache": _ignored(
            "Triton's cache of answers: a graph model's answer is a function of its inputs, so "
            "a cache changes when an answer comes, not what it is"
        ),
        "model_metrics": _ignored(
            "buckets of Triton's latency histograms: /metrics here has its own"
        ),
    }
)

_TENSOR_COMMON: Mapping[str, FieldRule] = {
    "name": _honoured("a name the file declares"),
    "data_type": _honoured("the file's type for it"),
    "dims": _honoured("the file's shape (without the batch when max_batch_size > 0), -1 variable"),
    "reshape": _refused("this server gives the graph the shape the request has, reshaping none"),
    "is_shape_tensor": _refused("the family's operators take no shape tensors"),
    "is_non_linear_format_io": _ignored("a TensorRT layout: the tensors here are row-major"),
}

# ModelInput's and ModelOutput's fields.
TENSOR_FIELDS: Mapping[str, Mapping[str, FieldRule]] = MappingProxyType(
    {
        "input": MappingProxyType(
            {
                **_TENSOR_COMMON,
                "format": _ignored(
                    "an image layout (NHWC, NCHW) for backends that convert: the graph takes "
                    "the shape as the request sends it"
                ),
                "allow_ragged_batch": _ignored(
                    f"how the dynamic batcher may merge requests of other shapes: {NO_MERGING}"
                ),
                "optional": _refused("every input the graph declares is needed to run it"),
            }
        ),
        "output": MappingProxyType(
            {
                **_TENSOR_COMMON,
                "label_filename": _ignored(
                    "labels for the classification extension: this server answers tensors"
                ),
            }
        ),
    }
)


def fields(treatment: Treatment, table: Mapping[str, FieldRule] = MODEL_FIELDS) -> list[str]:
    """The fields of ``table`` with that treatment, in its order."""
    return [name for name, rule in table.items() if rule.treatment is treatment]


__all__ = ["MODEL_FIELDS", "TENSOR_FIELDS", "FieldRule", "Treatment", "fields"]
