"""CUDA shared memory through the server against a device-to-device copy, in one run.

``tensorbits serve`` (CuPy backend, CUDA shared memory on) and a ``--mib`` MiB UINT8 BIT_NOT
(default 256 in, 256 out), ``--rounds`` interleaved rounds after a warm-up of each (best and
median), in two device regions made by stock ``tritonclient.utils.cuda_shared_memory`` in this
process. The request rows are wall-clock (what a client sees); the in-process rows (d2d-*, *-not)
are CUDA events on the stream (bench/gpu_ops.py's ``event_timer``): by wall clock, right after
other GPU work, two copies once measured less than one. The rows:

  cuda-shm-http  input and output in the regions, through tritonclient.http: no tensor byte on
                 the socket; cuda-shm-grpc: the same through tritonclient.grpc
  cuda-shm-{http,grpc}-4k  the same on the first 4 KiB: a request's cost whatever its size
  http-binary    the tensors in host memory instead: v2 binary over HTTP
  d2d-copy       ``out[...] = in`` between the two regions: what the kernel has to move
  d2d-in-out     a staged tensor copied in and the output out: what a client copying pays
  cupy-not       ``cupy.invert`` in this process; core-not: the server's operator core here

Then the ratios (cuda-shm / d2d-copy: target at most 2x) and where a request's time goes in the
server (the model's statistics). Without CuPy, a device or cuda-bindings: ``skipped: <reason>``,
exit 0. On a GPU host, with the environment ``make gpu-check`` sets up (docs/gpu.md):

  python bench/cuda_shared_memory.py [--rounds N] [--mib N]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ is sys.path[0], where a bench module could shadow the standard library:
# import from the repository root instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))
# Host arrays validated in one step, as the tests do (tests/support/host_calls.py).
sys.path.insert(0, str(_HERE.parent / "tests"))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from support.host_calls import validate_arrays  # noqa: E402

from bench.gpu_ops import event_timer  # noqa: E402
from bench.harness import NOT, MiB, free_port, interleaved_times, tensorbits_server, wall  # noqa: E402
from tensorbits.core.backends import select_backend  # noqa: E402

GiB = 1 << 30
DEVICE = 0
SMALL = 4096  # bytes: the small request, whose time is the fixed cost of one


def unavailable() -> str | None:
    """Why this benchmark cannot run here, or None."""
    try:
        import cupy
    except Exception as exc:
        return f"CuPy cannot be imported ({type(exc).__name__}: {exc})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        return f"no CUDA device ({type(exc).__name__}: {exc})"
    if count <= DEVICE:
        return f"no CUDA device {DEVICE} ({count} found)"
    try:
        import tritonclient.utils.cuda_shared_memory  # noqa: F401
    except Exception as exc:  # RuntimeError without cuda-bindings
        return f"tritonclient.utils.cuda_shared_memory cannot be imported ({exc})"
    return None


@contextlib.contextmanager
def cupy_server(n: int) -> Iterator[tuple[str, str]]:
    """``tensorbits serve`` on the CuPy backend with CUDA shared memory; (HTTP, gRPC) as
    ``host:port``."""
    grpc_port = free_port()
    with tensorbits_server(
        TENSORBITS_BACKEND="cupy",
        TENSORBITS_DEVICE_ID=str(DEVICE),
        TENSORBITS_SHARED_MEMORY="true",
        TENSORBITS_GRPC_PORT=str(grpc_port),
        # http-binary sends the tensor in the body: room for it and its JSON header.
        TENSORBITS_MAX_BODY_BYTES=str(n + MiB),
        TENSORBITS_MAX_INFLIGHT_BYTES=str(max(2 * GiB, 4 * n)),
    ) as port:
        yield f"127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"


class Contestants:
    """Two CUDA regions registered with the server, the clients, and one callable per row."""

    def __init__(self, stack: contextlib.ExitStack, urls: tuple[str, str], n: int) -> None:
        import cupy
        import tritonclient.grpc as triton_grpc
        import tritonclient.http as triton
        import tritonclient.utils.cuda_shared_memory as cudashm

        self.cupy, self.n = cupy, n
        self.http = triton.InferenceServerClient(
            urls[0], connection_timeout=300, network_timeout=300
        )
        stack.callback(self.http.close)
        self.grpc = triton_grpc.InferenceServerClient(urls[1])
        stack.callback(self.grpc.close)
        handles = []
        for name in ("bench_in", "bench_out"):
            handle = cudashm.create_shared_memory_region(name, n, DEVICE)
            stack.callback(cudashm.destroy_shared_memory_region, handle)
            handles.append(handle)
        # Unregistered before the memory is freed (callbacks run last-in, first-out).
        stack.callback(self.http.unregister_cuda_shared_memory)
        for name, handle in zip(("bench_in", "bench_out"), handles, strict=True):
            self.http.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), DEVICE, n)
        self.x_host = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
        self.x, self.y = (self.device_view(handle) for handle in handles)
        self.x.set(self.x_host)
        self.staged = self.x.copy()  # d2d-in-out copies it in: the input region keeps its bytes
        self.copied_out = cupy.empty_like(self.y)
        self.core = select_backend("cupy", device_id=DEVICE).backend
        stack.callback(self.core.close)
        self.core_call = validate_arrays(NOT, {"InputTensor": self.x_host}, None)
        self.requests: dict[str, tuple[Any, list[Any], list[Any]]] = {}
        fronts = (("http", triton, self.http), ("grpc", triton_grpc, self.grpc))
        for label, module, client in fronts:
            for suffix, size in (("", n), ("-4k", SMALL)):
                tensor = module.InferInput("InputTensor", [size], "UINT8")
                tensor.set_shared_memory("bench_in", size)
                output = module.InferRequestedOutput("OutputTensor")
                output.set_shared_memory("bench_out", size)
                self.requests[label + suffix] = (client, [tensor], [output])
        self.host_input = triton.InferInput("InputTensor", [n], "UINT8")
        self.host_input.set_data_from_numpy(self.x_host, binary_data=True)
        self.host_output = triton.InferRequestedOutput("OutputTensor", binary_data=True)

    def device_view(self, handle: Any) -> Any:
        """A CuPy array over a region's device memory (no copy). tritonclient keeps the address
        as ``_base_addr``, which its own ``as_shared_memory_tensor`` reads."""
        cuda = self.cupy.cuda
        memory = cuda.UnownedMemory(int(handle._base_addr), self.n, handle, DEVICE)
        return self.cupy.ndarray((self.n,), self.cupy.uint8, cuda.MemoryPointer(memory, 0))

    def sync(self) -> None:
        self.cupy.cuda.Device(DEVICE).synchronize()

    def shm(self, label: str) -> Callable[[], object]:
        client, inputs, outputs = self.requests[label]
        return functools.partial(client.infer, NOT, inputs, outputs=outputs)

    def http_binary(self) -> Any:
        result = self.http.infer(NOT, [self.host_input], outputs=[self.host_output])
        return result.as_numpy("OutputTensor")

    # The in-process rows launch without a synchronize: their events are recorded on the stream.
    def d2d_copy(self) -> None:
        self.y[...] = self.x

    def d2d_in_out(self) -> None:
        self.x[...] = self.staged
        self.copied_out[...] = self.y

    def cupy_not(self) -> None:
        self.cupy.invert(self.x, out=self.y)

    def core_not(self) -> None:
        self.core.run(self.core_call, [self.x], self.y)

    def check(self) -> None:
        """Each server contestant writes the right bytes (the output cleared before each)."""
        want = ~self.x
        for label in self.requests:
            self.y.fill(0)
            self.sync()
            self.shm(label)()
            size = SMALL if label.endswith("-4k") else self.n
            if not bool(self.cupy.array_equal(self.y[:size], want[:size])):
                raise SystemExit(f"cuda-shm-{label}: wrong result")
        if not np.array_equal(self.http_binary(), ~self.x_host):
            raise SystemExit("http-binary: wrong result")
        self.y.fill(0)
        self.core_not()
        if not bool(self.cupy.array_equal(self.y, want)):
            raise SystemExit("core-not: wrong result")

    def phases(self, label: str, requests: int = 7) -> str:
        """Where a request's time goes in the server: the model's statistics over ``requests``
        more of them, per request (queue, decode and plan, run, encode), beside the time the
        client saw."""

        def totals() -> dict[str, int]:
            stats = self.http.get_inference_statistics(NOT)["model_stats"][0]
            return {k: int(v["ns"]) for k, v in stats["inference_stats"].items()}

        once = self.shm(label)
        before = totals()
        started = time.perf_counter()
        for _ in range(requests):
            once()
        seen_ms = (time.perf_counter() - started) * 1e3 / requests
        after = totals()
        ms = {k: (after[k] - before[k]) / requests / 1e6 for k in after}
        return (
            f"cuda-shm-{label:<8} client {seen_ms:6.2f} ms; server: success {ms['success']:.2f}, "
            f"queue {ms['queue']:.2f}, compute_input {ms['compute_input']:.2f}, "
            f"compute_infer {ms['compute_infer']:.2f}, compute_output {ms['compute_output']:.2f} ms"
        )

    def timers(self) -> dict[str, Callable[[], float]]:
        """Each row's timer. core_not has run (check), so the current stream is the backend's
        own for this thread, where the copies and the events go too."""
        events = event_timer(self.cupy.cuda)
        timers = {f"cuda-shm-{label}": wall(self.shm(label)) for label in self.requests}
        timers["http-binary"] = wall(self.http_binary)
        for name, fn in (
            ("d2d-copy", self.d2d_copy),
            ("d2d-in-out", self.d2d_in_out),
            ("cupy-not", self.cupy_not),
            ("core-not", self.core_not),
        ):
            timers[name] = functools.partial(events, fn)
        return timers


def header(args: argparse.Namespace) -> str:
    import cupy

    runtime = cupy.cuda.runtime
    name = runtime.getDeviceProperties(DEVICE)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return (
        f"# CUDA shared memory vs device-to-device copy vs HTTP: {args.mib} MiB UINT8 BIT_NOT, "
        f"{args.rounds} interleaved rounds; {name} (device {DEVICE}), driver "
        f"{runtime.driverGetVersion()}, CUDA runtime {runtime.runtimeGetVersion()}, cupy "
        f"{cupy.__version__}, numpy {np.__version__}, python {platform.python_version()}, "
        f"nproc {os.cpu_count()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds (best of)")
    parser.add_argument("--mib", type=int, default=256, help="tensor size in MiB")
    args = parser.parse_args()
    if (reason := unavailable()) is not None:
        print(f"skipped: {reason}")
        return 0
    n = args.mib * MiB
    print(header(args), flush=True)
    with contextlib.ExitStack() as stack:
        urls = stack.enter_context(cupy_server(n))
        contestants = Contestants(stack, urls, n)
        contestants.check()
        times = interleaved_times(contestants.timers(), args.rounds)
        phases = [contestants.phases(label) for label in contestants.requests]
    best = {name: min(seconds) for name, seconds in times.items()}
    width = max(map(len, best))
    print(f"{'':<{width}}  {'best':>9}     {'median':>9}     best GB/s moved (in + out), clock")
    for name, seconds in times.items():
        moved = (SMALL if name.endswith("-4k") else n) * (4 if name == "d2d-in-out" else 2)
        clock = "CUDA events" if name.startswith(("d2d-", "cupy-", "core-")) else "wall"
        print(
            f"{name:<{width}}  {best[name] * 1e3:9.2f} ms  {statistics.median(seconds) * 1e3:9.2f} "
            f"ms  {moved / best[name] / 1e9:8.1f}  {clock}"
        )
    for label in ("http", "grpc"):
        shm_s = best[f"cuda-shm-{label}"]
        print(f"cuda-shm-{label} / d2d-copy    {shm_s / best['d2d-copy']:7.2f}x")
        print(f"cuda-shm-{label} / d2d-in-out  {shm_s / best['d2d-in-out']:7.2f}x")
        overhead = (shm_s - best["core-not"]) * 1e3
        print(f"cuda-shm-{label} - core-not    {overhead:7.2f} ms per request beyond the kernel")
        fixed = best[f"cuda-shm-{label}-4k"] * 1e3
        print(f"cuda-shm-{label}-4k            {fixed:7.2f} ms per request whatever its size")
    print(f"http-binary / cuda-shm-http {best['http-binary'] / best['cuda-shm-http']:7.2f}x")
    print(f"core-not / d2d-copy         {best['core-not'] / best['d2d-copy']:7.2f}x")
    print(f"cupy-not / core-not         {best['cupy-not'] / best['core-not']:7.2f}x")
    print("# per request, mean of 7 more (the model's statistics, GET /v2/models/.../stats):")
    print("\n".join(phases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
