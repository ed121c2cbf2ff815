"""Request headers planned before, so a repeated one is not decoded and checked again.

Clients send the same header over and over: the same model, shapes and types with new binary
data (tritonclient sends no request id by default), the same batch of dispatches over new
buffers. Planning such a header is a pure function of its bytes, the body's length and the
server's settings (one cache per runtime, so per settings), and for small tensors it is most of
the server's work. What is kept is only what planned without error; a lookup is one dict access,
so a miss costs next to nothing.

Bounded by bytes: the headers kept add up to at most ``budget`` bytes (the plans they stand for
are a few times that), the oldest dropped first; a header longer than ``max_header_bytes`` is
never kept.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

PlanT = TypeVar("PlanT")


class HeaderCache(Generic[PlanT]):
    def __init__(self, budget: int, max_header_bytes: int) -> None:
        self.budget = budget
        self.max_header_bytes = min(max_header_bytes, budget)
        self.held = 0  # header bytes kept
        self._plans: dict[Hashable, tuple[PlanT, int]] = {}
        self._lock = threading.Lock()  # large requests are planned on worker threads

    def __len__(self) -> int:
        return len(self._plans)

    def keeps(self, header: bytes) -> bool:
        """Whether a header of this length may be kept (and so is worth looking up)."""
        return len(header) <= self.max_header_bytes

    def get(self, key: Hashable) -> PlanT | None:
        found = self._plans.get(key)
        return None if found is None else found[0]

    def put(self, key: Hashable, plan: PlanT, header_bytes: int) -> None:
        if header_bytes > self.max_header_bytes:
            return
        with self._lock:
            if key in self._plans:
                return
            while self._plans and self.held + header_bytes > self.budget:
                _, size = self._plans.pop(next(iter(self._plans)))
                self.held -= size
            self._plans[key] = (plan, header_bytes)
            self.held += header_bytes
