"""The models this server serves: one per operator, at one version, loaded unless the
repository extension has unloaded it. Every front end resolves a model name here."""

from __future__ import annotations

import threading

from tensorbits.core.graphs.models import GraphModel, GraphModels
from tensorbits_protocol.errors import ModelUnavailable, OperatorNotFound
from tensorbits_protocol.operators import REGISTRY, OperatorSpec, unknown_model

# A model this server serves: an operator (built in) or a graph model (loaded).
Model = OperatorSpec | GraphModel

MODEL_VERSION = "1"
MODEL_VERSIONS = (MODEL_VERSION,)


def version_of(model: Model) -> str:
    """The version ``model`` is served at: a graph model's own (its repository folder's, as its
    version policy chose it), a built-in model's ``MODEL_VERSION``. What every answer, the
    statistics extension, Triton's metric labels and the access log say of it."""
    return model.version if isinstance(model, GraphModel) else MODEL_VERSION


def unserved(name: str, graphs: GraphModels | None) -> OperatorNotFound:
    """The 404 of a name this server does not serve: a graph model unloaded is told so, with
    the way back; any other name is counted against what exists, the graph models too."""
    if graphs is not None and graphs.was_unloaded(name):
        return OperatorNotFound(
            f"model '{name[:100]}' was unloaded: it is a graph model, served again once loaded "
            f"with its file (POST /v2/repository/models/{name[:100]}/load)",
            field="model_name",
            rule="model_unloaded",
        )
    return unknown_model(name, [m.name for m in graphs.models()] if graphs is not None else ())


def resolve_model(
    name: str, version: str | None, graphs: GraphModels | None = None
) -> OperatorSpec:
    """The operator a v2 model name (and optional version) names; 404 for any other
    (``unserved``: ``graphs``, the graph models, are what else the 404 names)."""
    op = REGISTRY.get(name)
    if op is None:
        raise unserved(name, graphs)
    if version is not None and version not in MODEL_VERSIONS:
        raise OperatorNotFound(
            f"model '{op.name}' has no version '{version[:40]}' "
            f"(versions: {', '.join(MODEL_VERSIONS)})",
            field="model_version",
            rule="unknown_version",
        )
    return op


def resolve_served(graphs: GraphModels, name: str, version: str | None) -> Model:
    """The graph model or the operator a v2 model name (and optional version) names; 404 for
    any other."""
    graph = graphs.get(name)
    if graph is None:
        return resolve_model(name, version, graphs)
    if version is not None and version != graph.version:
        raise OperatorNotFound(
            f"model '{name[:100]}' has no version '{version[:40]}' (versions: {graph.version})",
            field="model_version",
            rule="unknown_version",
        )
    return graph


class ModelStates:
    """Which models the v2 repository extension has unloaded on this server (every other one is
    loaded): ``POST /v2/repository/models/{m}/unload`` and ``.../load``, as Triton clients expect.

    The operators stay compiled in; an unloaded one is only refused, by name, until it is loaded
    again. The state is this process's alone, like Triton's own repository: replicas share none.
    Writers (the load and unload routes) swap in a new frozenset under a lock; readers (every
    inference) test membership in whichever set is current, without the lock."""

    __slots__ = ("_lock", "_unloaded")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unloaded: frozenset[str] = frozenset()

    def load(self, name: str) -> None:
        with self._lock:
            self._unloaded = self._unloaded - {name}

    def unload(self, name: str) -> None:
        with self._lock:
            self._unloaded = self._unloaded | {name}

    def is_loaded(self, name: str) -> bool:
        return name not in self._unloaded

    def check_loaded(self, name: str) -> None:
        """Raise ModelUnavailable (400, FAILED_PRECONDITION over gRPC) naming the model, its
        state and the way back, if ``name`` is unloaded."""
        if name in self._unloaded:
            raise ModelUnavailable(
                f"model '{name}' is unloaded (state UNAVAILABLE): load it again with "
                f"POST /v2/repository/models/{name}/load",
                field="model_name",
                rule="model_unloaded",
            )


__all__ = [
    "MODEL_VERSION",
    "MODEL_VERSIONS",
    "Model",
    "ModelStates",
    "resolve_model",
    "resolve_served",
    "unserved",
    "version_of",
]
