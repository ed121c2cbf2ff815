"""The graph models one server serves beside its operators: loaded through the repository
extension (a configuration and one file, as Triton's ``load`` takes them: an ONNX file, or a
graph in the /v1 binding model, as the configuration's backend says) or from the model
repository folder at start, unloaded by name.

``GraphModels`` holds them by name. Readers (every inference, every metadata route) look a name
up in whichever dict is current, without a lock; writers (load, unload) build a new dict under
the lock and swap it in. A load reads the configuration first, then the file under
``GraphLimits`` or the batch API's bounds (every bound before any parsing) and checks the
configuration against it before anything changes: a refused load leaves
the models as they were. Models the folder held but that could not be loaded are kept with the
reason (``failed``), for the repository index."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from tensorbits.core.batch import BatchLimits
from tensorbits.core.graphs.binding_graph import read_binding_graph
from tensorbits.core.graphs.limits import GraphLimits
from tensorbits.core.graphs.names import check_name
from tensorbits.core.graphs.program import GraphProgram, OnnxGraph
from tensorbits.core.graphs.reader import read_onnx
from tensorbits.core.graphs.refusals import invalid, too_large
from tensorbits.core.graphs.spec import ValueDecl
from tensorbits.core.graphs.triton_config import (
    BINDING,
    FORMATS,
    ONNX,
    GraphFormat,
    check_config,
    graph_format,
    model_config,
    read_config,
    served_version,
)
from tensorbits_protocol.errors import PayloadTooLarge

GRAPH_VERSION = "1"
# The files a graph model may be, as a load request's parameters name them (one of them).
MODEL_FILES = tuple(f"file:{GRAPH_VERSION}/{form.file}" for form in FORMATS)


@dataclass(frozen=True, slots=True)
class GraphModel:
    """A loaded graph model: its name, what it runs (``program.GraphProgram``: its inputs,
    outputs, plans and runs, whatever kind of graph it was made from), its configuration."""

    name: str
    program: GraphProgram
    config: Mapping[str, Any]
    version: str = GRAPH_VERSION

    @property
    def inputs(self) -> tuple[ValueDecl, ...]:
        return self.program.inputs

    @property
    def outputs(self) -> tuple[ValueDecl, ...]:
        return self.program.outputs

    @property
    def max_batch_size(self) -> int:
        """Triton's: above 0, each request's first dimension is its batch, at most this."""
        return int(self.config.get("max_batch_size", 0))


class Configuration(NamedTuple):
    """A load's configuration, read and checked on its own: its document, and the format of
    the file it names (``triton_config.FORMATS``)."""

    document: dict[str, Any]
    form: GraphFormat

    @property
    def file_parameter(self) -> str:
        """The load request's parameter that carries the file: ``file:1/model.onnx``."""
        return f"file:{GRAPH_VERSION}/{self.form.file}"


def configuration(name: str, config_text: str | bytes) -> Configuration:
    document = read_config(config_text, name)
    return Configuration(document, graph_format(document))


def _read_onnx(data: bytes, limits: GraphLimits, batch_limits: BatchLimits) -> GraphProgram:
    return OnnxGraph(read_onnx(data, limits))


def _read_binding(data: bytes, limits: GraphLimits, batch_limits: BatchLimits) -> GraphProgram:
    if len(data) > limits.max_model_bytes:  # read_onnx checks its own, first of all
        raise too_large(
            "model", "max_model_bytes", f"{len(data)} bytes of file", limits.max_model_bytes
        )
    return read_binding_graph(data, batch_limits)


# Each format's reader: the file's bytes made the model's program, every bound checked first.
READERS: Mapping[GraphFormat, Callable[[bytes, GraphLimits, BatchLimits], GraphProgram]] = (
    MappingProxyType({ONNX: _read_onnx, BINDING: _read_binding})
)


def build(
    name: str,
    config: str | bytes | Configuration,
    data: bytes,
    limits: GraphLimits,
    batch_limits: BatchLimits,
    version: str = GRAPH_VERSION,
) -> GraphModel:
    """A graph model from its configuration (its text, or read already) and its file, every
    bound checked before what it bounds is parsed (the configuration's first: it is small)."""
    read = config if isinstance(config, Configuration) else configuration(name, config)
    served_version(read.document, [int(version)])  # its version policy serves this version
    program = READERS[read.form](data, limits, batch_limits)
    check_config(read.document, program)
    answer = model_config(name, program, read.form, read.document)
    return GraphModel(name, program, answer, version)


