"""HTTP service benchmark: ratios against baselines measured in the same run.

  (a) a 64 MiB BIT_NOT round trip through v2 binary (64 MiB in, 64 MiB out), plain-socket client,
      against the same request bytes through a bare FastAPI echo endpoint (same uvicorn settings)
      and against a raw loopback TCP echo; and the XOR variant (2 x 32 MiB in, 32 MiB out).
  (b) requests/s of a 16-element BIT_NOT in v2 binary against a bare FastAPI ping, under wrk;
      with --auth N also N alternating pairs of wrk runs, open and with one API key.
  (c) one /v1 batch of 100 dispatches against 100 v2 requests on one keep-alive connection.

Loopback only, bounded: about a minute. Usage:
  .venv/bin/python bench/http_service.py [--repeat N] [--seconds S] [--auth PAIRS] [--parts abc]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorbits_client import Batch, Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import PlainClient, baseline_server, interleaved_best, note, tensorbits_server
from bench.harness.baselines import RawEcho

MiB = 1 << 20
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"


def v2_binary_request(
    inputs: dict[str, np.ndarray], output: str
) -> tuple[bytes, list[bytes | memoryview]]:
    """The v2 binary-extension body: JSON header, then each input's bytes; returns (header, parts)."""
    header = {
        "inputs": [
            {"name": name, "shape": list(a.shape), "datatype": "UINT8",
             "parameters": {"binary_data_size": a.nbytes}}
            for name, a in inputs.items()
        ],
        "outputs": [{"name": output, "parameters": {"binary_data": True}}],
    }  # fmt: skip
    head = json.dumps(header).encode()
    return head, [head, *(a.data.cast("B") for a in inputs.values())]


def _service_call(
    client: PlainClient,
    model: str,
    parts: list[bytes | memoryview],
    head: bytes,
    expected: np.ndarray,
) -> Callable[[], None]:
    headers = {"Inference-Header-Content-Length": str(len(head))}

    def once() -> None:
        status, got_headers, body = client.request(
            "POST", f"/v2/models/{model}/infer", parts, headers
        )
        if status != 200:
            raise RuntimeError(f"service answered {status}: {bytes(body[:300])!r}")
        out = np.frombuffer(
            body, np.uint8, offset=int(got_headers["inference-header-content-length"])
        )
        if out.nbytes != expected.nbytes or out[:4096].tobytes() != expected[:4096].tobytes():
            raise RuntimeError("service returned a wrong result")

    return once


def _echo_call(
    client: PlainClient, parts: list[bytes | memoryview], size: int
) -> Callable[[], None]:
    def once() -> None:
        status, _, body = client.request("POST", "/echo", parts, {})
        if status != 200 or len(body) != size:
            raise RuntimeError(f"echo answered {status} with {len(body)} of {size} bytes")

    return once


def round_trips(repeat: int) -> list[tuple[str, float, float, float]]:
    a = np.full(32 * MiB, 0x5A, np.uint8)
    b = np.full(32 * MiB, 0x0F, np.uint8)
    big = np.full(64 * MiB, 0x5A, np.uint8)
    cases = {
        "BIT_NOT 64 MiB": (NOT, {"InputTensor": big}, np.bitwise_not(big)),
        "BIT_XOR 2x32 MiB": (XOR, {"ATensor": a, "BTensor": b}, a ^ b),
    }
    rows = []
    raw = RawEcho()
    with tensorbits_server() as port, baseline_server() as echo_port:
        service, echo = PlainClient(port), PlainClient(echo_port)
        for label, (model, inputs, expected) in cases.items():
            head, parts = v2_binary_request(inputs, "OutputTensor")
            size = sum(len(p) for p in parts)
            best = interleaved_best(
                {
                    "service": _service_call(service, model, parts, head, expected),
                    "echo": _echo_call(echo, parts, size),
                    "tcp": raw.round_trip_fn(size),
                },
                repeat,
            )
            rows.append((label, best["service"], best["echo"], best["tcp"]))
        service.close()
        echo.close()
    return rows


def row_xors(dispatches: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Two ``(dispatches, 16)`` UINT32 arrays, one small XOR per row (the same every call)."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**32, (dispatches, 16), dtype=np.uint32)
    b = rng.integers(0, 2**32, (dispatches, 16), dtype=np.uint32)
    return a, b


def row_xor_batch(
    client: Client, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]
) -> Batch[dict[str, np.ndarray[Any, Any]]]:
    """One /v1 batch of a 16-element XOR per row of ``a`` and ``b``: the small tensors packed into
    three buffers ("a", "b" and the output "c"), each dispatch bound at its row's offset."""
    row = 16 * a.itemsize
    batch = client.batch()
    buf_a, buf_b = batch.input("a", a), batch.input("b", b)
    buf_c = batch.empty("c", a.shape, "UINT32")
    for i in range(len(a)):
        batch.bit_xor(
            buf_a.tensor("UINT32", (16,), offset=i * row),
            buf_b.tensor("UINT32", (16,), offset=i * row),
            out=buf_c.tensor("UINT32", (16,), offset=i * row),
        )
    batch.output(buf_c)
    return batch


