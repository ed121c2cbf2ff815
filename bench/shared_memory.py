"""System shared memory against HTTP and against memcpy, in one run.

``tensorbits serve`` (NumPy backend, shared memory on) and, when it can, the Triton peer
(bench/peers.py); a ``--mib`` MiB UINT8 BIT_NOT (default 64), best of ``--repeat`` interleaved
rounds:

  sdk-shm       the SDK's region (``client.shared_memory``): input in the region, the result a
                view of it (the server reads with preadv, writes with pwritev)
  raw-shm       the same request through stock tritonclient.http + tritonclient.utils.shared_memory
  http          the SDK's ``client.dml.bit_not(x)``: v2 binary over HTTP, the tensor each way
  memcpy        ``np.copyto`` into a region and out of one: moving the bytes at all
  triton-shm    the sdk-shm request against Triton with system shared memory (tritonclient)

Ratios: sdk-shm / memcpy (target <= 3), http / sdk-shm (target >= 5), triton-shm / sdk-shm
(target > 1). Each ``--server-env 'K=V ...'`` (ENV) is a server, all interleaved in every round
(the order rotated), each one's rows also divided by the first's: ``--server-env
TENSORBITS_BACKEND=cupy --server-env TENSORBITS_BACKEND=numpy --no-triton`` on a GPU host
(docs/gpu.md) puts a CuPy server (which also copies each tensor to the device and back: no
target counts that) beside a NumPy one.

  .venv/bin/python bench/shared_memory.py [--repeat N] [--mib N] [--no-triton] [--server-env ENV]...
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ is sys.path[0], where a bench module could shadow the standard library:
# import from the repository root instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from bench.harness import NOT, MiB, interleaved_best, note, tensorbits_server  # noqa: E402
from bench.peers import PeerUnavailable, triton_peer  # noqa: E402
from tensorbits_client import Client  # noqa: E402

Arr = np.ndarray[Any, Any]
Rows = dict[str, Callable[[], object]]


class TritonShm:
    """One region through stock tritonclient: input written once, output read as a view."""

    def __init__(self, url: str, x: Arr, tag: str) -> None:
        import tritonclient.http as triton
        import tritonclient.utils.shared_memory as shm

        self.triton, self.shm = triton, shm
        self.client = triton.InferenceServerClient(url, connection_timeout=120, network_timeout=120)
        self.nbytes = x.nbytes
        self.name = f"bench_{tag}"
        self.key = f"/tensorbits_bench_{tag}_{os.getpid()}"
        self.handle = shm.create_shared_memory_region(self.name, self.key, 2 * x.nbytes)
        try:
            shm.set_shared_memory_region(self.handle, [x])
            self.client.register_system_shared_memory(self.name, self.key, 2 * x.nbytes)
        except BaseException:
            shm.destroy_shared_memory_region(self.handle)
            raise
        self.input = triton.InferInput("InputTensor", [x.size], "UINT8")
        self.input.set_shared_memory(self.name, x.nbytes)
        self.output = triton.InferRequestedOutput("OutputTensor")
        self.output.set_shared_memory(self.name, x.nbytes, offset=x.nbytes)

    def __call__(self) -> Arr:
        self.client.infer(NOT, [self.input], outputs=[self.output])
        view: Arr = self.shm.get_contents_as_numpy(
            self.handle, np.uint8, [self.nbytes], offset=self.nbytes
        )
        return view

    def __enter__(self) -> TritonShm:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.client.unregister_system_shared_memory(self.name)
        finally:
            self.shm.destroy_shared_memory_region(self.handle)
            self.client.close()


def check(name: str, got: Arr, x: Arr) -> None:
    if not np.array_equal(got, ~x):
        raise SystemExit(f"{name}: wrong result")


def server_envs(values: list[str]) -> list[dict[str, str]]:
    """One server's environment per ``--server-env`` value; none given, one with the defaults."""
    envs = []
    for value in values or [""]:
        pairs = value.split()
        if not all("=" in pair for pair in pairs):
            raise ValueError(f"--server-env takes 'KEY=VALUE ...', not {value!r}")
        envs.append(dict(pair.split("=", 1) for pair in pairs))
    return envs


