"""``observability.WorkerShare``: what one worker publishes, and a scrape that adds up the others'
(tallies of every worker that ever ran; gauges of live ones only), in process."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from prometheus_client import generate_latest

from tensorbits import observability
from tensorbits.config.settings import Settings
from tensorbits.observability import Metrics, RequestTally, WorkerShare
from tensorbits.runtime import Runtime


def _other(folder: Path, pid: int, requests: int, inflight: int) -> None:
    other = RequestTally()
    for _ in range(requests):
        other.add("/r", "", 200, 0.002, 10, 20)
    document = {
        "pid": pid,
        "tally": other.snapshot(),
        "gauges": {"inflight_requests": inflight, "inflight_bytes": 0, "device_memory": 0},
        "statistics": {"M": [requests]},
    }
    (folder / f"{pid}.json").write_text(json.dumps(document))


def _value(exposition: str, name: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"{name} not in {exposition}")


def test_a_scrape_adds_up_every_workers_tally(tmp_path: Path) -> None:
    live, gone = os.getppid(), 2**22 + 12345  # a pid no process has (past the default pid_max)
    _other(tmp_path, live, requests=3, inflight=2)
    _other(tmp_path, gone, requests=4, inflight=5)
    observability.share_with_workers(tmp_path)
    try:
        metrics = Metrics.create()
    finally:
        observability.share_with_workers(None)
    assert metrics.tally.share is not None
    metrics.tally.add("/r", "", 200, 0.002, 1, 2)
    runtime = Runtime.start(Settings(backend="numpy", cpu_threads=1))
    try:
        runtime.plane.admission.acquire(0)  # one request of this worker's in flight

        async def bind() -> None:
            metrics.bind_runtime(runtime)  # publishes its own file, and once a second after

        asyncio.run(bind())
        text = generate_latest(metrics.registry).decode()
    finally:
        runtime.close()
    requests = (
        'tensorbits_requests_total{model="",protocol="http",route="/r",status="200",version=""}'
    )
    assert _value(text, requests) == 8
    assert _value(text, 'tensorbits_request_bytes_total{protocol="http",route="/r"}') == 1 + 70
    count = 'tensorbits_request_duration_seconds_count{route="/r"}'
    assert _value(text, count) == 8
    # In flight: this worker's 1 and the live other's 2; the exited one's 5 do not count.
    assert _value(text, "tensorbits_inflight_requests") == 3
    statistics = metrics.other_workers_statistics()
    assert sorted(s["M"][0] for s in statistics) == [3, 4]  # its own is not among them
    assert _value(text, "tensorbits_worker_processes") == 2


def test_a_worker_publishes_its_figures_atomically(tmp_path: Path) -> None:
    share = WorkerShare(tmp_path)
    tally = RequestTally()
    tally.add("/r", "m", 503, 0.5, 7, 9)

    async def start() -> None:
        share.start(tally, {"inflight_requests": lambda: 4.0}, lambda: {"m": [1, 2]})

    asyncio.run(start())
    document = json.loads((tmp_path / f"{os.getpid()}.json").read_text())
    assert document["pid"] == os.getpid()
    assert document["gauges"] == {"inflight_requests": 4.0}
    assert document["statistics"] == {"m": [1, 2]}
    assert document["tally"]["requests"] == [["/r", "m", 503, "http", "", 1, 7, 9]]
    assert not list(tmp_path.glob("*.partial"))
    assert share.others() == []  # its own file is not another worker's
