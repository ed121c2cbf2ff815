"""Triton's shared-memory extensions over HTTP: register, status, unregister, for system
regions (``/v2/systemsharedmemory``) and CUDA regions (``/v2/cudasharedmemory``, the CuPy
backend only).

The regions themselves, and every check on them, are ``shared_memory.SharedMemoryRegions``'s;
the gRPC RPCs of the same names answer from it too. With the extensions off (the default) every
route answers 400 saying how to turn them on, as every shared-memory tensor parameter does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from tensorbits.api import v2_openapi
from tensorbits.api.body import read_body
from tensorbits.api.deps import RuntimeDep
from tensorbits.core.shared_memory import Kind, SharedMemoryRegions, switched_on
from tensorbits.runtime import Runtime
from tensorbits_protocol.jsondata import JsonLimits, parse_json
from tensorbits_protocol.schema_errors import validate_document
from tensorbits_protocol.v2 import (
    CudaSharedMemoryRegion,
    CudaSharedMemoryRegisterRequest,
    SystemSharedMemoryRegion,
    SystemSharedMemoryRegisterRequest,
)

router = APIRouter(prefix="/v2/systemsharedmemory", tags=["v2 shared memory"])
cuda_router = APIRouter(prefix="/v2/cudasharedmemory", tags=["v2 shared memory"])

REGISTER_BODY_MAX_BYTES = 4 << 10
REGISTER_JSON_LIMITS = JsonLimits(max_depth=2, max_values=8)
_DONE: dict[int | str, dict[str, Any]] = {200: {"description": "Done (empty body)"}}
_Registration = TypeVar("_Registration", bound=BaseModel)


class _Extension(NamedTuple):
    """One of the two extensions: its kind of region, routes, status entry, and names (the
    routes' names are their OpenAPI operation ids' start)."""

    kind: Kind
    router: APIRouter
    entry: type[BaseModel]
    name: str  # "system", "cuda"
    words: str  # "system", "CUDA"
    served: Callable[[SharedMemoryRegions], object]  # raises the 400 when this server cannot


def _always(regions: SharedMemoryRegions) -> None:
    """System shared memory is served wherever the extensions are on."""


SYSTEM = _Extension(Kind.SYSTEM, router, SystemSharedMemoryRegion, "system", "system", _always)
CUDA = _Extension(
    Kind.CUDA, cuda_router, CudaSharedMemoryRegion, "cuda", "CUDA",
    SharedMemoryRegions.cuda_device,
)  # fmt: skip


def regions_of(runtime: Runtime) -> SharedMemoryRegions:
    """The server's regions, or the 400 every use of a switched-off extension gets."""
    return switched_on(runtime.plane.regions)


async def _registration(request: Request, schema: type[_Registration]) -> _Registration:
    """A register request's body, read and checked within its small bounds."""
    body = await read_body(request, REGISTER_BODY_MAX_BYTES)
    document = parse_json(body, REGISTER_JSON_LIMITS, "request body")
    return validate_document(schema, document, "request body")


def _add_status_routes(extension: _Extension) -> None:
    """``GET /status`` and ``GET /region/{name}/status``: the extension's regions (Triton's
    fields, ``extension.entry``); 400 for a name no region of this kind has."""
    kind, entry = extension.kind, extension.entry

    async def status(runtime: RuntimeDep) -> list[Any]:
        return [entry.model_validate(e) for e in regions_of(runtime).status(None, kind)]

    async def region_status(region_name: str, runtime: RuntimeDep) -> list[Any]:
        return [entry.model_validate(e) for e in regions_of(runtime).status(region_name, kind)]

    for path, endpoint, which in (
        ("/status", status, "Every registered"),
        ("/region/{region_name}/status", region_status, "One registered"),
    ):
        extension.router.add_api_route(
            path,
            endpoint,
            methods=["GET"],
            response_model=list[entry],  # type: ignore[valid-type]
            responses=v2_openapi.errors(400),
            summary=f"{which} {extension.words} shared-memory region",
            name=f"{extension.name}_shared_memory_{endpoint.__name__}",
        )


def _add_register_route(
    extension: _Extension,
    schema: type[_Registration],
    register: Callable[[SharedMemoryRegions, str, _Registration], Awaitable[None]],
    summary: str,
) -> None:
    """``POST /region/{name}/register``: the body read within small bounds only once the
    extension is known to be served (``extension.served``: a switched-off server, or a CUDA
    registration on a server without a device, reads nothing), then ``register``."""

    async def endpoint(region_name: str, request: Request, runtime: RuntimeDep) -> Response:
        regions = regions_of(runtime)
        extension.served(regions)
        await register(regions, region_name, await _registration(request, schema))
        return Response(status_code=200)

    extension.router.add_api_route(
        "/region/{region_name}/register",
        endpoint,
        methods=["POST"],
        response_class=Response,
        responses={**_DONE, **v2_openapi.errors(400, 413)},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": v2_openapi.request_schema(schema)}},
            }
        },
        summary=summary,
        name=f"{extension.name}_shared_memory_register",
    )


def _add_unregister_routes(extension: _Extension) -> None:
    """``POST /region/{name}/unregister`` (nothing when no region of this kind has the name,
    as in Triton) and ``POST /unregister`` (every region of this kind)."""
    kind = extension.kind

    async def unregister(region_name: str, runtime: RuntimeDep) -> Response:
        regions_of(runtime).unregister(region_name, kind)
        return Response(status_code=200)

    async def unregister_all(runtime: RuntimeDep) -> Response:
        regions_of(runtime).unregister(None, kind)
        return Response(status_code=200)

    for path, endpoint, summary in (
        ("/region/{region_name}/unregister", unregister,
         f"Unregister one {extension.words} region (nothing when it is not registered)"),
        ("/unregister", unregister_all, f"Unregister every {extension.words} region"),
    ):  # fmt: skip
        extension.router.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            response_class=Response,
            responses={**_DONE, **v2_openapi.errors(400)},
            summary=summary,
            name=f"{extension.name}_shared_memory_{endpoint.__name__}",
        )


async def _register_system(
    regions: SharedMemoryRegions, name: str, registration: SystemSharedMemoryRegisterRequest
) -> None:
    regions.register_system(name, registration.key, registration.offset, registration.byte_size)


async def _register_cuda(
    regions: SharedMemoryRegions, name: str, registration: CudaSharedMemoryRegisterRequest
) -> None:
    handle = registration.raw_handle.handle()
    # On a worker thread: opening an IPC handle maps device memory, which takes a while.
    await run_in_threadpool(
        regions.register_cuda, name, handle, registration.device_id, registration.byte_size
    )


# The routes of both extensions, in the order the protocol lists them.
for _extension, _schema, _register, _summary in (
    (SYSTEM, SystemSharedMemoryRegisterRequest, _register_system,
     "Register bytes of a POSIX shared-memory object as a region"),
    (CUDA, CudaSharedMemoryRegisterRequest, _register_cuda,
     "Register device memory another process exported (a CUDA IPC handle) as a region"),
):  # fmt: skip
    _add_status_routes(_extension)
    _add_register_route(_extension, _schema, _register, _summary)  # type: ignore[arg-type]
    _add_unregister_routes(_extension)
