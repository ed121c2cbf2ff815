"""The benchmarks' timing without a server or a device: rounds in a rotated order after a warm-up,
bench/shared_memory.py's ``--server-env`` (one server each), bench/gpu_ops.py's CUDA-event timer
on a stand-in ``cupy.cuda``, and bench/cuda_shared_memory.py's one line without CuPy."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # bench.harness lives at the repository root, not in a distribution

from bench.gpu_ops import event_timer  # noqa: E402
from bench.harness import interleaved_best, interleaved_times, rotated  # noqa: E402
from bench.shared_memory import server_envs  # noqa: E402


def test_each_name_leads_one_round_in_turn() -> None:
    names = ["a", "b", "c"]
    assert [rotated(names, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert rotated([], 3) == []


def test_interleaved_times_warms_up_each_then_rotates() -> None:
    calls: list[str] = []

    def timer(name: str, seconds: float) -> Callable[[], float]:
        def timed() -> float:
            calls.append(name)
            return seconds

        return timed

    times = interleaved_times({"x": timer("x", 2.0), "y": timer("y", 1.0)}, 3)
    # The warm-up (x, y) is not kept; then rounds x y, y x, x y.
    assert calls == ["x", "y", "x", "y", "y", "x", "x", "y"]
    assert times == {"x": [2.0, 2.0, 2.0], "y": [1.0, 1.0, 1.0]}


def test_interleaved_best_keeps_the_least_wall_time() -> None:
    ran: list[str] = []
    best = interleaved_best({"a": lambda: ran.append("a"), "b": lambda: ran.append("b")}, 2)
    assert ran == ["a", "b", "a", "b", "b", "a"]
    assert set(best) == {"a", "b"}
    assert all(0 <= seconds < 1 for seconds in best.values())


def test_each_server_env_is_one_server() -> None:
    assert server_envs([]) == [{}]
    assert server_envs(["TENSORBITS_BACKEND=cupy"]) == [{"TENSORBITS_BACKEND": "cupy"}]
    assert server_envs(["TENSORBITS_BACKEND=numpy GLIBC_TUNABLES=glibc.malloc.hugetlb=1"]) == [
        {"TENSORBITS_BACKEND": "numpy", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    ]
    assert server_envs(["TENSORBITS_BACKEND=cupy", "TENSORBITS_BACKEND=numpy"]) == [
        {"TENSORBITS_BACKEND": "cupy"},
        {"TENSORBITS_BACKEND": "numpy"},
    ]
    with pytest.raises(ValueError, match="KEY=VALUE"):
        server_envs(["TENSORBITS_BACKEND"])


class FakeEvent:
    """Stands in for ``cupy.cuda.Event``: each record moves the device clock on 1.5 ms."""

    clock = 0.0

    def __init__(self) -> None:
        self.at = 0.0
        self.synchronized = False

    def record(self) -> None:
        FakeEvent.clock += 1.5
        self.at = FakeEvent.clock

    def synchronize(self) -> None:
        self.synchronized = True


class FakeCuda:
    Event = FakeEvent

    @staticmethod
    def get_elapsed_time(begin: FakeEvent, end: FakeEvent) -> float:
        assert end.synchronized, "read before the end event completed"
        return end.at - begin.at


def test_event_timer_gives_seconds_between_the_events() -> None:
    ran: list[int] = []
    timed = event_timer(FakeCuda)
    assert timed(lambda: ran.append(1)) == pytest.approx(1.5e-3)
    assert ran == [1]


def test_cuda_shared_memory_without_cupy_says_skipped() -> None:
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: tests/gpu runs the benchmark")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cuda_shared_memory.py"), "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("skipped: CuPy cannot be imported"), done.stdout
