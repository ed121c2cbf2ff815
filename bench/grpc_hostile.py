"""Hostile gRPC messages at the server's default message limit: what each costs the server.

For each message (the worst shapes of ``tests/grpc_endpoint/test_grpc_hostile.py``, built up
to ``--mib`` MiB; 250 by default, under the 256 MiB ``TENSORBITS_MAX_BODY_BYTES``): the time to
its answer, the growth of the server's peak resident memory (``VmHWM`` after ``clear_refs``) as
a multiple of the message, and the latency of two bystanders probing meanwhile (gRPC ServerLive
and HTTP ``/v2/health/live``, each on its own thread). The baseline, measured in the same run on
the same server: a valid ModelInfer of the same size (BIT_NOT on raw UINT8 contents), whose
memory is the message, the response and one copy of the output.

    .venv/bin/python bench/grpc_hostile.py            # about 30 s
    .venv/bin/python bench/grpc_hostile.py --mib 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeAlias

import grpc

from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import wire

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import free_port, wait_until_up
from bench.harness.memory import vm

MiB = 1 << 20
Unary: TypeAlias = "grpc.UnaryUnaryMultiCallable[bytes, bytes]"
SERVICE = "/inference.GRPCInferenceService"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"


_field = wire.len_field


HEAD = _field(1, NOT.encode())


def _tensor(*parts: bytes) -> bytes:
    return _field(5, _field(1, b"InputTensor") + _field(2, b"UINT8") + b"".join(parts))


def _flood(unit: bytes, size: int) -> bytes:
    return unit * (size // len(unit))


ENTRY = _field(4, _field(1, b"k") + _field(2, b"\x08\x01"))
# The typed values a request may hold (TENSORBITS_MAX_JSON_ELEMENTS, 2^22), each the longest
# varint: the most protobuf is let build, refused after parsing by its shape of one element.
WIDE_VALUES = b"\xff" * 9 + b"\x01"
MESSAGES: dict[str, Callable[[int], bytes]] = {
    "empty raw contents": lambda size: HEAD + _flood(_field(7, b""), size),
    "unknown fields": lambda size: HEAD + _flood(b"\x48\x00", size),
    "model_name again and again": lambda size: _flood(_field(1, b""), size),
    "an input's parameters": lambda size: HEAD + _tensor(_field(3, b"\x01"), _flood(ENTRY, size)),
    "a packed shape": lambda size: HEAD + _tensor(_field(3, _flood(b"\x01", size))),
    "packed typed values": lambda size: (
        HEAD + _tensor(_field(3, b"\x01"), _field(5, _field(4, _flood(b"\x00", size))))
    ),
    "unpacked typed values": lambda size: (
        HEAD + _tensor(_field(3, b"\x01"), _field(5, _flood(b"\x20\x00", size)))
    ),
    "2^22 widest values (parsed)": lambda size: (
        HEAD + _tensor(_field(3, b"\x01"), _field(5, _field(5, WIDE_VALUES * (1 << 22))))
    ),
}


def _valid(size: int) -> bytes:
    request = pb.ModelInferRequest(model_name=NOT)
    request.inputs.add(name="InputTensor", datatype="UINT8", shape=[size])
    request.raw_input_contents.append(b"\x5a" * size)
    return request.SerializeToString()


class Probe:
    """``call`` over and over on a thread, timing each, until stopped."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.call = call
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.perf_counter()
            try:
                self.call()
            except Exception:
                self.failures += 1
            self.latencies.append(time.perf_counter() - began)
            time.sleep(0.005)

    def words(self) -> str:
        if not self.latencies:
            return "no answer"
        ms = sorted(1e3 * x for x in self.latencies)
        failed = f", {self.failures} failed" if self.failures else ""
        return f"median {statistics.median(ms):.1f} ms, max {ms[-1]:.0f} ms ({len(ms)}{failed})"


@contextmanager
def probes(grpc_port: int, http_port: int) -> Iterator[tuple[Probe, Probe]]:
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    live: Unary = channel.unary_unary(f"{SERVICE}/ServerLive")
    url = f"http://127.0.0.1:{http_port}/v2/health/live"
    both = (
        Probe(lambda: live(b"", timeout=10)),
        Probe(lambda: urllib.request.urlopen(url, timeout=10).read()),
    )
    for probe in both:
        probe.thread.start()
    time.sleep(0.2)
    for probe in both:
        probe.latencies.clear()
    try:
        yield both
    finally:
        for probe in both:
            probe.stop.set()
            probe.thread.join(15)
        channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=250, help="message size (default 250 MiB)")
    args = parser.parse_args()
    size = args.mib * MiB
    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "TENSORBITS_BACKEND": "numpy",
        "TENSORBITS_LOG_LEVEL": "warning",
        "TENSORBITS_GRPC_PORT": str(grpc_port),
    }
    argv = [sys.executable, "-m", "tensorbits.server.cli", "serve", "--port", str(http_port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    try:
        wait_until_up(f"http://127.0.0.1:{http_port}/v2/health/ready", 60, proc)
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=options) as channel:
            infer: Unary = channel.unary_unary(f"{SERVICE}/ModelInfer")
            cases = {"baseline: a valid request": _valid, **MESSAGES}
            print(
                f"messages of about {args.mib} MiB; server pid {proc.pid}, {os.cpu_count()} cores"
            )
            baseline_growth = None
            for name, build in cases.items():
                message = build(size - 64)
                Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
                before = vm(proc.pid, "VmRSS")
                with probes(grpc_port, http_port) as (live, health):
                    began = time.perf_counter()
                    try:
                        infer(message, timeout=120)
                        answer = "OK"
                    except grpc.RpcError as error:
                        answer = str(error.code()).removeprefix("StatusCode.")
                    seconds = time.perf_counter() - began
                grown = vm(proc.pid, "VmHWM") - before
                baseline_growth = baseline_growth or grown
                print(
                    f"{name:30s} {len(message) / MiB:6.0f} MiB  {answer:18s} {seconds * 1e3:6.0f} ms"
                    f"  peak +{grown / MiB:5.0f} MiB = {grown / len(message):4.2f}x the message"
                    f" ({grown / baseline_growth:4.2f}x the baseline's)"
                )
                print(f"    gRPC ServerLive: {live.words()}; HTTP health: {health.words()}")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
