"""The repository extension's load and unload, as both front ends take them (HTTP's JSON body,
gRPC's ``RepositoryModelLoadRequest``, decoded by each into a configuration and files).

A load with files is Triton's way to bring a model from a client: here, a graph model (an ONNX
file and its configuration, ``core/graphs/models.py``), read on a worker thread (a large file
takes a while). A load without files loads a built-in model unloaded before (or leaves a graph
model loaded as it is). An unload removes a graph model (load it again with its file to bring
it back) or marks a built-in one unloaded.

With several workers, each load and unload is applied by the worker that took it, then written
to the model store the workers share (``model_store.py``), whence every other worker applies it:
an unload holds on every worker once it is written, and a load is answered once every worker
serves the model. A graph model's load is built first and served only once the store found it
room among every worker's models (``TENSORBITS_MAX_LOADED_MODELS`` counted once for all)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping

from starlette.concurrency import run_in_threadpool

from tensorbits.core.graphs.models import MODEL_FILES
from tensorbits.core.models import MODEL_VERSION, ModelStates
from tensorbits.logs import bounded
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import (
    InvalidRequest,
    ModelUnavailable,
    PayloadTooLarge,
    TensorbitsError,
)
from tensorbits_protocol.operators import get_operator

logger = logging.getLogger("tensorbits.models")

CONFIG = "config"
FILE_PREFIX = "file:"


# What a load holds while it is decoded, in multiples of what it received: the request and the
# file's decoded copy (HTTP's base64 decoded a block at a time, then joined: two copies of
# three quarters of the body; gRPC's bytes_param copied out of the message a block at a
# time, then joined). Admission counts
# it so (as an inference's plan is counted); the load's size is bounded apart (load_bounds.py).
LOAD_COPIES = 3


def check_parameter_names(names: list[str]) -> None:
    """A load takes ``config`` and files (``file:<path>``); nothing else."""
    for name in names:
        if name != CONFIG and not name.startswith(FILE_PREFIX):
            raise InvalidRequest(
                f"parameters.{name[:100]}: a load takes 'config' and a file "
                f"({' or '.join(repr(f) for f in MODEL_FILES)})",
                field=f"parameters.{name[:100]}",
                rule="unsupported_parameter",
            )


def check_file_size(name: str, size: int, runtime: Runtime) -> None:
    """A file's (decoded) size, checked before it is decoded or read."""
    bound = runtime.plane.graphs.limits.max_model_bytes
    if size > bound:
        raise PayloadTooLarge(
            f"parameters.{name[:100]}: the file is {size} bytes, more than the {bound} a graph "
            "model may have (TENSORBITS_MAX_MODEL_BYTES)",
            field=f"parameters.{name[:100]}",
            rule="max_model_bytes",
        )


# Triton's words for a load or unload in a mode other than explicit.
NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


def check_explicit(runtime: Runtime) -> None:
    """Loads and unloads through the API are the ``explicit`` model control mode's only
    (Triton's rule): in ``none`` the repository's models are fixed at start, in ``poll`` the
    folder decides. Refused as a state of the server (FAILED_PRECONDITION over gRPC)."""
    mode = runtime.settings.model_control_mode
    if mode != "explicit":
        raise ModelUnavailable(
            f"{NOT_EXPLICIT} (the model control mode is {mode!r}: "
            "TENSORBITS_MODEL_CONTROL_MODE=explicit allows them)",
            field="model_control_mode",
            rule="model_control_mode",
        )


