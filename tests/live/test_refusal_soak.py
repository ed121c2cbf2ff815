"""The refusal soak, briefly: clients that send each request whole before reading its answer
(``http.client``) in the mix of ``support/refusal_soak.py`` (small and 16 MiB inferences,
invalid requests, bodies past the 32 MiB limit) against a live server whose admission fills.
Every request gets its answer (a 200, or a refusal naming what it refused: the 503 with
Retry-After, the 413, the 400), none a broken pipe or a reset, and the server's memory stays
within the load test's bound (docs/reliability.md: ``TENSORBITS_MAX_INFLIGHT_BYTES`` + 256 MiB),
the bodies it discarded not kept."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.live import LiveServer, serve
from support.refusal_soak import INFLIGHT_LIMIT, SERVER_ENV, run_mix

pytestmark = pytest.mark.integration

MiB = 1 << 20
OVERHEAD = 256 * MiB  # the load test's fixed overhead over what admission holds
CLIENTS = 8
SECONDS = 8.0


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with serve(dict(SERVER_ENV)) as live:
        yield live


@pytest.mark.timeout(180)
def test_clients_sending_whole_bodies_read_every_answer(server: LiveServer) -> None:
    server.reset_peak_rss()
    figures = run_mix(server, clients=CLIENTS, seconds=SECONDS)
    summary = figures.summary()
    assert figures.transport_errors == 0, summary
    assert not figures.unexpected, summary
    assert figures.refusals_unnamed == 0, summary
    assert figures.outcomes["503"] > 0, summary  # admission was full: its refusal was read
    assert server.peak_rss() <= INFLIGHT_LIMIT + OVERHEAD, summary
    assert server.get("/v2/health/live") == 200
