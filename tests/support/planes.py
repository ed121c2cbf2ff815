"""A data plane for tests that plan and run requests in process, without a server."""

from __future__ import annotations

from tensorbits.config.settings import Settings
from tensorbits.core.admission import Admission
from tensorbits.core.backends.base import Backend
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.batch import BatchLimits
from tensorbits.core.dataplane import DataPlane
from tensorbits.core.header_cache import HeaderCache
from tensorbits.core.limits import request_limits
from tensorbits.core.plan import PlanTemplate
from tensorbits.core.shared_memory import SharedMemoryRegions


def data_plane(
    settings: Settings | None = None,
    *,
    backend: Backend | None = None,
    plans: HeaderCache[PlanTemplate] | None = None,
    regions: SharedMemoryRegions | None = None,
) -> DataPlane:
    """The plane a server of ``settings`` (default: NumPy, default limits) would run, with the
    given cache of planned requests and shared-memory regions."""
    settings = settings if settings is not None else Settings(backend="numpy")
    limits = settings.core_limits
    return DataPlane(
        backend if backend is not None else NumpyBackend(1),
        Admission(settings.max_inflight_bytes, settings.max_inflight_requests),
        request_limits(limits),
        BatchLimits.of(limits),
        plans=plans,
        regions=regions,
    )