def batch_vs_requests(
    repeat: int, dispatches: int = 100, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """One /v1 batch of ``dispatches`` 16-element XORs against as many v2 requests, through the
    SDK on one keep-alive connection: what a round trip per operation costs (``row_xor_batch``)."""
    a, b = row_xors(dispatches)
    with tensorbits_server(**(env or {})) as port, Client(f"http://127.0.0.1:{port}") as client:

        def one_batch() -> None:
            result = row_xor_batch(client, a, b).run()["c"]
            if not np.array_equal(result.reshape(a.shape), a ^ b):
                raise RuntimeError("batch returned a wrong result")

        def many_requests() -> None:
            for i in range(dispatches):
                client.dml.bit_xor(a[i], b[i])

        best = interleaved_best({"batch": one_batch, "requests": many_requests}, repeat)
    return best["batch"], best["requests"]


WRK_SCRIPT = """
wrk.method = "{method}"
wrk.body = {body}
{headers}
"""


def lua_string(data: bytes) -> str:
    return '"' + "".join(f"\\{b}" for b in data) + '"'


def wrk_rps(
    port: int, path: str, method: str, body: bytes, headers: dict[str, str], seconds: int
) -> float:
    script = WRK_SCRIPT.format(
        method=method,
        body=lua_string(body) if body else "nil",
        headers="\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()),
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as f:
        f.write(script)
        f.flush()
        out = subprocess.run(
            ["wrk", "-t1", "-c16", f"-d{seconds}s", "-s", f.name, f"http://127.0.0.1:{port}{path}"],
            capture_output=True, text=True, check=True, timeout=seconds + 30,
        ).stdout  # fmt: skip
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise RuntimeError(f"{non2xx.group(1)} failed responses from {path}:\n{out}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if match is None:
        raise RuntimeError(f"could not read wrk's output:\n{out}")
    return float(match.group(1))


_WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk_latency_ms(out: str, percentile: int) -> float:
    """A latency percentile (50, 99, ...) from the output of ``wrk --latency``, in ms."""
    match = re.search(rf"^\s+{percentile}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no {percentile}% latency in wrk's output:\n{out}")
    return float(match.group(1)) * _WRK_UNITS[match.group(2)]


# One key, of the length `secrets.token_urlsafe(32)` makes, as docs/reliability.md suggests.
BENCH_API_KEY = "bench-key-0123456789abcdefghijklmnopqrstu"


@dataclass(frozen=True)
class KeyedFigures:
    """(b) with one API key: wrk runs alternating open and keyed (open, keyed, keyed, open, ...),
    so that each keyed run has an open one right beside it, measured under the same load."""

    open_rps: list[float]
    keyed_rps: list[float]

    @property
    def ratios(self) -> list[float]:
        return [k / o for o, k in zip(self.open_rps, self.keyed_rps, strict=True)]


def small_requests(
    seconds: int, auth_pairs: int = 0
) -> tuple[float, float, float, float, KeyedFigures | None]:
    """(service, service with the header cache off, ping before, ping after, the open/keyed
    pairs or None), in req/s. wrk repeats one request, so the service plans its header once
    (inference.HeaderCache); the cache-off figure is what a client sending a new header every
    time (a request id) gets. With ``auth_pairs``, that many (open, keyed) pairs are measured on
    a second pair of servers, one with TENSORBITS_API_KEYS set."""
    head, parts = v2_binary_request({"InputTensor": np.full(16, 65, np.uint8)}, "OutputTensor")
    body = b"".join(bytes(p) for p in parts)
    headers = {"Inference-Header-Content-Length": str(len(head))}
    keyed_headers = {**headers, "Authorization": f"Bearer {BENCH_API_KEY}"}
    path = f"/v2/models/{NOT}/infer"
    with contextlib.ExitStack() as servers:
        port = servers.enter_context(tensorbits_server())
        uncached_port = servers.enter_context(tensorbits_server(TENSORBITS_HEADER_CACHE_BYTES="0"))
        base = servers.enter_context(baseline_server())
        ping = wrk_rps(base, "/ping", "GET", b"", {}, seconds)
        infer = wrk_rps(port, path, "POST", body, headers, seconds)
        uncached = wrk_rps(uncached_port, path, "POST", body, headers, seconds)
        keyed = None
        if auth_pairs:
            # A server of its own for the open side too, started with the keyed one: the two
            # differ in the key alone, not in how long they have run.
            open_port = servers.enter_context(tensorbits_server())
            keyed_port = servers.enter_context(tensorbits_server(TENSORBITS_API_KEYS=BENCH_API_KEY))
            keyed = KeyedFigures([], [])
            for pair in range(auth_pairs):
                runs = [
                    (keyed.open_rps, open_port, headers),
                    (keyed.keyed_rps, keyed_port, keyed_headers),
                ]
                for figures, target, sent in runs if pair % 2 == 0 else runs[::-1]:
                    figures.append(wrk_rps(target, path, "POST", body, sent, seconds))
        ping_again = wrk_rps(base, "/ping", "GET", b"", {}, seconds)
    return infer, uncached, ping, ping_again, keyed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seconds", type=int, default=5, help="duration of each wrk run")
    parser.add_argument(
        "--auth",
        type=int,
        default=0,
        metavar="PAIRS",
        help="(b) also with one API key (TENSORBITS_API_KEYS, wrk sending Authorization: "
        "Bearer): PAIRS wrk runs of an open and of a keyed server, alternating (default 0: none)",
    )
    parser.add_argument(
        "--parts", default="abc", help="which of (a), (b), (c) to run, e.g. 'b' (default: abc)"
    )
    args = parser.parse_args()
    if "b" in args.parts and shutil.which("wrk") is None:
        sys.exit("wrk is needed for (b): apt-get install wrk")
    if "a" in args.parts:
        print_round_trips(args.repeat)
    if "c" in args.parts:
        print_batches(args.repeat)
    if "b" in args.parts:
        print_small_requests(args.seconds, args.auth)


def print_round_trips(repeat: int) -> None:
    note("(a) large round trips ...")
    print("(a) large round trips, best of", repeat, "(plain-socket client)")
    print(
        f"{'case':<18} {'service':>9} {'echo':>9} {'raw tcp':>9} {'svc/echo':>9} {'echo/tcp':>9} {'svc/tcp':>8}"
    )
    for label, svc, echo, tcp in round_trips(repeat):
        print(
            f"{label:<18} {svc * 1e3:>7.1f}ms {echo * 1e3:>7.1f}ms {tcp * 1e3:>7.1f}ms "
            f"{svc / echo:>8.2f}x {echo / tcp:>8.2f}x {svc / tcp:>7.2f}x"
        )


def print_batches(repeat: int) -> None:
    note("(c) one batch against many requests ...")
    print(f"\n(c) 100 dispatches of a 16-element BIT_XOR, SDK, best of {repeat}")
    for label, env in (("", {}), ("header cache off: ", {"TENSORBITS_HEADER_CACHE_BYTES": "0"})):
        one, many = batch_vs_requests(repeat, env=env)
        print(
            f"{label}one /v1 batch {one * 1e3:.1f} ms; 100 v2 requests {many * 1e3:.1f} ms; "
            f"batch is {many / one:.1f}x faster (target >= 20x)"
        )


def print_small_requests(seconds: int, auth_pairs: int) -> None:
    note("(b) small requests under wrk ...")
    infer, uncached, ping, ping_again, keyed = small_requests(seconds, auth_pairs)
    baseline = (ping + ping_again) / 2
    print(f"\n(b) 16-element BIT_NOT, v2 binary, wrk -t1 -c16 -d{seconds}s")
    print(
        f"service {infer:,.0f} req/s (header cache off: {uncached:,.0f}); "
        f"bare FastAPI ping {ping:,.0f} / {ping_again:,.0f} req/s (before/after)"
    )
    print(
        f"ratio service/ping: {infer / baseline:.2f}x (target >= 0.6x); "
        f"header cache off: {uncached / baseline:.2f}x"
    )
    if keyed is not None:
        print(f"one API key, {len(keyed.ratios)} pairs of runs (open, keyed), alternating:")
        for o, k, ratio in zip(keyed.open_rps, keyed.keyed_rps, keyed.ratios, strict=True):
            print(f"  open {o:,.0f} req/s, keyed {k:,.0f} req/s: {ratio:.3f}x")
        print(
            f"keyed/open: median {statistics.median(keyed.ratios):.3f}x; means "
            f"{statistics.mean(keyed.keyed_rps):,.0f} / {statistics.mean(keyed.open_rps):,.0f} "
            f"req/s = {statistics.mean(keyed.keyed_rps) / statistics.mean(keyed.open_rps):.3f}x"
        )


if __name__ == "__main__":
    main()
