"""What the allocator setting of ``tensorbits.memory`` costs a large request, and what it saves.

Starts two ``tensorbits serve`` (NumPy backend): one as shipped (the mmap threshold fixed at
1 MiB), one with ``TENSORBITS_MALLOC_TUNING=0`` (glibc's dynamic threshold). For each size, a
plain-socket client sends the same v2 BIT_XOR request (two UINT8 inputs of that size, one output)
to each in turn; best of ``--repeat`` interleaved rounds, so drift on a shared machine hits both.
With the setting, every body and output buffer of 1 MiB or more is a fresh mapping (page faults
on first touch) instead of reused heap memory: the time ratio is that cost. Then each server's
RSS and peak (VmRSS, VmHWM) after the rounds.

    .venv/bin/python bench/malloc_tuning.py                      # 2 x 1, 4, 8, 32 MiB; 15 rounds
    .venv/bin/python bench/malloc_tuning.py --sizes 8 --repeat 31
    .venv/bin/python bench/malloc_tuning.py --server-env GLIBC_TUNABLES=glibc.malloc.hugetlb=1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import BIN, PlainClient, free_port, interleaved_best, wait_until_up
from bench.harness.memory import MiB, vm
from bench.http_service import XOR, v2_binary_request


@contextlib.contextmanager
def serve(env: dict[str, str]) -> Iterator[tuple[int, int]]:
    """(port, pid) of a tensorbits server with ``env`` added."""
    port = free_port()
    settings = {
        "TENSORBITS_BACKEND": "numpy",
        "TENSORBITS_LOG_LEVEL": "warning",
        "TENSORBITS_GRPC_PORT": str(free_port()),
        **env,
    }
    proc = subprocess.Popen(
        [str(BIN / "tensorbits"), "serve", "--port", str(port)],
        env={**os.environ, **settings},
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/v2/health/live")
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def round_trip(client: PlainClient, nbytes: int) -> Callable[[], None]:
    rng = np.random.default_rng(nbytes)
    a = rng.integers(0, 256, nbytes, np.uint8)
    b = rng.integers(0, 256, nbytes, np.uint8)
    head, parts = v2_binary_request({"ATensor": a, "BTensor": b}, "OutputTensor")
    headers = {"Inference-Header-Content-Length": str(len(head))}
    expected = a ^ b

    def once() -> None:
        status, got, body = client.request("POST", f"/v2/models/{XOR}/infer", parts, headers)
        if status != 200:
            raise RuntimeError(f"service answered {status}: {bytes(body[:300])!r}")
        offset = int(got["inference-header-content-length"])
        if not np.array_equal(np.frombuffer(body, np.uint8, offset=offset), expected):
            raise RuntimeError("wrong answer")

    return once


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 32], help="MiB per input")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="NAME=VALUE",
        help="more environment for both servers (e.g. GLIBC_TUNABLES=glibc.malloc.hugetlb=1)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.server_env)
    servers = {"tuned": extra, "glibc default": {**extra, "TENSORBITS_MALLOC_TUNING": "0"}}
    with contextlib.ExitStack() as stack:
        found = {name: stack.enter_context(serve(env)) for name, env in servers.items()}
        clients = {name: PlainClient(port) for name, (port, _) in found.items()}
        print(
            f"v2 BIT_XOR round trip, best of {args.repeat} interleaved rounds; server env "
            f"{args.server_env or '-'}"
        )
        print("inputs          tuned   glibc default   tuned / default")
        for size in args.sizes:
            calls: dict[str, Callable[[], object]] = {
                name: round_trip(c, size * MiB) for name, c in clients.items()
            }
            best = interleaved_best(calls, args.repeat)
            tuned, default = best["tuned"], best["glibc default"]
            print(
                f"  2 x {size:3d} MiB {tuned * 1e3:8.1f} ms {default * 1e3:10.1f} ms "
                f"{tuned / default:12.2f}x"
            )
        print("server memory after the rounds: RSS, peak (VmHWM)")
        for name, (_, pid) in found.items():
            print(
                f"  {name:<14} {vm(pid, 'VmRSS') / MiB:5.0f} MiB {vm(pid, 'VmHWM') / MiB:6.0f} MiB"
            )
        for client in clients.values():
            client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