def server_rows(stack: contextlib.ExitStack, env: dict[str, str], x: Arr, tag: str) -> Rows:
    """One server's contestants (sdk-shm, raw-shm, http, their names ending in ``tag``), checked,
    and the memcpy bound through its region."""
    n = x.nbytes
    port = stack.enter_context(tensorbits_server(TENSORBITS_SHARED_MEMORY="true", **env))
    url = f"127.0.0.1:{port}"
    client = stack.enter_context(Client(f"http://{url}", timeout=120))
    region = stack.enter_context(client.shared_memory(3 * n))
    rx = region.put(x)
    check(f"sdk-shm{tag}", region.dml.bit_not(rx), x)
    check(f"http{tag}", client.dml.bit_not(x), x)
    raw = stack.enter_context(TritonShm(url, x, f"tb{tag.lstrip('@')}"))
    check(f"raw-shm{tag}", raw(), x)
    # The memcpy bound: the bytes into a region and out of one, as a client would copy them.
    dst = np.empty_like(x)
    copy_in = region.array(np.uint8, n)

    def memcpy() -> None:
        np.copyto(copy_in, x)
        np.copyto(dst, rx)

    return {
        f"sdk-shm{tag}": lambda: region.dml.bit_not(rx),
        f"raw-shm{tag}": raw,
        f"http{tag}": lambda: client.dml.bit_not(x),
        "memcpy": memcpy,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds (best of)")
    parser.add_argument("--mib", type=int, default=64, help="tensor size in MiB")
    parser.add_argument("--no-triton", action="store_true", help="leave the Triton peer out")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                        help="one server's extra environment, 'KEY=VALUE ...'; again for another "
                        "server")  # fmt: skip
    args = parser.parse_args()
    try:
        envs = server_envs(args.server_env)
    except ValueError as exc:
        parser.error(str(exc))
    tags = [""] if len(envs) == 1 else [f"@{i}" for i in range(1, len(envs) + 1)]
    n = args.mib * MiB
    x = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    print(
        f"# shared memory vs HTTP vs memcpy: {args.mib} MiB UINT8 BIT_NOT, best of {args.repeat} "
        f"interleaved rounds; {platform.machine()}, nproc {os.cpu_count()}, "
        f"python {platform.python_version()}, numpy {np.__version__}; server env "
        + "; ".join(
            f"{t} {v}".strip() for t, v in zip(tags, args.server_env or ["(default)"], strict=True)
        )
    )
    with contextlib.ExitStack() as stack:
        fns: Rows = {}
        for env, tag in zip(envs, tags, strict=True):
            for name, fn in server_rows(stack, env, x, tag).items():
                fns.setdefault(name, fn)  # memcpy once: through the first server's region
        if not args.no_triton:
            fns.update(triton_contestant(stack, x))
        best = interleaved_best(fns, args.repeat)
    width = max(map(len, best))
    for name, seconds in best.items():
        rate = 2 * n / seconds / 1e9
        print(f"{name:<{width}}  {seconds * 1e3:8.1f} ms   {rate:6.2f} GB/s moved (in + out)")
    pairs = [(f"sdk-shm{t}", "memcpy", "   (target <= 3)") for t in tags]
    pairs += [(f"http{t}", f"sdk-shm{t}", "   (target >= 5)") for t in tags]
    pairs += [(f"raw-shm{t}", f"sdk-shm{t}", "") for t in tags]
    pairs += [
        (row + t, row + tags[0], "") for t in tags[1:] for row in ("sdk-shm", "raw-shm", "http")
    ]
    if "triton-shm" in best:
        pairs.append(("triton-shm", f"sdk-shm{tags[0]}", "   (target > 1)"))
    for top, bottom, target in pairs:
        print(f"{f'{top} / {bottom}':<24} {best[top] / best[bottom]:6.2f}x{target}")
    return 0


def triton_contestant(stack: contextlib.ExitStack, x: Arr) -> dict[str, Callable[[], object]]:
    """The Triton peer's contestant, or nothing (with the reason) when it cannot run."""
    try:
        peer = stack.enter_context(triton_peer())
        runner = stack.enter_context(TritonShm(peer.http_url.removeprefix("http://"), x, "tr"))
        check("triton-shm", runner(), x)
    except (PeerUnavailable, OSError) as exc:
        note(f"no Triton peer: {exc}")
        return {}
    except Exception as exc:  # e.g. a Triton that refuses client shared memory
        note(f"Triton peer refused system shared memory: {type(exc).__name__}: {exc}")
        return {}
    note(f"Triton peer {peer.version} at {peer.http_url}")
    return {"triton-shm": runner}


if __name__ == "__main__":
    raise SystemExit(main())
