"""The server assembled: its settings, its backend, its data plane, and whether it is draining."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tensorbits.config.settings import Settings
from tensorbits.core.admission import Admission
from tensorbits.core.backends import Selection, select_backend
from tensorbits.core.batch import BatchLimits
from tensorbits.core.dataplane import DataPlane
from tensorbits.core.graphs.models import GraphModels
from tensorbits.core.header_cache import HeaderCache, PlanT
from tensorbits.core.limits import request_limits
from tensorbits.core.models import ModelStates
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits.repository.folder import load_repository
from tensorbits.repository.poll import RepositoryPoller
from tensorbits.repository.store import (
    MODELS,
    FollowingGraphModels,
    FollowingModelStates,
    ModelStore,
)
from tensorbits_protocol.operators import REGISTRY


class Drain:
    """Whether the server has been told to stop (SIGTERM), in the order load balancers route.

    ``begin`` (the signal, ``serving.draining_server``) turns the runtime's readiness false first,
    while every listener still accepts: a load balancer or a Kubernetes Service, which only
    learns of the stop from failing probes (or the endpoint's removal, seconds later), stops
    sending work before any connection is refused. ``stop_accepting`` (after
    ``TENSORBITS_DRAIN_DELAY``) runs the hooks the endpoints registered (gRPC's stop), as the
    HTTP listener closes; the requests in flight then finish within the graceful timeout."""

    __slots__ = ("_begun", "_on_stop", "_stopping")

    def __init__(self) -> None:
        self._begun = threading.Event()  # set from a signal handler, read on the event loop
        self._stopping = False
        self._on_stop: list[Callable[[], object]] = []

    def begin(self) -> None:
        self._begun.set()

    @property
    def begun(self) -> bool:
        return self._begun.is_set()

    def on_stop_accepting(self, hook: Callable[[], object]) -> None:
        """Call ``hook`` (on the event loop) when the server stops accepting new work."""
        self._on_stop.append(hook)

    def stop_accepting(self) -> None:
        """The end of the delay: every registered hook, once, in the order registered."""
        if self._stopping:
            return
        self._stopping = True
        for hook in self._on_stop:
            hook()


@dataclass
class Runtime:
    """One server, assembled from its settings: the backend it selected, the data plane every
    front end runs its requests through, and the server's own state (started, draining). With
    several workers, ``store`` holds the repository extension's loads and unloads for all of
    them (``model_store.py``); None in a server of one process."""

    settings: Settings
    selection: Selection
    plane: DataPlane
    started: bool = True
    drain: Drain = field(default_factory=Drain)  # the server's: begun when it is told to stop
    store: ModelStore | None = None
    poller: RepositoryPoller | None = None  # the repository's, in poll mode

    @property
    def ready(self) -> bool:
        return self.started and not self.drain.begun

    def unavailable_because(self, model: str) -> str | None:
        """Why ``model`` is not READY (the repository index's reason, both protocols); None
        when it is."""
        return self.plane.unavailable_because(model, server_ready=self.ready)

    @classmethod
    def start(
        cls, settings: Settings, drain: Drain | None = None, workers_folder: Path | None = None
    ) -> Runtime:
        """The runtime of ``settings``. ``workers_folder``: the folder this worker shares with
        the server's others (``workers.py``), where the model store is kept, watched on the
        running event loop (the server's); None: a server of one process."""
        shared = workers_folder is not None
        graphs = FollowingGraphModels if shared else GraphModels
        selection = select_backend(
            settings.backend,
            device_id=settings.device_id,
            cpu_threads=settings.cpu_threads,
            pinned_pool_bytes=settings.worker_pinned_pool_bytes,
            placement=settings.placement,
        )
        backend = selection.backend
        limits = settings.core_limits
        plane = DataPlane(
            backend,
            # One worker's share: with N workers the limits hold for the server as a whole.
            Admission(
                settings.worker_inflight_bytes,
                settings.worker_inflight_requests,
                workers=settings.workers,
            ),
            request_limits(limits),
            BatchLimits.of(limits),
            plans=_cache(settings, CACHED_HEADER_MAX_BYTES),
            # A batch header is as long as its dispatches are many: keep up to 1/16 of the budget.
            batch_plans=_cache(settings, settings.header_cache_bytes // 16),
            regions=(
                SharedMemoryRegions(
                    settings.shared_memory_prefix,
                    settings.max_shared_memory_regions,
                    settings.max_shared_memory_bytes,
                    backend.device_memory,
                    f"{backend.name} on {backend.device}",
                )
                if settings.shared_memory
                else None
            ),
            graphs=graphs(
                settings.graph_limits,
                settings.max_loaded_models,
                is_builtin=REGISTRY.__contains__,
            ),
            models=FollowingModelStates() if shared else ModelStates(),
        )
        poller = None
        if settings.model_repository is not None and settings.model_control_mode == "poll":
            poller = RepositoryPoller.started(
                plane, settings.model_repository, settings.repository_poll_secs
            )
            poller.start()  # on the running event loop (the server's)
        elif settings.model_repository is not None:
            load_repository(plane, settings.model_repository)
        # The repository folder first, then what the other workers loaded and unloaded since.
        store = ModelStore.join(workers_folder / MODELS, plane) if workers_folder else None
        return cls(
            settings=settings,
            selection=selection,
            plane=plane,
            drain=drain or Drain(),
            store=store,
            poller=poller,
        )

    def close(self) -> None:
        self.started = False
        if self.poller is not None:
            self.poller.close()
        if self.store is not None:
            self.store.close()
        if self.plane.regions is not None:
            self.plane.regions.close()
        self.selection.backend.close()


# The longest inference request worth remembering without its tensors' bytes: a few inputs'
# names, shapes and parameters.
CACHED_HEADER_MAX_BYTES = 4096


def _cache(settings: Settings, max_header_bytes: int) -> HeaderCache[PlanT] | None:
    budget = settings.header_cache_bytes
    return HeaderCache(budget, max_header_bytes) if budget and max_header_bytes else None
