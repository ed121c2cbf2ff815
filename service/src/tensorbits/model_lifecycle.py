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
serves the model."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.concurrency import run_in_threadpool

from tensorbits.core.graphs.models import MODEL_FILES
from tensorbits.core.models import ModelStates
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.operators import get_operator

CONFIG = "config"
FILE_PREFIX = "file:"


# What a load holds while it is decoded, in multiples of what it received: the request, the
# file's parsed or decoded copy (HTTP's base64 in the JSON, gRPC's bytes_param), and the JSON's
# text over HTTP. Admission counts it so (as an inference's plan is counted).
LOAD_COPIES = 3


def load_request_bytes(runtime: Runtime) -> int:
    """The most bytes a load request needs: a file of the largest size allowed, in base64 (HTTP
    sends it so), and a configuration, with room for the JSON around them; never more than
    TENSORBITS_MAX_BODY_BYTES."""
    settings = runtime.settings
    return min(settings.max_body_bytes, settings.max_model_bytes * 4 // 3 + (256 << 10))


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


async def load_model(
    runtime: Runtime, name: str, config: str | bytes | None, files: Mapping[str, bytes]
) -> None:
    """``POST /v2/repository/models/{name}/load`` and RepositoryModelLoad, decoded."""
    plane = runtime.plane
    if files:
        if config is None:
            raise InvalidRequest(
                f"parameters.{CONFIG}: a load with files needs the model's configuration "
                '(e.g. {"backend": "onnxruntime"})',
                field=f"parameters.{CONFIG}",
                rule="missing_config",
            )
        model = await run_in_threadpool(plane.load_graph, name, config, files)
        if runtime.store is not None:
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


def unload_model(runtime: Runtime, name: str) -> None:
    """``POST /v2/repository/models/{name}/unload`` and RepositoryModelUnload."""
    plane = runtime.plane
    if not plane.unload_graph(name):
        name = get_operator(name).name
        plane.models.unload(name)
    if runtime.store is not None:
        runtime.store.unloaded(name)


__all__ = [
    "check_file_size",
    "check_parameter_names",
    "load_model",
    "load_request_bytes",
    "unload_model",
]
