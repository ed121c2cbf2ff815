"""Request headers planned before, so a repeated one is not decoded and checked again.

Clients send the same header over and over: the same model, shapes and types with new binary
data (tritonclient sends no request id by default), the same batch of dispatches over new
buffers. Planning such a header is a pure function of its bytes, the body's length and the
server's settings (one cache per runtime, so per settings), and for small tensors it is most of
the server's work. What is kept is only what planned without error; a lookup is one dict access,
so a miss costs next to nothing.

Bounded by bytes: each entry is charged its header's bytes plus ``ENTRY_BYTES`` for the plan
and the dict slot that keep it, and the charges add up to at most ``budget``, the oldest dropped
first; a header longer than ``max_header_bytes`` is never kept. (Charging the header alone let a
4 MiB budget hold about 16,000 small headers whose entries took about 20 MiB: a slow climb of
the server's memory under traffic of distinct request ids, measured by ``bench/load.py --probe``.)
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

PlanT = TypeVar("PlanT")

# What an entry holds besides its header's bytes: a small v2 plan (its arrays' metadata, the
# response header, the call) and the key and dict slot, about 1.3 KB measured; a batch plan holds
# more, but its header is longer in proportion.
ENTRY_BYTES = 1536


class HeaderCache(Generic[PlanT]):
    def __init__(self, budget: int, max_header_bytes: int) -> None:
        self.budget = budget
        self.max_header_bytes = min(max_header_bytes, budget)
        self.held = 0  # bytes charged for the entries kept
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
        charge = header_bytes + ENTRY_BYTES
        with self._lock:
            if key in self._plans:
                return
            while self._plans and self.held + charge > self.budget:
                _, size = self._plans.pop(next(iter(self._plans)))
                self.held -= size
            self._plans[key] = (plan, charge)
            self.held += charge
