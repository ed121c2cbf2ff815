"""Triton's system shared-memory extension over HTTP: register, status, unregister.

The regions themselves, and every check on them, are ``shared_memory.SystemSharedMemory``'s; the
gRPC RPCs of the same names answer from it too. With the extension off (the default) every route
answers 400 saying how to turn it on, as every shared-memory tensor parameter does.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from tensorbits.api import v2_openapi
from tensorbits.api.body import read_body
from tensorbits.api.deps import RuntimeDep
from tensorbits.runtime import Runtime
from tensorbits.shared_memory import SystemSharedMemory, cuda_refusal, switched_on
from tensorbits_protocol.jsondata import JsonLimits, parse_json
from tensorbits_protocol.schema_errors import validate_document
from tensorbits_protocol.v2 import SystemSharedMemoryRegion, SystemSharedMemoryRegisterRequest

router = APIRouter(prefix="/v2/systemsharedmemory", tags=["v2 shared memory"])
cuda_router = APIRouter(prefix="/v2/cudasharedmemory", tags=["v2 shared memory"])

REGISTER_BODY_MAX_BYTES = 4 << 10
REGISTER_JSON_LIMITS = JsonLimits(max_depth=2, max_values=8)
_DONE: dict[int | str, dict[str, Any]] = {200: {"description": "Done (empty body)"}}


def regions_of(runtime: Runtime) -> SystemSharedMemory:
    """The server's regions, or the 400 every use of a switched-off extension gets."""
    return switched_on(runtime.shared_memory)


def _status(regions: SystemSharedMemory, name: str | None) -> list[SystemSharedMemoryRegion]:
    return [SystemSharedMemoryRegion.model_validate(entry) for entry in regions.status(name)]


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
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": v2_openapi.request_schema(SystemSharedMemoryRegisterRequest)
                }
            },
        }
    },
    summary="Register bytes of a POSIX shared-memory object as a region",
)
async def system_shared_memory_register(
    region_name: str, request: Request, runtime: RuntimeDep
) -> Response:
    regions = regions_of(runtime)  # before the body: a switched-off server reads nothing
    body = await read_body(request, REGISTER_BODY_MAX_BYTES)
    document = parse_json(body, REGISTER_JSON_LIMITS, "request body")
    registration = validate_document(SystemSharedMemoryRegisterRequest, document, "request body")
    regions.register(region_name, registration.key, registration.offset, registration.byte_size)
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


# --- CUDA shared memory: refused (cuda_refusal), its status empty ----------------------------


@cuda_router.get(
    "/status",
    response_model=list[dict[str, Any]],
    responses=v2_openapi.errors(400),
    summary="Registered CUDA shared-memory regions (none: registration is refused)",
)
async def cuda_shared_memory_status(runtime: RuntimeDep) -> list[dict[str, Any]]:
    regions_of(runtime)
    return []


@cuda_router.post(
    "/region/{region_name}/register",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400)},
    summary="Register device memory (refused: needs the CuPy backend; see the message)",
)
async def cuda_shared_memory_register(region_name: str, runtime: RuntimeDep) -> Response:
    # Before the body is read: nothing of it is needed.
    raise cuda_refusal(runtime.shared_memory, runtime.selection.backend)


@cuda_router.post(
    "/region/{region_name}/unregister",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400)},
    summary="Unregister a CUDA region (none can be registered: nothing to do)",
)
async def cuda_shared_memory_unregister(region_name: str, runtime: RuntimeDep) -> Response:
    regions_of(runtime)
    return Response(status_code=200)


@cuda_router.post(
    "/unregister",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400)},
    summary="Unregister every CUDA region (none can be registered: nothing to do)",
)
async def cuda_shared_memory_unregister_all(runtime: RuntimeDep) -> Response:
    regions_of(runtime)
    return Response(status_code=200)
