"""Triton's shared-memory extensions over HTTP: register, status, unregister, for system
regions (``/v2/systemsharedmemory``) and CUDA regions (``/v2/cudasharedmemory``, the CuPy
backend only).

The regions themselves, and every check on them, are ``shared_memory.SharedMemoryRegions``'s;
the gRPC RPCs of the same names answer from it too. With the extensions off (the default) every
route answers 400 saying how to turn them on, as every shared-memory tensor parameter does.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from tensorbits.api import v2_openapi
from tensorbits.api.body import read_body
from tensorbits.api.deps import RuntimeDep
from tensorbits.runtime import Runtime
from tensorbits.shared_memory import Kind, SharedMemoryRegions, switched_on
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


def regions_of(runtime: Runtime) -> SharedMemoryRegions:
    """The server's regions, or the 400 every use of a switched-off extension gets."""
    return switched_on(runtime.shared_memory)


def _status(regions: SharedMemoryRegions, name: str | None) -> list[SystemSharedMemoryRegion]:
    return [SystemSharedMemoryRegion.model_validate(entry) for entry in regions.status(name)]


async def _registration(request: Request, schema: type[_Registration]) -> _Registration:
    """A register request's body, read and checked within its small bounds."""
    body = await read_body(request, REGISTER_BODY_MAX_BYTES)
    document = parse_json(body, REGISTER_JSON_LIMITS, "request body")
    return validate_document(schema, document, "request body")


def _register_body(schema: type[BaseModel]) -> dict[str, Any]:
    """A register route's OpenAPI request body (the route reads the body itself)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": v2_openapi.request_schema(schema)}},
        }
    }


@router.get(
    "/status",
    response_model=list[SystemSharedMemoryRegion],
    responses=v2_openapi.errors(400),
    summary="Every registered system shared-memory region",
)
async def system_shared_memory_status(runtime: RuntimeDep) -> list[SystemSharedMemoryRegion]:
    return _status(regions_of(runtime), None)


@router.get(
    "/region/{region_name}/status",
    response_model=list[SystemSharedMemoryRegion],
    responses=v2_openapi.errors(400),
    summary="One registered system shared-memory region",
)
async def system_shared_memory_region_status(
    region_name: str, runtime: RuntimeDep
) -> list[SystemSharedMemoryRegion]:
    return _status(regions_of(runtime), region_name)


@router.post(
    "/region/{region_name}/register",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400, 413)},
    openapi_extra=_register_body(SystemSharedMemoryRegisterRequest),
    summary="Register bytes of a POSIX shared-memory object as a region",
)
async def system_shared_memory_register(
    region_name: str, request: Request, runtime: RuntimeDep
) -> Response:
    regions = regions_of(runtime)  # before the body: a switched-off server reads nothing
    registration = await _registration(request, SystemSharedMemoryRegisterRequest)
    regions.register_system(
        region_name, registration.key, registration.offset, registration.byte_size
    )
    return Response(status_code=200)


@router.post(
    "/region/{region_name}/unregister",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400)},
    summary="Unregister one region (nothing when it is not registered)",
)
async def system_shared_memory_unregister(region_name: str, runtime: RuntimeDep) -> Response:
    regions_of(runtime).unregister(region_name)
    return Response(status_code=200)


@router.post(
    "/unregister",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400)},
    summary="Unregister every region",
)
async def system_shared_memory_unregister_all(runtime: RuntimeDep) -> Response:
    regions_of(runtime).unregister()
    return Response(status_code=200)


# --- CUDA shared memory: device memory on the CuPy backend ---------------------------------------


def _cuda_status(regions: SharedMemoryRegions, name: str | None) -> list[CudaSharedMemoryRegion]:
    return [
        CudaSharedMemoryRegion.model_validate(entry) for entry in regions.status(name, Kind.CUDA)
    ]


@cuda_router.get(
    "/status",
    response_model=list[CudaSharedMemoryRegion],
    responses=v2_openapi.errors(400),
    summary="Every registered CUDA shared-memory region",
)
async def cuda_shared_memory_status(runtime: RuntimeDep) -> list[CudaSharedMemoryRegion]:
    return _cuda_status(regions_of(runtime), None)


@cuda_router.get(
    "/region/{region_name}/status",
    response_model=list[CudaSharedMemoryRegion],
    responses=v2_openapi.errors(400),
    summary="One registered CUDA shared-memory region",
)
async def cuda_shared_memory_region_status(
    region_name: str, runtime: RuntimeDep
) -> list[CudaSharedMemoryRegion]:
    return _cuda_status(regions_of(runtime), region_name)


@cuda_router.post(
    "/region/{region_name}/register",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400, 413)},
    openapi_extra=_register_body(CudaSharedMemoryRegisterRequest),
    summary="Register device memory another process exported (a CUDA IPC handle) as a region",
)
async def cuda_shared_memory_register(
    region_name: str, request: Request, runtime: RuntimeDep
) -> Response:
    regions = regions_of(runtime)  # before the body: a switched-off server reads nothing,
    regions.cuda_device()  # nor one without a device
    registration = await _registration(request, CudaSharedMemoryRegisterRequest)
    handle = registration.raw_handle.handle()
    # On a worker thread: opening an IPC handle maps device memory, which takes a while.
    await run_in_threadpool(
        regions.register_cuda, region_name, handle, registration.device_id, registration.byte_size
    )
    return Response(status_code=200)


@cuda_router.post(
    "/region/{region_name}/unregister",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400)},
    summary="Unregister one CUDA region (nothing when it is not registered)",
)
async def cuda_shared_memory_unregister(region_name: str, runtime: RuntimeDep) -> Response:
    regions_of(runtime).unregister(region_name, Kind.CUDA)
    return Response(status_code=200)


@cuda_router.post(
    "/unregister",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400)},
    summary="Unregister every CUDA region",
)
async def cuda_shared_memory_unregister_all(runtime: RuntimeDep) -> Response:
    regions_of(runtime).unregister(None, Kind.CUDA)
    return Response(status_code=200)