def check_room(name: str, loaded: Collection[str], max_loaded: int) -> None:
    """Whether graph model ``name`` has room beside the ``loaded`` ones (its own name replaced
    takes none): the one refusal of ``TENSORBITS_MAX_LOADED_MODELS``, for one worker or all."""
    if name not in loaded and len(loaded) >= max_loaded:
        raise PayloadTooLarge(
            f"model_name: {len(loaded)} graph models are loaded, the most this server "
            f"holds ({max_loaded}, TENSORBITS_MAX_LOADED_MODELS): unload one first",
            field="model_name",
            rule="max_loaded_models",
        )


# How many unloaded graph models' names are remembered (``GraphModels.was_unloaded``).
MAX_REMEMBERED_UNLOADS = 1024


class GraphModels:
    """The graph models by name, and those the repository folder could not load (their reason)."""

    __slots__ = ("_failed", "_lock", "_models", "_unloaded", "is_builtin", "limits", "max_loaded")

    def __init__(
        self,
        limits: GraphLimits | None = None,
        max_loaded: int = 64,
        is_builtin: Callable[[str], bool] = lambda name: False,
    ) -> None:
        self.limits = limits or GraphLimits()
        self.max_loaded = max_loaded
        self.is_builtin = is_builtin
        self._lock = threading.Lock()
        self._models: dict[str, GraphModel] = {}
        self._failed: dict[str, str] = {}
        # The names unloaded and not loaded since, oldest first, so that a call of one is told
        # it was unloaded (and can be loaded again), not that the name is unknown. Bounded: a
        # client loading and unloading ever new names must not grow it without end.
        self._unloaded: dict[str, None] = {}

    def get(self, name: str) -> GraphModel | None:
        return self._models.get(name)

    def models(self) -> list[GraphModel]:
        return sorted(self._models.values(), key=lambda m: m.name)

    def failed(self) -> dict[str, str]:
        """The models the repository folder holds but could not load: their reasons."""
        return dict(self._failed)

    def was_unloaded(self, name: str) -> bool:
        """Whether graph model ``name`` was unloaded and not loaded since (of the last
        ``MAX_REMEMBERED_UNLOADS`` unloaded)."""
        return name in self._unloaded

    def load(
        self,
        name: str,
        config_text: str | bytes,
        files: Mapping[str, bytes],
        batch_limits: BatchLimits,
        *,
        serve: bool = True,
    ) -> GraphModel:
        """Load (or replace) graph model ``name`` from a load request's configuration and files
        (the one file its format names: ``{"file:1/model.onnx": data}``); refused naming the
        part and the rule, nothing changed. A binding graph's file is read under the batch
        API's bounds (``batch_limits``). ``serve=False``: built and returned, not served (the
        model store decides its room for every worker first)."""
        check_name(name, self.is_builtin)
        read = configuration(name, config_text)
        wanted = read.file_parameter
        for key in files:
            if key != wanted:
                raise invalid(
                    f"parameters.{key[:100]}",
                    "unsupported_file",
                    f"a graph model of backend {read.form.backend!r} is one file, {wanted!r}",
                )
        if wanted not in files:
            raise invalid(
                f"parameters.{wanted}", "missing_file", f"the file ({read.form.what}) is missing"
            )
        if serve:  # else the caller decides its room (the model store, for every worker)
            self._check_room(name)
        model = build(name, read, files[wanted], self.limits, batch_limits)
        if serve:
            self.add(model)
        return model

    def _check_room(self, name: str) -> None:
        check_room(name, self._models.keys(), self.max_loaded)

    def add(self, model: GraphModel) -> None:
        with self._lock:
            self._check_room(model.name)
            self._models = {**self._models, model.name: model}
            self._failed = {k: v for k, v in self._failed.items() if k != model.name}
            self._unloaded = {k: v for k, v in self._unloaded.items() if k != model.name}

    def fail(self, name: str, reason: str) -> None:
        """Remember that the repository folder's model ``name`` could not be loaded, and why (not
        for a built-in model's name: the built-in stays what the index says of it)."""
        if self.is_builtin(name):
            return
        with self._lock:
            self._failed = {**self._failed, name: reason}

    def unload(self, name: str) -> bool:
        """Remove graph model ``name`` (and any failure of that name); whether there was one."""
        with self._lock:
            found = name in self._models or name in self._failed
            self._models = {k: v for k, v in self._models.items() if k != name}
            self._failed = {k: v for k, v in self._failed.items() if k != name}
            if found:
                kept = [k for k in self._unloaded if k != name][1 - MAX_REMEMBERED_UNLOADS :]
                self._unloaded = dict.fromkeys([*kept, name])
        return found


__all__ = [
    "GRAPH_VERSION",
    "MODEL_FILES",
    "READERS",
    "Configuration",
    "GraphModel",
    "GraphModels",
    "build",
    "check_name",
    "check_room",
    "configuration",
]