def _lifecycle_line(runtime: Runtime, action: str, name: str, error: Exception | None) -> None:
    """The log line of a load or unload through the API, as the repository folder's loads have
    theirs (``model_repository.py``): the model, its version, where it came from, the outcome and
    why (a refusal's class and its words, bounded: they may quote the request)."""
    graph = runtime.plane.graphs.get(name)
    version = graph.version if graph is not None else MODEL_VERSION
    outcome = ("loaded" if action == "load" else "unloaded") if error is None else "refused"
    fields: dict[str, object] = {
        "model": bounded(name),
        "version": version,
        "action": action,
        "source": "api",
        "outcome": outcome,
    }
    if error is not None:
        refusal = error if isinstance(error, TensorbitsError) else None
        fields["refusal"] = refusal.code if refusal is not None else "internal"
        fields["rule"] = refusal.rule if refusal is not None else None
        fields["reason"] = bounded(refusal.message, 200) if refusal is not None else "error"
    said = outcome if error is None else f"{action} refused"
    logger.info("model %s %s", fields["model"], said, extra=fields)


Load = Callable[[Runtime, str, str | bytes | None, Mapping[str, bytes]], Awaitable[None]]


def _logs_load(load: Load) -> Load:
    @functools.wraps(load)
    async def logged(
        runtime: Runtime, name: str, config: str | bytes | None, files: Mapping[str, bytes]
    ) -> None:
        try:
            await load(runtime, name, config, files)
        except Exception as exc:
            _lifecycle_line(runtime, "load", name, exc)
            raise
        _lifecycle_line(runtime, "load", name, None)

    return logged


def _logs_unload(unload: Callable[[Runtime, str], None]) -> Callable[[Runtime, str], None]:
    @functools.wraps(unload)
    def logged(runtime: Runtime, name: str) -> None:
        try:
            unload(runtime, name)
        except Exception as exc:
            _lifecycle_line(runtime, "unload", name, exc)
            raise
        _lifecycle_line(runtime, "unload", name, None)

    return logged


@_logs_load
async def load_model(
    runtime: Runtime, name: str, config: str | bytes | None, files: Mapping[str, bytes]
) -> None:
    """``POST /v2/repository/models/{name}/load`` and RepositoryModelLoad, decoded."""
    plane = runtime.plane
    check_explicit(runtime)
    if files:
        if config is None:
            raise InvalidRequest(
                f"parameters.{CONFIG}: a load with files needs the model's configuration "
                '(e.g. {"backend": "onnxruntime"})',
                field=f"parameters.{CONFIG}",
                rule="missing_config",
            )
        if runtime.store is None:
            await run_in_threadpool(plane.load_graph, name, config, files)
            return
        # Built, not served: its room is the store's to decide, for every worker at once.
        model = await run_in_threadpool(
            functools.partial(plane.graphs.load, serve=False),
            name,
            config,
            files,
            plane.batch_limits,
        )
        generation = await run_in_threadpool(runtime.store.loaded, name, config, files, model)
        if generation is not None:
            await runtime.store.served_everywhere(generation)
        return
    if plane.graphs.get(name) is not None:
        if config is not None:
            raise InvalidRequest(
                f"parameters.{CONFIG}: a graph model's configuration comes with its file "
                f"({' or '.join(repr(f) for f in MODEL_FILES)})",
                field=f"parameters.{CONFIG}",
                rule="missing_file",
            )
        return  # loaded already: Triton's load of a loaded model is a no-op
    op = get_operator(name)  # 404 for any name that is neither
    if config is not None:
        raise InvalidRequest(
            f"parameters.{CONFIG}: {op.name} is a built-in model: its configuration is the "
            "operator's, fixed",
            field=f"parameters.{CONFIG}",
            rule="unsupported_parameter",
        )
    ModelStates.load(plane.models, op.name)
    if runtime.store is not None:
        generation = runtime.store.reloaded(op.name)
        if generation is not None:
            await runtime.store.served_everywhere(generation)


@_logs_unload
def unload_model(runtime: Runtime, name: str) -> None:
    """``POST /v2/repository/models/{name}/unload`` and RepositoryModelUnload."""
    plane = runtime.plane
    check_explicit(runtime)
    if not plane.unload_graph(name):
        name = get_operator(name).name
        plane.models.unload(name)
    if runtime.store is not None:
        runtime.store.unloaded(name)


__all__ = [
    "check_explicit",
    "check_file_size",
    "check_parameter_names",
    "load_model",
    "unload_model",
]
