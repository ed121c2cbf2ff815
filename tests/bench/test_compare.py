"""bench/compare.py's own logic, without a server: the targets' PASS and MISS from the figures of a
run, each tensorbits row against Triton and against the floor of as many workers, and the data file
the charts are drawn from (keys sorted, the same figures the same bytes); and, with servers, the
floors in the form of tensorbits' workers (harness/baselines.py)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # bench.harness lives at the repository root, not in a distribution

from bench.compare import (  # noqa: E402
    SMALL,
    TICK,
    TRITON,
    Rate,
    Results,
    Server,
    Target,
    against,
    chart_series,
    document,
    floors,
    fronts,
    rate_ratio,
    report,
    targets,
    tree_cpu,
    write,
)
from bench.harness.baselines import Canned  # noqa: E402
from bench.harness.grpc_load import (  # noqa: E402
    NOT,
    first_output,
    inference_counts,
    model_infer_request,
    raw_model_infer,
)

ONE, TWO = "tensorbits (1 worker)", "tensorbits (2 workers)"
FASTAPI_ONE, FASTAPI_TWO = "bare FastAPI (1 worker)", "bare FastAPI (2 workers)"
GRPC_ONE, GRPC_TWO = "bare grpc.aio (1 worker)", "bare grpc.aio (2 workers)"
ARGS = argparse.Namespace(workers=[1, 2], pa_concurrency=8, protocol=["http", "grpc"])


def rate(rps: float, server_us: float = 300.0) -> Rate:
    return Rate(rps=rps, p50_ms=1.25, p99_ms=4.5, server_us=server_us)


def a_run() -> Results:
    """Figures as a run on two workers with the Triton peer leaves them (perf_analyzer failed)."""
    return Results(
        rates={
            ("http", ONE, 32): [rate(1000.0), rate(1200.0)],
            ("http", TRITON, 32): [rate(1000.0), rate(1000.0)],
            ("http", FASTAPI_ONE, 32): [rate(2000.0), rate(2000.0)],
            ("http", FASTAPI_TWO, 32): [rate(4000.0), rate(4200.0)],
            ("grpc", TWO, 32): [rate(500.0)],
            ("grpc", TRITON, 32): [rate(1000.0)],
            ("grpc", GRPC_TWO, 32): [rate(2500.0)],
            ("http", ONE, 8): [rate(800.0), rate(900.0)],
        },
        sizes={
            ("http", ONE, 64.0): [0.30, 0.2812345],
            ("tcp", "raw TCP echo", 64.0): [0.25, 0.20],
            ("http", TRITON, 64.0): [1.2, 1.0],
            ("http", FASTAPI_ONE, 64.0): [0.5, 0.4],
            ("grpc", ONE, 64.0): [0.6, 0.7, 0.8],
            ("grpc", TRITON, 64.0): [1.0, 1.0, 1.0],
            ("grpc", GRPC_ONE, 64.0): [0.5, 0.5, 0.5],
            ("grpc", GRPC_TWO, 64.0): [0.4, 0.4, 0.4],
            ("http", ONE, 1.0): [0.004, 0.005],
            ("http-last", ONE, 64.0): [0.004, 0.003],
            ("http-last", FASTAPI_ONE, 64.0): [0.002, 0.0025],
        },
    )


def test_a_bound_is_met_at_its_limit_and_a_missing_figure_is_no_verdict() -> None:
    assert Target("t", "<= 1.3", 1.3).verdict == "PASS"
    assert Target("t", "<= 1.3", 1.31).verdict == "MISS"
    assert Target("t", ">= 1.0", 1.0).verdict == "PASS"
    assert Target("t", ">= 1.0", 0.99).verdict == "MISS"
    assert Target("t", ">= 1.0", None, "not measured").verdict == "n/a (not measured)"


def test_targets_from_a_run() -> None:
    checked = {t.what: t for t in targets(a_run(), ARGS)}
    assert list(checked) == [
        "64 MiB BIT_NOT over HTTP / raw TCP echo, best time",
        "64 MiB BIT_NOT over HTTP / Triton, best time",
        "16-element rate over HTTP / Triton, 1 worker, wrk 32 connections",
        "16-element rate over HTTP / Triton, 2 workers, perf_analyzer 8 in flight",
        "16-element rate over gRPC / Triton, 2 workers, 32 in flight",
        "64 MiB BIT_NOT over gRPC / Triton, p50",
        "64 MiB BIT_NOT over HTTP, its last MiB to the answer's head / the bare FastAPI echo's, "
        "best",
    ]
    ratio = {what: t.ratio for what, t in checked.items() if t.ratio is not None}
    verdict = [t.verdict for t in checked.values()]
    # Best times: 0.281 s against the echo's 0.20 s (1.41, bound 1.3) and Triton's 1.0 s.
    assert math.isclose(
        ratio["64 MiB BIT_NOT over HTTP / raw TCP echo, best time"], 0.2812345 / 0.2
    )
    assert math.isclose(ratio["64 MiB BIT_NOT over HTTP / Triton, best time"], 0.2812345)
    # Rates: the median of the rounds' ratios (1.0 and 1.2), not of one round.
    assert math.isclose(
        ratio["16-element rate over HTTP / Triton, 1 worker, wrk 32 connections"], 1.1
    )
    # gRPC round trips: medians, 0.7 s against 1.0 s.
    assert math.isclose(ratio["64 MiB BIT_NOT over gRPC / Triton, p50"], 0.7)
    assert verdict[:3] == ["MISS", "PASS", "PASS"]
    assert verdict[3] == "n/a (not measured: needs Triton and perf_analyzer)"
    assert verdict[4:6] == ["MISS", "MISS"]
    # What is left once the body is in: best 3 ms against the echo's 2 ms (1.5, bound 1.5).
    assert verdict[6] == "PASS"
    assert math.isclose(list(ratio.values())[-1], 1.5)


def test_the_perf_analyzer_target_is_the_median_of_the_rounds_ratios() -> None:
    run = a_run()
    run.perf = {
        ("http", TWO): [rate(3000.0), rate(1000.0), rate(2000.0)],
        ("http", TRITON): [rate(1000.0), rate(1000.0), rate(2500.0)],
    }
    perf = targets(run, ARGS)[3]
    # Rounds of 3.0, 1.0 and 0.8: 1.0 (the ratio of the medians would be 2.0, a PASS).
    assert (perf.ratio, perf.verdict) == (1.0, "MISS")


def test_without_the_peer_no_target_is_judged() -> None:
    run = a_run()
    run.rates = {key: runs for key, runs in run.rates.items() if key[1] != TRITON}
    run.sizes = {key: times for key, times in run.sizes.items() if key[1] != TRITON}
    verdicts = [t.verdict for t in targets(run, ARGS)]
    # The raw TCP echo and the bare FastAPI echo are always there.
    assert (verdicts[0], verdicts[-1]) == ("MISS", "PASS")
    assert all(v.startswith("n/a (not measured") for v in verdicts[1:-1])


def test_each_tensorbits_row_against_triton_and_the_floor_of_as_many_workers() -> None:
    run = a_run()
    # HTTP, 1 worker, 32 connections: rounds of 1000 and 1200 against Triton's 1000 and 1000
    # (1.1), and against the 1-worker floor's 2000 and 2000 (0.55), not the 2-worker floor's.
    assert against(run, ("http", ONE, 32)).split() == ["1.10x", "0.55x"]
    assert against(run, ("grpc", TWO, 32)).split() == ["0.50x", "0.20x"]
    assert against(run, ("http", ONE, 8)).split() == ["-", "-"]  # neither measured at 8
    for other in (TRITON, FASTAPI_TWO):  # only tensorbits rows are compared
        assert against(run, ("http", other, 32)) == ""
    # perf_analyzer's rows: no load in the key, the same two ratios.
    run.perf = {("grpc", TWO): [rate(3000.0)], ("grpc", TRITON): [rate(2000.0)],
                ("grpc", GRPC_TWO): [rate(6000.0)]}  # fmt: skip
    assert against(run, ("grpc", TWO)).split() == ["1.50x", "0.50x"]
    assert against(run, ("grpc", GRPC_TWO)) == ""


def test_the_report_prints_the_ratios_beside_the_rows(capsys: pytest.CaptureFixture[str]) -> None:
    run = a_run()
    args = argparse.Namespace(**vars(ARGS), rounds=2, seconds=4.0, repeat=3)
    report(run, targets(run, args), args)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    one = next(r for r in rows if r[:5] == ["http", "tensorbits", "(1", "worker)", "32"])
    assert one[-2:] == ["1.10x", "0.55x"]
    floor = next(r for r in rows if r[:5] == ["http", "bare", "FastAPI", "(2", "workers)"])
    assert floor[-1] == "us"  # a floor's row: no ratios


def test_a_server_is_measured_over_the_protocols_it_speaks_that_are_asked_for() -> None:
    both = Server(ONE, "tensorbits", 1, 8000, "127.0.0.1:8001")
    grpc_floor = Server(GRPC_ONE, "floor", 1, grpc_target="127.0.0.1:8002")
    assert fronts(both, ARGS) == ["http", "grpc"]
    assert fronts(grpc_floor, ARGS) == ["grpc"]
    assert fronts(grpc_floor, argparse.Namespace(protocol=["http"])) == []


def test_a_floor_worker_counts_its_answers_in_its_own_slot_of_the_shared_counts() -> None:
    served = [3, 0]  # a RawArray shared by the workers, in the floor
    canned = Canned(served, 1)
    body = model_infer_request(NOT, {"InputTensor": SMALL})
    answer = canned.answer(body)
    assert canned.answer(body) is answer  # computed once
    assert served == [3, 2]
    assert (first_output(answer) == np.bitwise_not(SMALL)).all()


def listening(port: int) -> int:
    """Listening TCP sockets on ``port`` (IPv4 and IPv6), from /proc/net."""
    rows = [line.split() for name in ("tcp", "tcp6")
            for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]]  # fmt: skip
    return sum(row[3] == "0A" and int(row[1].rsplit(":", 1)[1], 16) == port for row in rows)


@pytest.mark.integration
def test_the_floors_of_two_workers_serve_both_ports_from_each_worker() -> None:
    with floors(2) as (http, grpc_floor):
        assert (http.label, grpc_floor.label) == (FASTAPI_TWO, GRPC_TWO)
        assert http.pid == grpc_floor.pid
        target = str(grpc_floor.grpc_target)
        # One listening socket per worker on each port (SO_REUSEPORT), as tensorbits' workers.
        assert listening(http.http_port or 0) == 2
        assert listening(int(target.rsplit(":", 1)[1])) == 2
        # Every call counted, whichever worker a new connection reached.
        body = model_infer_request(NOT, {"InputTensor": SMALL})
        for _ in range(6):
            with grpc.insecure_channel(target) as channel:
                raw_model_infer(channel)(body, timeout=30)
        assert inference_counts(target, NOT) == (6, 0)
        # What perf_analyzer reads first, over both protocols.
        client = tritonclient.grpc.InferenceServerClient(target)
        assert client.get_model_config(NOT).config.input[0].name == "InputTensor"
        assert client.get_model_metadata(NOT).outputs[0].name == "OutputTensor"
        base = f"http://127.0.0.1:{http.http_port}/v2"
        with urllib.request.urlopen(f"{base}/models/{NOT}") as answer:
            assert json.load(answer)["inputs"][0]["datatype"] == "UINT8"
        # The server's CPU time is the workers' too, not only the command's.
        own = Path(f"/proc/{http.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert tree_cpu(http.pid) > (int(own[11]) + int(own[12])) * TICK


def test_a_round_left_out_compares_the_medians() -> None:
    assert math.isclose(rate_ratio([rate(1000), rate(3000)], [rate(1000), rate(1000)]), 2.0)
    # Three rounds against two: the medians, 2000 / 1000.
    assert math.isclose(rate_ratio([rate(1000), rate(2000), rate(3000)], [rate(1000)] * 2), 2.0)


def test_the_data_file_is_sorted_and_the_same_bytes_for_the_same_figures() -> None:
    run = a_run()
    run.perf = {("http", TWO): [rate(3844.0, math.nan)]}  # perf_analyzer reads no server CPU
    head: dict[str, object] = {"command": "bench/compare.py --quick", "date": "2026-12-02"}
    first = json.dumps(document(run, targets(run, ARGS), 8, head), indent=1, sort_keys=True)
    again = json.dumps(document(run, targets(run, ARGS), 8, head), indent=1, sort_keys=True)
    assert first == again
    data = json.loads(first)
    assert list(data) == sorted(data)
    assert list(data) == ["command", "date", "perf_analyzer", "rates", "round_trips", "targets"]
    # Rows in key order: protocol, server, load (or MiB first for round trips).
    assert [(r["protocol"], r["server"], r["concurrency"]) for r in data["rates"]] == sorted(
        (p, s, c) for p, s, c in a_run().rates
    )
    assert [r["mib"] for r in data["round_trips"]] == [1.0] + [64.0] * 10
    assert data["perf_analyzer"] == [
        {"in_flight": 8, "p50_ms": 1.25, "p99_ms": 4.5, "protocol": "http", "rps": 3844.0,
         "server": TWO, "server_us": None}
    ]  # fmt: skip
    one_worker = next(r for r in data["rates"] if r["server"] == ONE and r["concurrency"] == 32)
    assert one_worker["rps"] == 1100.0
    assert one_worker["rps_each_round"] == [1000.0, 1200.0]
    # Floats to 4 significant digits (what a shared machine tells apart): 0.2812345 s is 281.2 ms.
    best = {(r["protocol"], r["server"], r["mib"]): r["best_ms"] for r in data["round_trips"]}
    assert best[("http", ONE, 64.0)] == 281.2
    assert [t["verdict"] for t in data["targets"]][:3] == ["MISS", "PASS", "PASS"]


def test_the_charts_leave_the_floors_out_of_the_rates_and_the_echoes_out_of_round_trips() -> None:
    rates, sizes = chart_series(a_run())
    assert rates == {
        "Triton HTTP": [(32, 1000.0)],
        f"{ONE} HTTP": [(8, 850.0), (32, 1100.0)],
        f"{TWO} gRPC": [(32, 500.0)],
        "Triton gRPC": [(32, 1000.0)],
    }
    assert set(sizes) == {
        f"{ONE} HTTP",
        f"{ONE} gRPC",
        "Triton HTTP",
        "Triton gRPC",
        "raw TCP echo",
        f"{GRPC_ONE} gRPC",
        f"{GRPC_TWO} gRPC",
    }
    assert [x for x, _ in sizes[f"{ONE} HTTP"]] == [1.0, 64.0]
    assert math.isclose(sizes["raw TCP echo"][0][1], 200.0)  # the best time, in ms


def test_write_puts_the_sorted_data_and_both_charts_in_out(tmp_path: Path) -> None:
    run = a_run()
    checked = targets(run, ARGS)
    out = tmp_path / "results"
    write(run, checked, argparse.Namespace(out=out, pa_concurrency=8), {"cores": 2})
    text = (out / "compare.json").read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=1, sort_keys=True) + "\n"
    assert data["machine_before"] == {"cores": 2}
    assert data["targets"] == json.loads(json.dumps(document(run, checked, 8, {})))["targets"]
    rates_svg = (out / "compare_rates.svg").read_text()
    assert "Triton gRPC" in rates_svg
    assert "bare FastAPI" not in rates_svg
    assert "raw TCP echo" in (out / "compare_round_trips.svg").read_text()
