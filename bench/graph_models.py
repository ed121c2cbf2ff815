"""A graph model against the same chain run other ways, in one run.

The chain: z = NOT((x XOR y) >> 3), an ONNX file of three nodes (BitwiseXor of the inputs x and
y, BitShift RIGHT by a scalar initializer, BitwiseNot), UINT32, ``--mib`` MiB per input tensor
(default 64). Starts ``tensorbits serve`` (bench.harness.tensorbits_server: NumPy backend, free
ports), loads the file as a graph model with Triton's load API, starts the Triton peer
(bench/peers.py: Triton 2.51, the chain as one Python-backend model of the same name and
tensors), then measures, best of ``--repeat`` interleaved rounds:

  graph HTTP        the graph model, one v2 binary request (bench.harness.PlainClient)
  keyed graph HTTP  z = NOT((x XOR key) >> 3), the key a scalar constant of the file: one
                    input, the bytes of a BIT_NOT in and out
  binding graph HTTP  the chain as a binding graph model (model.json): the "v1 batch (DML)"
                    row's dispatches, loaded once, one v2 request of x, y and the count
  3 requests HTTP   onnx.BitwiseXor-18, onnx.BitShift-11 (direction RIGHT), onnx.BitwiseNot-18,
                    three v2 binary requests, each answer's bytes sent on as the next input
  v1 batch (ONNX)   one /v1 batch of the same three ONNX operators (built with the SDK's
                    client.batch(), sent on the same plain socket): two server buffers for the
                    intermediates (ONNX operators do not run in place)
  v1 batch (DML)    one /v1 batch of BIT_XOR, BIT_SHIFT_RIGHT (the count broadcast by stride 0),
                    BIT_NOT, all in place in x's buffer: the cheapest batch of the chain
  Triton chain HTTP the peer's chain model, the same request body as "graph HTTP"
  BIT_NOT HTTP      one ``--mib`` MiB UINT8 DML BIT_NOT round trip (the request of
                    bench/http_service.py): the baseline of the round-trip target
  ONNX Runtime      onnxruntime.InferenceSession (CPUExecutionProvider) on the same file, in
                    this process: compute only
  run_graph         tensorbits.core.graphs.run_graph on the NumPy backend, in this process (what
                    the server runs for the graph, without HTTP)
  NumPy 3 calls     np.bitwise_xor into a new array, then the shift and NOT in place

and, read from the statistics (GET /v2/models/{name}/stats) around each graph request and each
BIT_NOT request, that request's phases as Triton counts them: compute_input (decode, plan),
compute_infer (the run: the server's compute), compute_output, and its whole time in the server
(success: from the request's head, the body's arrival included, to its last byte handed on).
Every answer's bytes are checked against NumPy once per configuration (the warm-up call); the
timed answers' sizes and last 4 KiB.

Prints each figure and the ratios the targets name: graph round trip / BIT_NOT round trip
(target <= 1.3x), the server's graph compute / ONNX Runtime's (target < 1.0x), and the graph
against three requests, the /v1 batches and Triton. When the Triton peer cannot start, says
why and measures the rest. Loopback only, under a minute with the defaults. Usage:

  .venv/bin/python bench/graph_models.py [--repeat N] [--mib N] [--no-triton]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import PlainClient, note, tensorbits_server
from bench.http_service import v2_binary_request
from bench.peers import (
    CHAIN,
    CHAIN_SHIFT,
    PeerUnavailable,
    TritonPeer,
    stop_on_signals,
    triton_peer,
)

MiB = 1 << 20
U32 = npt.NDArray[np.uint32]
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
XOR18, SHIFT11, NOT18 = "onnx.BitwiseXor-18", "onnx.BitShift-11", "onnx.BitwiseNot-18"
CONFIG = json.dumps({"backend": "onnxruntime"})
BINDING_CONFIG = json.dumps({"backend": "tensorbits"})
BOUND = "chain_binding"  # the chain as a binding graph
KEYED = "chain_keyed"  # the keyed chain's model: y a constant of the file
KEY = 0x9E3779B9
# Bytes compared at the end of every timed answer (the whole answer is compared in the warm-up).
TAIL = 4096

Call = Callable[[], "memoryview | np.ndarray[Any, Any]"]


# --- the chain --------------------------------------------------------------------------------


def chain_onnx(key: int | None = None) -> bytes:
    """The ONNX file: x, y (UINT32, one symbolic dimension) -> z, the shift count a scalar
    initializer; with ``key``, y is a scalar initializer of that value too (the keyed chain:
    one input). Opset 18, IR version 10 (every ONNX Runtime of the dev group reads it)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("BitwiseXor", ["x", "y"], ["a"], name="xor"),
        helper.make_node("BitShift", ["a", "k"], ["b"], name="shift", direction="RIGHT"),
        helper.make_node("BitwiseNot", ["b"], ["z"], name="not"),
    ]
    constants = [numpy_helper.from_array(np.array(CHAIN_SHIFT, np.uint32), "k")]  # a scalar
    if key is not None:
        constants.append(numpy_helper.from_array(np.array(key, np.uint32), "y"))
    u32 = TensorProto.UINT32
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info(n, u32, ["n"]) for n in ("x", "y")[: 1 if key else 2]],
        [helper.make_tensor_value_info("z", u32, ["n"])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    data: bytes = model.SerializeToString()
    return data


def chain_binding(n: int) -> bytes:
    """The chain as a binding graph (model.json): BIT_XOR, BIT_SHIFT_RIGHT (the count, a
    one-element input, broadcast by a stride of 0) and BIT_NOT, all in place in x's buffer,
    the output z that buffer: the "v1 batch (DML)" row's dispatches, served as a model."""
    nbytes = 4 * n

    def desc(strides: list[int] | None = None) -> dict[str, Any]:
        return {"datatype": "UINT32", "sizes": [n], **({"strides": strides} if strides else {})}

    def on(buffer: str, strides: list[int] | None = None) -> dict[str, Any]:
        return {"buffer": buffer, "desc": desc(strides)}

    dml = "DML_OPERATOR_ELEMENT_WISE_"
    document = {
        "inputs": [
            {"name": "x", "datatype": "UINT32", "shape": [n], "buffer": "x"},
            {"name": "y", "datatype": "UINT32", "shape": [n], "buffer": "y"},
            {"name": "k", "datatype": "UINT32", "shape": [1], "buffer": "k"},
        ],
        "outputs": [{"name": "z", "datatype": "UINT32", "shape": [n], "buffer": "x"}],
        "buffers": [
            {"name": "x", "byte_size": nbytes},
            {"name": "y", "byte_size": nbytes},
            {"name": "k", "byte_size": 4},
        ],
        "dispatches": [
            {
                "operator": f"{dml}BIT_XOR",
                "bindings": {"ATensor": on("x"), "BTensor": on("y"), "OutputTensor": on("x")},
            },
            {
                "operator": f"{dml}BIT_SHIFT_RIGHT",
                "bindings": {"ATensor": on("x"), "BTensor": on("k", [0]), "OutputTensor": on("x")},
            },
            {
                "operator": f"{dml}BIT_NOT",
                "bindings": {"InputTensor": on("x"), "OutputTensor": on("x")},
            },
        ],
    }
    return json.dumps(document).encode()


def numpy_chain(x: U32, y: U32) -> U32:
    """What the Triton peer's chain model runs: one new array, then in place."""
    t = np.bitwise_xor(x, y)
    np.right_shift(t, np.uint32(CHAIN_SHIFT), out=t)
    np.bitwise_not(t, out=t)
    return t


# --- HTTP -------------------------------------------------------------------------------------


def v2_request(
    inputs: Mapping[str, U32 | memoryview], parameters: Mapping[str, str] | None = None
) -> tuple[str, list[bytes | memoryview]]:
    """A v2 binary-extension request of UINT32 inputs (arrays, or an earlier answer's bytes:
    rank 1), its output as binary data: (the header's length, the body's parts)."""
    views = {name: as_bytes(a) for name, a in inputs.items()}
    header: dict[str, Any] = {
        "inputs": [
            {
                "name": name,
                "shape": list(a.shape) if isinstance(a, np.ndarray) else [a.nbytes // 4],
                "datatype": "UINT32",
                "parameters": {"binary_data_size": views[name].nbytes},
            }
            for name, a in inputs.items()
        ],
        "parameters": {"binary_data_output": True},
    }
    if parameters:
        header["parameters"].update(parameters)
    head = json.dumps(header).encode()
    return str(len(head)), [head, *views.values()]


def post(client: PlainClient, path: str, head: str, parts: list[bytes | memoryview]) -> memoryview:
    """POST a framed body; the answer's bytes after its JSON header (one binary output)."""
    headers = {"Inference-Header-Content-Length": head}
    status, got, body = client.request("POST", path, parts, headers)
    if status != 200:
        raise RuntimeError(f"POST {path} answered {status}: {bytes(body[:300])!r}")
    return memoryview(body)[int(got["inference-header-content-length"]) :]


def get_json(client: PlainClient, path: str) -> Any:
    status, _, body = client.request("GET", path, [], {})
    if status != 200:
        raise RuntimeError(f"GET {path} answered {status}: {bytes(body[:300])!r}")
    return json.loads(body)


def load_graph(client: PlainClient, name: str, data: bytes, binding: bool = False) -> None:
    """Triton's load API with the file, over HTTP: the body tritonclient.http's load_model means
    to send (its 2.x releases fail in json.dumps on the file's base64). ``binding``: the file is
    a binding graph (model.json), else an ONNX file."""
    config, file = (BINDING_CONFIG, "model.json") if binding else (CONFIG, "model.onnx")
    body = {"parameters": {"config": config, f"file:1/{file}": base64.b64encode(data).decode()}}
    status, _, answer = client.request(
        "POST",
        f"/v2/repository/models/{name}/load",
        [json.dumps(body).encode()],
        {"Content-Type": "application/json"},
    )
    if status != 200:
        raise RuntimeError(f"loading {name} answered {status}: {bytes(answer[:300])!r}")


PHASES = ("compute_input", "compute_infer", "compute_output", "success")


class PhaseLog:
    """One model's phase durations per request, from its statistics (sums since its load, read
    before and after one request: the difference is that request's; other requests may reach
    the model between those), in seconds by phase; the least of each over the timed requests."""

    def __init__(self, client: PlainClient, model: str) -> None:
        self.client, self.model = client, model
        self.requests: list[dict[str, float]] = []
        self.last = self._read()

    def start(self) -> None:
        self.last = self._read()

    def _read(self) -> dict[str, int]:
        stats = get_json(self.client, f"/v2/models/{self.model}/stats")
        inference = stats["model_stats"][0]["inference_stats"]
        return {"count": int(inference["success"]["count"])} | {
            phase: int(inference[phase]["ns"]) for phase in PHASES
        }

    def stop(self) -> None:
        now = self._read()
        count = now["count"] - self.last["count"]
        if count != 1:
            raise RuntimeError(f"{self.model}: {count} requests counted, 1 expected")
        self.requests.append({p: (now[p] - self.last[p]) / 1e9 for p in PHASES})
        self.last = now

    def least(self) -> dict[str, float]:
        timed = self.requests[1:] or self.requests  # the first is the warm-up
        return {phase: min(r[phase] for r in timed) for phase in PHASES}


def three_requests(client: PlainClient, x: U32, y: U32) -> Call:
    count = np.array(CHAIN_SHIFT, np.uint32)

    def once() -> memoryview:
        a = post(client, f"/v2/models/{XOR18}/infer", *v2_request({"A": x, "B": y}))
        shift = v2_request({"X": a, "Y": count}, {"direction": "RIGHT"})
        b = post(client, f"/v2/models/{SHIFT11}/infer", *shift)
        return post(client, f"/v2/models/{NOT18}/infer", *v2_request({"X": b}))

    return once


def batch_call(client: PlainClient, port: int, x: U32, y: U32, dml: bool) -> Call:
    """One /v1 batch of the chain, built by the SDK (client.batch(), its body from plan()) and
    sent on the plain socket like every other request here; the answer's one output buffer."""
    from tensorbits_client import Client

    with Client(f"http://127.0.0.1:{port}") as sdk:
        batch = sdk.batch()
    n = x.size
    bx, by = batch.input("x", x), batch.input("y", y)
    k = batch.input("k", np.array([CHAIN_SHIFT], np.uint32))
    if dml:  # DML's operators, in place in x's buffer; the count broadcast by stride 0
        tx = bx.tensor()
        batch.bit_xor(tx, by, in_place=True)
        batch.bit_shift_right(tx, k.tensor("UINT32", (n,), strides=(0,)), in_place=True)
        batch.bit_not(tx, in_place=True)
        batch.output(bx)
    else:  # the graph's operators; z written over a, which the shift has read
        a, b = batch.empty("a", (n,), "UINT32"), batch.empty("b", (n,), "UINT32")
        batch.dispatch(XOR18, A=bx.tensor(), B=by.tensor(), C=a.tensor())
        batch.dispatch(SHIFT11, {"direction": "RIGHT"}, X=a.tensor(), Y=k.tensor(), Z=b.tensor())
        batch.dispatch(NOT18, X=b.tensor(), Y=a.tensor())
        batch.output(a)
    body = batch.plan().body
    parts, headers = list(body.parts), body.headers

    def once() -> memoryview:
        status, got, answer = client.request("POST", "/v1/batch", parts, headers)
        if status != 200:
            raise RuntimeError(f"/v1/batch answered {status}: {bytes(answer[:300])!r}")
        start = int(got["inference-header-content-length"])
        (output,) = json.loads(answer[:start])["outputs"]
        return memoryview(answer)[start : start + int(output["byte_size"])]

    return once


# --- the rounds -------------------------------------------------------------------------------


def as_bytes(result: memoryview | np.ndarray[Any, Any]) -> memoryview:
    """The bytes of an answer or of a C-contiguous array."""
    return (result if isinstance(result, memoryview) else result.data).cast("B")


def check(name: str, result: memoryview | np.ndarray[Any, Any], expected: memoryview) -> None:
    got = as_bytes(result)
    if got.nbytes != expected.nbytes or got[-TAIL:] != expected[-TAIL:]:
        raise RuntimeError(f"{name}: wrong answer ({got.nbytes} bytes)")


def check_all(name: str, result: memoryview | np.ndarray[Any, Any], expected: memoryview) -> None:
    got = np.frombuffer(as_bytes(result), np.uint8)
    if not np.array_equal(got, np.frombuffer(expected, np.uint8)):
        raise RuntimeError(f"{name}: the answer's bytes differ from NumPy's")


def measure(
    calls: Mapping[str, tuple[Call, memoryview]],
    repeat: int,
    logs: Mapping[str, PhaseLog],
) -> dict[str, float]:
    """Best time of each call over ``repeat`` interleaved rounds (every call once per round, the
    order rotated every round), after one warm-up call each whose answer is compared with
    NumPy's whole. ``logs[name]``, where given, reads the statistics around that call, outside
    the timing."""

    def observed(name: str, call: Call) -> tuple[float, memoryview | np.ndarray[Any, Any]]:
        log = logs.get(name)
        if log is not None:
            log.start()
        start = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - start
        if log is not None:
            log.stop()
        return seconds, result

    for name, (call, expected) in calls.items():
        check_all(name, observed(name, call)[1], expected)
    best = dict.fromkeys(calls, float("inf"))
    order = list(calls)
    for round_ in range(repeat):
        note(f"  round {round_ + 1}/{repeat}")
        shift = round_ % len(order)
        for name in order[shift:] + order[:shift]:
            call, expected = calls[name]
            seconds, result = observed(name, call)
            best[name] = min(best[name], seconds)
            check(name, result, expected)
            del result
    return best


# --- the run ----------------------------------------------------------------------------------


def machine() -> str:
    model = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({model})"


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min)"


@contextlib.contextmanager
def maybe_triton(wanted: bool) -> Iterator[TritonPeer | None]:
    if not wanted:
        print("Triton peer: not started (--no-triton)")
        yield None
        return
    try:
        with triton_peer() as peer:
            print(f"Triton peer: Triton Inference Server {peer.version} (nvidia-pytriton)")
            yield peer
    except PeerUnavailable as exc:
        print(f"Triton peer unavailable, measured without it: {exc}")
        yield None


def run(args: argparse.Namespace) -> None:
    import onnxruntime as ort  # type: ignore[import-untyped]

    from tensorbits.core.backends.numpy_backend import NumpyBackend
    from tensorbits.core.graphs import plan_graph, read_onnx, run_graph

    n = args.mib * MiB // 4
    rng = np.random.default_rng(0)
    x = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    y = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    expected = numpy_chain(x, y)
    want = as_bytes(expected)
    keyed_want = as_bytes(numpy_chain(x, np.full(1, KEY, np.uint32)))
    big = np.full(args.mib * MiB, 0x5A, np.uint8)
    big[-TAIL:] = np.arange(TAIL, dtype=np.uint64).astype(np.uint8)
    big_not = np.bitwise_not(big)
    data = chain_onnx()

    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    backend = NumpyBackend()
    plan = plan_graph(read_onnx(data), {"x": x.shape, "y": y.shape})
    feeds = {"x": x, "y": y}

    def onnx_runtime() -> np.ndarray[Any, Any]:
        result: np.ndarray[Any, Any] = session.run(None, feeds)[0]
        return result

    def in_process() -> U32:
        out = np.empty(n, np.uint32)
        run_graph(plan, backend, feeds, {"z": out})
        return out

    with contextlib.ExitStack() as stack:
        port = stack.enter_context(tensorbits_server())
        client = PlainClient(port)
        stack.callback(client.close)
        stats = PlainClient(port)
        stack.callback(stats.close)
        load_graph(client, CHAIN, data)
        load_graph(client, KEYED, chain_onnx(KEY))
        load_graph(client, BOUND, chain_binding(n), binding=True)
        peer = stack.enter_context(maybe_triton(not args.no_triton))
        graph_body = v2_request({"x": x, "y": y})
        graph_path = f"/v2/models/{CHAIN}/infer"
        keyed_body, keyed_path = v2_request({"x": x}), f"/v2/models/{KEYED}/infer"
        shift = np.array([CHAIN_SHIFT], np.uint32)
        bound_body = v2_request({"x": x, "y": y, "k": shift})
        bound_path = f"/v2/models/{BOUND}/infer"
        not_head, not_parts = v2_binary_request({"InputTensor": big}, "OutputTensor")
        calls: dict[str, tuple[Call, memoryview]] = {
            "graph HTTP": (lambda: post(client, graph_path, *graph_body), want),
            "keyed graph HTTP": (lambda: post(client, keyed_path, *keyed_body), keyed_want),
            "binding graph HTTP": (lambda: post(client, bound_path, *bound_body), want),
            "3 requests HTTP": (three_requests(client, x, y), want),
            "v1 batch (ONNX)": (batch_call(client, port, x, y, dml=False), want),
            "v1 batch (DML)": (batch_call(client, port, x, y, dml=True), want),
        }
        if peer is not None:
            triton = PlainClient(int(peer.http_url.rsplit(":", 1)[1]))
            stack.callback(triton.close)
            calls["Triton chain HTTP"] = (lambda: post(triton, graph_path, *graph_body), want)
        not_path, not_length = f"/v2/models/{NOT}/infer", str(len(not_head))
        calls["BIT_NOT HTTP"] = (
            lambda: post(client, not_path, not_length, not_parts),
            big_not.data,
        )
        calls["ONNX Runtime"] = (onnx_runtime, want)
        calls["run_graph"] = (in_process, want)
        calls["NumPy 3 calls"] = (lambda: numpy_chain(x, y), want)

        phases = {
            "graph HTTP": PhaseLog(stats, CHAIN),
            "keyed graph HTTP": PhaseLog(stats, KEYED),
            "BIT_NOT HTTP": PhaseLog(stats, NOT),
        }
        note(f"{len(calls)} configurations, {args.repeat} rounds ...")
        best = measure(calls, args.repeat, phases)
    report(args, best, {name: log.least() for name, log in phases.items()}, ort.__version__)


def report(
    args: argparse.Namespace,
    best: dict[str, float],
    phases: dict[str, dict[str, float]],
    ort_version: str,
) -> None:
    moved = 3 * args.mib * MiB  # two inputs in, one output out
    print(
        f"\nz = NOT((x XOR y) >> {CHAIN_SHIFT}), UINT32, {args.mib} MiB per tensor; "
        f"best of {args.repeat} interleaved rounds (ONNX Runtime {ort_version})"
    )
    print(f"{'configuration':<20} {'time':>10} {'/ graph':>8}")
    graph = best["graph HTTP"]
    compute = phases["graph HTTP"]["compute_infer"]
    rows = [*best.items()]
    rows.insert(1, ("graph: server compute", compute))
    for name, seconds in rows:
        print(f"{name:<20} {seconds * 1e3:>7.1f} ms {seconds / graph:>7.2f}x")
    print(
        f"(graph HTTP: {moved // MiB} MiB moved, {moved / graph / 1e9:.2f} GB/s; BIT_NOT HTTP: "
        f"{args.mib} MiB UINT8 in and out; server compute: compute_infer of the graph's request, "
        "from its statistics)"
    )
    print("\nwhere a round trip's time goes (the least per request, from the statistics, in ms):")
    print(
        f"{'request':<16} {'round trip':>10} {'in server':>10} {'outside':>8} "
        + " ".join(f"{phase:>14}" for phase in PHASES[:3])
    )
    for name, least in phases.items():
        whole = best[name]
        print(
            f"{name:<16} {whole * 1e3:>10.1f} {least['success'] * 1e3:>10.1f} "
            f"{(whole - least['success']) * 1e3:>8.1f} "
            + " ".join(f"{least[phase] * 1e3:>14.1f}" for phase in PHASES[:3])
        )
    print(
        "(in server: success.ns, from the request's head to its last byte handed on, the body's"
        " arrival included; outside: the rest of the round trip)"
    )
    print("\nratios:")
    for name, words in (
        ("graph HTTP", "two inputs: twice the bytes in"),
        ("keyed graph HTTP", "one input: the same bytes in and out as BIT_NOT"),
    ):
        ratio = best[name] / best["BIT_NOT HTTP"]
        verdict = "met" if ratio <= 1.3 else "missed"
        print(
            f"  {name} round trip / BIT_NOT round trip ({words}): {ratio:.2f}x "
            f"(target <= 1.3x: {verdict})"
        )
    ratio = compute / best["ONNX Runtime"]
    verdict = "met" if ratio < 1.0 else "missed"
    print(f"  server graph compute / ONNX Runtime compute: {ratio:.2f}x (target < 1.0x: {verdict})")
    print(f"  run_graph in process / ONNX Runtime: {best['run_graph'] / best['ONNX Runtime']:.2f}x")
    others = ("binding graph HTTP", "3 requests HTTP", "v1 batch (ONNX)", "v1 batch (DML)")
    for other in (*others, "Triton chain HTTP"):
        if other in best:
            print(f"  {other} / graph HTTP: {best[other] / graph:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--mib", type=int, default=64, help="MiB per input tensor (default 64)")
    parser.add_argument("--no-triton", action="store_true", help="do not start the Triton peer")
    args = parser.parse_args(argv)
    if not (1 <= args.repeat <= 50 and 1 <= args.mib <= 64):
        parser.error("bounded: --repeat 1..50, --mib 1..64")
    stop_on_signals()  # a Ctrl-C or SIGTERM still stops both servers
    start = time.monotonic()
    print(f"machine: {machine()}, {load()}")
    run(args)
    print(f"\nmachine after: {load()}; {time.monotonic() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
