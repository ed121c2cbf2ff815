"""Client SDK benchmark: is the SDK the bottleneck? Ratios against baselines timed in the same run.

Against one ``tensorbits serve`` (NumPy backend, loopback), best of ``--repeat`` interleaved rounds:

  (a) BIT_XOR, 2 x 32 MiB UINT8 in, 32 MiB out, and (b) BIT_NOT, 64 MiB in and out, v2 binary:
      ``sdk`` (``client.dml``), ``plain`` (a plain socket sending the SDK's own request bytes,
      the answer read into one buffer; target sdk/plain <= 1.3), ``triton`` (tritonclient.http;
      target: sdk faster) and ``httpx`` (the naive ``httpx.Client().post``, for scale)
  (c) a 16-element BIT_XOR's latency: the SDK against a bare httpx post of prebuilt bytes
  (d) one /v1 batch of 100 16-element UINT32 XORs against 100 v2 requests through the SDK
      (header cache on and off); target: the batch 20x faster

Usage: .venv/bin/python bench/client.py [--repeat N] [--calls N]. About a minute; loopback only.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ is sys.path[0], where a bench module could shadow the standard library
# or a package (httpx imports http.client): import from the repository root instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench.harness import PlainClient, interleaved_best, note, tensorbits_server  # noqa: E402
from tensorbits_client import Batch, Client  # noqa: E402
from tensorbits_client._codec import Framed, encode_infer  # noqa: E402

MiB = 1 << 20
XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
TARGET_PLAIN = 1.3
TARGET_BATCH = 20.0  # (d): one /v1 batch against 100 v2 requests


def _request(model: str, inputs: dict[str, np.ndarray[Any, Any]]) -> tuple[str, Framed]:
    body = encode_infer(list(inputs.items()), {"feature_level": "6_4"}, binary=True)
    return f"/v2/models/{model}/infer", body


def _triton(port: int) -> Callable[[str, dict[str, np.ndarray[Any, Any]]], Any] | None:
    try:
        import tritonclient.http as triton
    except ImportError:
        note("tritonclient[http] is not installed: its column is left out")
        return None
    client = triton.InferenceServerClient(
        f"127.0.0.1:{port}", connection_timeout=120, network_timeout=120
    )

    def call(model: str, arrays: dict[str, np.ndarray[Any, Any]]) -> Any:
        inputs = []
        for name, array in arrays.items():
            tensor = triton.InferInput(name, list(array.shape), "UINT8")
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        output = triton.InferRequestedOutput("OutputTensor", binary_data=True)
        result = client.infer(model, inputs, outputs=[output], parameters={"feature_level": "6_4"})
        return result.as_numpy("OutputTensor")

    return call


def _big_calls(
    method: Callable[..., object],
    model: str,
    arrays: dict[str, np.ndarray[Any, Any]],
    path: str,
    body: Framed,
    url: str,
    joined: bytes,
    plain: PlainClient,
    naive: httpx.Client,
    triton: Callable[[str, dict[str, np.ndarray[Any, Any]]], Any] | None,
) -> dict[str, Callable[[], object]]:
    """One case's timed calls, each a closure over this call's arguments (not the caller's loop)."""
    fns: dict[str, Callable[[], object]] = {
        "sdk": lambda: method(*arrays.values()),
        "plain": lambda: plain.request("POST", path, list(body.parts), body.headers),
        "httpx": lambda: naive.post(url, content=joined, headers=body.headers).content,
    }
    if triton is not None:
        fns["triton"] = lambda: triton(model, arrays)
    return fns


def big_rows(port: int, repeat: int) -> list[tuple[str, dict[str, float]]]:
    sdk = Client(f"http://127.0.0.1:{port}")
    plain = PlainClient(port)
    naive = httpx.Client(timeout=120)
    triton = _triton(port)
    rng = np.random.default_rng(0)
    cases = {
        "BIT_XOR 2 x 32 MiB -> 32 MiB": (
            XOR,
            {
                "ATensor": rng.integers(0, 256, 32 * MiB, dtype=np.uint8),
                "BTensor": rng.integers(0, 256, 32 * MiB, dtype=np.uint8),
            },
        ),
        "BIT_NOT 64 MiB -> 64 MiB": (
            NOT,
            {"InputTensor": rng.integers(0, 256, 64 * MiB, dtype=np.uint8)},
        ),
    }
    rows = []
    for label, (model, arrays) in cases.items():
        path, body = _request(model, arrays)
        joined = b"".join(body.parts)
        url = f"http://127.0.0.1:{port}{path}"
        method = sdk.dml.bit_xor if model == XOR else sdk.dml.bit_not
        expected = np.bitwise_xor(*arrays.values()) if model == XOR else ~arrays["InputTensor"]
        assert np.array_equal(method(*arrays.values()), expected), "SDK result is wrong"
        fns = _big_calls(method, model, arrays, path, body, url, joined, plain, naive, triton)
        note(f"timing {label} ...")
        rows.append((label, interleaved_best(fns, repeat)))
        del joined
    plain.close()
    naive.close()
    sdk.close()
    return rows


def small_latency(port: int, calls: int) -> dict[str, tuple[float, float]]:
    x = np.arange(16, dtype=np.uint8)
    y = x[::-1].copy()
    path, body = _request(XOR, {"ATensor": x, "BTensor": y})
    joined = b"".join(body.parts)
    url = f"http://127.0.0.1:{port}{path}"
    times: dict[str, list[float]] = {"sdk": [], "httpx": []}
    with Client(f"http://127.0.0.1:{port}") as sdk, httpx.Client() as bare:
        fns: dict[str, Callable[[], object]] = {
            "sdk": lambda: sdk.dml.bit_xor(x, y),
            "httpx": lambda: bare.post(url, content=joined, headers=body.headers).content,
        }
        for fn in fns.values():
            for _ in range(20):  # warm: connections, the operator tables, caches
                fn()
        for _ in range(calls):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: (min(ts), statistics.median(ts)) for name, ts in times.items()}


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
    repeat: int, env: dict[str, str], dispatches: int = 100
) -> tuple[float, float]:
    """(d): best seconds of one /v1 batch and of ``dispatches`` v2 requests."""
    a, b = row_xors(dispatches)
    with tensorbits_server(**env) as port, Client(f"http://127.0.0.1:{port}") as client:

        def one_batch() -> None:
            result = row_xor_batch(client, a, b).run()["c"]
            if not np.array_equal(result.reshape(a.shape), a ^ b):
                raise RuntimeError("batch returned a wrong result")

        def many_requests() -> None:
            for i in range(dispatches):
                client.dml.bit_xor(a[i], b[i])

        best = interleaved_best({"batch": one_batch, "requests": many_requests}, repeat)
    return best["batch"], best["requests"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="best of N for the big rows")
    parser.add_argument("--calls", type=int, default=500, help="calls timed for the latency rows")
    args = parser.parse_args()
    with tensorbits_server(TENSORBITS_CPU_THREADS="1") as port:
        rows = big_rows(port, args.repeat)
        latency = small_latency(port, args.calls)

    print(
        f"Client SDK benchmark: {platform.python_implementation()} {platform.python_version()}, "
        f"httpx {httpx.__version__}, NumPy backend, loopback; best of {args.repeat}.\n"
    )
    print(
        "| round trip | sdk ms | plain ms | tritonclient ms | naive httpx ms | sdk/plain | sdk/triton |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    ok = True
    for label, best in rows:
        ratio = best["sdk"] / best["plain"]
        triton = best.get("triton")
        ok &= ratio <= TARGET_PLAIN and (triton is None or best["sdk"] < triton)
        triton_ms = "-" if triton is None else f"{triton * 1e3:.1f}"
        triton_ratio = "-" if triton is None else f"{best['sdk'] / triton:.2f}"
        print(
            f"| {label} | {best['sdk'] * 1e3:.1f} | {best['plain'] * 1e3:.1f} | {triton_ms} | "
            f"{best['httpx'] * 1e3:.1f} | {ratio:.2f} | {triton_ratio} |"
        )
    print(f"\nTargets: sdk/plain <= {TARGET_PLAIN}, sdk/triton < 1.\n")
    print(f"| 16-element BIT_XOR, {args.calls} calls | min µs | median µs |")
    print("|---|---:|---:|")
    for name, (low, mid) in latency.items():
        label = "sdk (dml.bit_xor)" if name == "sdk" else "bare httpx post, prebuilt bytes"
        print(f"| {label} | {low * 1e6:.0f} | {mid * 1e6:.0f} |")
    overhead = latency["sdk"][1] - latency["httpx"][1]
    print(f"\nSDK overhead per small call (median): {overhead * 1e6:.0f} µs")
    print(f"\n(d) 100 dispatches of a 16-element BIT_XOR, SDK, best of {args.repeat}")
    for label, env in (("", {}), ("header cache off: ", {"TENSORBITS_HEADER_CACHE_BYTES": "0"})):
        one, many = batch_vs_requests(args.repeat, env)
        ok &= many / one >= TARGET_BATCH
        print(
            f"{label}one /v1 batch {one * 1e3:.1f} ms; 100 v2 requests {many * 1e3:.1f} ms; "
            f"batch is {many / one:.1f}x faster (target >= {TARGET_BATCH:g}x)"
        )
    print("targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
