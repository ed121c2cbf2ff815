"""Operator-core benchmark (CPU): the NumPy backend against a plain NumPy call and np.copyto.

Every operator of the registry x each data type it allows (166 rows a size), at sizes in MiB of
one input tensor, each row timed on the same arrays in interleaved rounds, every contestant
keeping its best: ``ours`` (``NumpyBackend.run`` into a preallocated output: what the service runs
after validation), ``numpy`` (one plain NumPy call into the same output, on the views the kernel
sees), ``copy`` (``np.copyto`` of one input-sized array) and a probe, the copy split over two
threads (``2-core``: below 1.3 the second core was busy, and the row gets more rounds). GB/s is
bytes read plus bytes written over time; ``/copy`` is ours GB/s over the copy's, ``/numpy`` the
plain call's time over ours. Targets at 16 MiB and above: ``/copy`` >= 0.8, ``/numpy`` >= 1.0.

  .venv/bin/python bench/ops.py [--sizes 1,16,64] [--ops SUBSTR,...] [--dtypes T,...] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

# Host arrays validated in one step, as the tests do (tests/support/host_calls.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.host_calls import validate_arrays

# ... and the repository root, for bench.harness (already there when imported as bench.ops).
sys.path.append(str(Path(__file__).resolve().parents[1]))

from tensorbits.core.backends import Backend
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.kernels import as_kernel_operands
from tensorbits_protocol.dtypes import DTYPES, DataType
from tensorbits_protocol.operators import OPERATORS, Function, OperatorSpec
from tensorbits_protocol.validation import resolve_parameters, support_row

MIB = 1 << 20
RESULTS = Path(__file__).resolve().parent / "results"
DATA_FILE, CHART_FILE = "ops_cpu.json", "ops_cpu.svg"
TARGET_MIB = 16  # the targets apply at this size and above
TARGET_COPY = 0.8
TARGET_NUMPY = 1.0
QUICK_DTYPES = (DataType.UINT8, DataType.UINT32)
# A split copy on 2 threads below this speed-up over 1 thread: the second core was busy.
BUSY_CORES = 1.3

Arr = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Case:
    op: OperatorSpec
    datatype: DataType
    parameters: dict[str, object]
    label: str  # operator name plus the parameter that changes the kernel, if any


def cases(ops: list[str] | None, dtypes: list[str] | None, quick: bool) -> Iterator[Case]:
    for op in OPERATORS:
        if ops and not any(s.lower() in op.name.lower() for s in ops):
            continue
        variants: list[tuple[dict[str, object], str]] = [({}, op.name)]
        if op.function is Function.COUNT:
            variants = [({"output_datatype": t}, f"{op.name} ->{t}") for t in ("UINT8", "UINT32")]
        elif op.function is Function.SHIFT:
            variants = [({"direction": d}, f"{op.name} {d}") for d in ("LEFT", "RIGHT")]
        allowed = support_row(op, resolve_parameters(op, variants[0][0])).input_types
        chosen = [t for t in allowed if not dtypes or str(t) in dtypes]
        if quick and not dtypes:
            chosen = [t for t in allowed if t in QUICK_DTYPES] or list(allowed[:1])
        for params, label in variants:
            for datatype in chosen:
                yield Case(op, datatype, params, label)


def add_row_options(parser: argparse.ArgumentParser, sizes: str, retries: str) -> None:
    """The options of every operator benchmark (bench/gpu_ops.py's too): which rows, at which
    sizes, how many rounds; ``sizes`` and ``retries`` complete their help."""
    parser.add_argument("--sizes", default=None, help=f"MiB of one input tensor (default {sizes})")
    parser.add_argument("--ops", default=None, help="comma-separated substrings of operator names")
    parser.add_argument("--dtypes", default=None, help="comma-separated data types (e.g. UINT8)")
    parser.add_argument("--repeat", type=int, default=None, help="timed rounds per row (default 7)")
    parser.add_argument(
        "--retries", type=int, default=None, help=f"extra rounds for a row {retries}"
    )


def selected_cases(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Case]:
    """The rows that ``--ops``, ``--dtypes`` and ``--quick`` pick; none is a usage error."""
    ops = args.ops.split(",") if args.ops else None
    dtypes = [d.strip().upper() for d in args.dtypes.split(",")] if args.dtypes else None
    selected = list(cases(ops, dtypes, args.quick))
    if not selected:
        parser.error("no operator/data type matches --ops/--dtypes")
    return selected


class Inputs:
    """Input arrays per (size, data type), made once and reused by every operator. ``xp`` is the
    array namespace they live in (bench/gpu_ops.py passes CuPy: the views are made on the device)."""

    def __init__(self, nbytes: int, seed: int = 1, xp: Any = np) -> None:
        rng = np.random.default_rng(seed)
        self.nbytes = nbytes
        self.pool_a = xp.asarray(rng.integers(0, 256, nbytes, dtype=np.uint8))
        self.pool_b = xp.asarray(rng.integers(0, 256, nbytes, dtype=np.uint8))
        self.cache: dict[tuple[DataType, bool], tuple[Arr, Arr]] = {}

    def get(self, datatype: DataType, shift: bool) -> tuple[Arr, Arr]:
        key = (datatype, shift)
        if key not in self.cache:
            info = DTYPES[datatype]
            if datatype is DataType.BOOL:
                a = (self.pool_a & 1).view(np.bool_)
                b = (self.pool_b & 1).view(np.bool_)
            else:
                a = self.pool_a.view(info.numpy)
                b = self.pool_b.view(info.numpy)
                if shift:  # counts in [0, width): the usual case, no saturation
                    width = 8 * info.itemsize
                    b = (self.pool_b.view(info.bits) % width).view(info.numpy)
            self.cache[key] = (a, b)
        return self.cache[key]


# The plain call per operator function: the ufunc of this name in the array namespace (NumPy's,
# or CuPy's in bench/gpu_ops.py), called on the kernel's operand views into the same output.
PLAIN_UFUNCS = {
    Function.AND: "bitwise_and",
    Function.OR: "bitwise_or",
    Function.XOR: "bitwise_xor",
    Function.NOT: "invert",
    Function.COUNT: "bitwise_count",
    Function.SHIFT_LEFT: "left_shift",
    Function.SHIFT_RIGHT: "right_shift",
}


def plain_ufunc_name(case: Case) -> str:
    f = case.op.function
    if f is Function.SHIFT:
        left = case.parameters.get("direction") == "LEFT"
        f = Function.SHIFT_LEFT if left else Function.SHIFT_RIGHT
    return PLAIN_UFUNCS[f]


def plain_call(case: Case, operands: list[Arr], out: Arr, xp: Any = np) -> Callable[[], object]:
    """The single call that computes the same result (on the kernel's operand views):
    ``np.bitwise_and(a, b, out=o)``, ``np.invert(x, out=o)``, ``np.bitwise_count(x, out=o)``, ..."""
    ufunc = getattr(xp, plain_ufunc_name(case))
    return lambda: ufunc(*operands, out=out)


def wall_time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_times(
    fns: list[Callable[[], object]],
    rounds: int,
    best: list[float],
    timed: Callable[[Callable[[], object]], float] = wall_time,
) -> None:
    """Lower ``best`` to each function's minimum time over ``rounds`` interleaved rounds (the
    order rotates each round, so a burst of noise lands on all of them alike). ``timed`` runs
    one and says how long it took (bench/gpu_ops.py: CUDA events)."""
    for r in range(rounds):
        for k in range(len(fns)):
            i = (k + r) % len(fns)
            best[i] = min(best[i], timed(fns[i]))


@dataclass
class Measured:
    """A row of an operator benchmark (bench/gpu_ops.py's too): ours and the copy in GB/s; each
    benchmark adds its plain call and its own targets (``meets``)."""

    label: str
    datatype: DataType
    mib: int
    ours: float  # GB/s
    copy: float
    rounds: int

    @property
    def vs_copy(self) -> float:
        return self.ours / self.copy

    def meets(self) -> bool:
        raise NotImplementedError


M = TypeVar("M", bound=Measured)


SHIFTS = (Function.SHIFT, Function.SHIFT_LEFT, Function.SHIFT_RIGHT)


class Timing:
    """What a row's measurement keeps (bench/gpu_ops.py's too): its case and size, the bytes ours
    and the copy move, and the rounds so far; ``row`` makes its row from the best times."""

    case: Case
    mib: int
    moved: int
    copied: int
    rounds: int

    def prepare(
        self, case: Case, data: Inputs, mib: int, backend: Backend
    ) -> tuple[Callable[[], None], list[Arr], Arr]:
        """The case's call validated on ``data``'s arrays, its output preallocated, what ``row``
        reads set; ours (``backend.run`` into that output), and the kernel's operands and output
        (for the plain call)."""
        a, b = data.get(case.datatype, case.op.function in SHIFTS)
        arrays = dict(zip(case.op.inputs, (a, b), strict=False))
        call = validate_arrays(case.op.name, arrays, case.parameters)
        inputs = [arrays[name] for name in case.op.inputs]
        out = backend.empty(call.output_shape, np.dtype(DTYPES[call.output_datatype].numpy))
        self.case, self.mib, self.rounds = case, mib, 0
        self.moved = sum(x.nbytes for x in inputs) + out.nbytes
        self.copied = 2 * data.pool_a.nbytes
        operands, target = as_kernel_operands(call, inputs, out)
        return lambda: backend.run(call, inputs, out), operands, target

    def row(self, row: type[M], t_ours: float, t_copy: float, **added: Any) -> M:
        """A ``row`` from the best times (s) of ours and of the copy, and the fields it adds."""
        return row(
            label=self.case.label,
            datatype=self.case.datatype,
            mib=self.mib,
            ours=self.moved / t_ours / 1e9,
            copy=self.copied / t_copy / 1e9,
            rounds=self.rounds,
            **added,
        )


def target_lines(
    rows: Sequence[M], at_mib: int, what: str, figures: Callable[[M], str]
) -> list[str]:
    """The summary's verdict on the rows held to the targets, which apply from ``at_mib`` up
    (no rows: no lines): how many meet ``what``, then each miss with its ``figures``."""
    if not rows:
        return []
    met = sum(r.meets() for r in rows)
    lines = [f"targets at >= {at_mib} MiB: {met}/{len(rows)} rows meet {what}"]
    for r in rows:
        if not r.meets():
            lines.append(f"  miss: {r.label} {r.datatype} {r.mib} MiB ({figures(r)})")
    return lines


@dataclass
class Row(Measured):
    numpy: float
    cores: float  # np.copyto split over 2 threads, speed-up over 1: did a second core exist?

    @property
    def vs_numpy(self) -> float:
        return self.ours / self.numpy

    @property
    def busy(self) -> bool:
        """The second core looked taken. Only judged at target sizes: at 1 MiB a split copy
        costs more in hand-off than it saves, busy or not."""
        return self.mib >= TARGET_MIB and self.cores < BUSY_CORES

    def meets(self) -> bool:
        return self.vs_copy >= TARGET_COPY and self.vs_numpy >= TARGET_NUMPY


class SplitCopy:
    """np.copyto in two halves on two threads: the probe for a free second core."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="bench-probe")

    def __call__(self, dst: Arr, src: Arr) -> None:
        half = src.shape[0] // 2
        future = self.pool.submit(np.copyto, dst[half:], src[half:])
        np.copyto(dst[:half], src[:half])
        future.result()


class Measurement(Timing):
    """One row: ours, the plain call, the copy and the 2-thread copy probe, on the same arrays."""

    def __init__(
        self,
        backend: NumpyBackend,
        case: Case,
        data: Inputs,
        copy_dst: Arr,
        mib: int,
        probe: SplitCopy,
    ) -> None:
        ours, operands, target = self.prepare(case, data, mib, backend)
        src = data.pool_a
        self.fns: list[Callable[[], object]] = [
            ours,
            plain_call(case, operands, target),
            lambda: np.copyto(copy_dst, src),
            lambda: probe(copy_dst, src),
        ]
        self.best = [float("inf")] * len(self.fns)
        for fn in self.fns:  # warm-up: page faults, thread start-up
            fn()

    def add_rounds(self, rounds: int) -> Row:
        best_times(self.fns, rounds, self.best)
        self.rounds += rounds
        t_ours, t_numpy, t_copy, t_split = self.best
        return self.row(
            Row, t_ours, t_copy, numpy=self.moved / t_numpy / 1e9, cores=t_copy / t_split
        )


HEADER = (
    "| operator | dtype | MiB | ours GB/s | numpy GB/s | copy GB/s | /copy | /numpy "
    "| 2-core | rounds | |\n"
    "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"
)


def format_row(row: Row) -> str:
    mark = "" if row.mib < TARGET_MIB or row.meets() else "MISS"
    if row.busy:
        mark = f"{mark} busy".strip()
    return (
        f"| {row.label} | {row.datatype} | {row.mib} | {row.ours:.1f} | {row.numpy:.1f} | "
        f"{row.copy:.1f} | {row.vs_copy:.2f} | {row.vs_numpy:.2f} | {row.cores:.2f} | "
        f"{row.rounds} | {mark} |"
    )


def summary(rows: list[Row]) -> list[str]:
    lines = []
    for mib in sorted({r.mib for r in rows}):
        sel = [r for r in rows if r.mib == mib]
        copy_ok = sum(r.vs_copy >= TARGET_COPY for r in sel)
        numpy_ok = sum(r.vs_numpy >= TARGET_NUMPY for r in sel)
        both = sum(r.meets() for r in sel)
        near = sum(r.vs_numpy >= 0.95 for r in sel)
        busy = sum(r.busy for r in sel)
        med_c = float(np.median([r.vs_copy for r in sel]))
        med_n = float(np.median([r.vs_numpy for r in sel]))
        lines.append(
            f"{mib:>3} MiB: {len(sel)} rows; /copy >= {TARGET_COPY}: {copy_ok}; "
            f"/numpy >= {TARGET_NUMPY}: {numpy_ok} (>= 0.95: {near}); both: {both}; "
            f"measured while busy: {busy}; "
            f"median /copy {med_c:.2f}, median /numpy {med_n:.2f}, "
            f"min /copy {min(r.vs_copy for r in sel):.2f}, "
            f"min /numpy {min(r.vs_numpy for r in sel):.2f}"
        )
    big = [r for r in rows if r.mib >= TARGET_MIB]
    lines += target_lines(
        big, TARGET_MIB, "both", lambda r: f"/copy {r.vs_copy:.2f}, /numpy {r.vs_numpy:.2f}"
    )
    return lines


def kind(label: str, datatype: DataType) -> str:
    """The kind of operator a row belongs to, as bench/results/ops_cpu_by_kind.md groups them:
    the logic operators alike whatever their type; shifts and population counts by element width,
    where the CPU's vector instructions differ."""
    bits = 8 * DTYPES[datatype].itemsize
    if "->" in label:  # BIT_COUNT, once per output type
        output = label.rsplit("->", 1)[1]
        widths = "8/64-bit" if bits in (8, 64) else "16/32-bit"
        return f"count {widths} ->{output}"
    if "SHIFT" in label.upper():
        return "shift 8-bit" if bits == 8 else "shift 16-64-bit"
    return "AND/OR/XOR/NOT"


def cpu_model() -> str:
    """The CPU's model name and a comma (``AMD EPYC, ``), from /proc/cpuinfo; '' where there is
    none: platform.processor() says only ``x86_64`` on Linux, and figures differ by CPU."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + ", "
    except OSError:
        pass
    return ""


def write_results(
    rows: list[Row], folder: Path, *, machine: str, command: str, seconds: float
) -> tuple[Path, Path]:
    """Every row to ``folder``/ops_cpu.json (one row a line, keys in a fixed order: the same
    figures give the same bytes) and its chart beside it, ops_cpu.svg."""
    folder.mkdir(parents=True, exist_ok=True)
    data, chart = folder / DATA_FILE, folder / CHART_FILE
    head = {
        "benchmark": "bench/ops.py",
        "command": command,
        "date": datetime.now(UTC).date().isoformat(),
        "machine": machine,
        "seconds": round(seconds),
        "gb_per_s": "1e9 bytes a second: ours and numpy, every input plus the output; copy, 2N",
    }
    lines = [json.dumps(row_record(r)) for r in rows]
    body = json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"
    data.write_text(body)
    # From the file's rounded figures, as --replot draws it: the same chart, byte for byte.
    draw_chart(read_rows(data), chart)
    return data, chart


def row_record(row: Row) -> dict[str, object]:
    return {
        "operator": row.label,
        "dtype": str(row.datatype),
        "mib": row.mib,
        "ours_gb_per_s": round(row.ours, 2),
        "numpy_gb_per_s": round(row.numpy, 2),
        "copy_gb_per_s": round(row.copy, 2),
        "two_core_speedup": round(row.cores, 2),
        "rounds": row.rounds,
        "busy": row.busy,
    }


def read_rows(data: Path) -> list[Row]:
    """The rows of a results file ``write_results`` wrote (``--replot``)."""
    return [
        Row(
            label=r["operator"],
            datatype=DataType(r["dtype"]),
            mib=r["mib"],
            ours=r["ours_gb_per_s"],
            copy=r["copy_gb_per_s"],
            rounds=r["rounds"],
            numpy=r["numpy_gb_per_s"],
            cores=r["two_core_speedup"],
        )
        for r in json.loads(data.read_text())["rows"]
    ]


def draw_chart(rows: list[Row], chart: Path) -> None:
    """Median GB/s of ours, the plain call and the copy by kind of operator, at 16 MiB (where the
    targets start) or the largest size run below it; a shared machine's busy rows are counted in
    the title."""
    mib = TARGET_MIB if any(r.mib == TARGET_MIB for r in rows) else max(r.mib for r in rows)
    at_size = [r for r in rows if r.mib == mib]
    kinds: dict[str, list[Row]] = {}
    for r in at_size:
        kinds.setdefault(kind(r.label, r.datatype), []).append(r)
    groups = {
        f"{name} ({len(sel)})": {
            "tensorbits": float(np.median([r.ours for r in sel])),
            "one NumPy call": float(np.median([r.numpy for r in sel])),
            "np.copyto": float(np.median([r.copy for r in sel])),
        }
        for name, sel in sorted(kinds.items())
    }
    title = f"Operator core on the CPU, {mib} MiB: median GB/s by kind (rows)"
    busy = sum(r.busy for r in at_size)
    if busy:
        title += f"\n{busy} of {len(at_size)} rows measured while another process held a core"
    # matplotlib only where a chart is drawn: the GPU check's wheelhouse runs --quick without it
    from bench.harness.charts import bar_chart

    bar_chart(chart, title=title, y_label="GB/s (bytes in and out / time)", groups=groups)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_row_options(parser, "1,16,64", "measured while busy (default 3, --quick 1)")
    add = parser.add_argument
    add("--threads", type=int, default=None, help="backend threads (default: all)")
    add("--quick", action="store_true", help="16 MiB, UINT8/UINT32 only, 3 rounds (< 30 s)")
    add("--results", type=Path, default=RESULTS, help="folder for ops_cpu.json and ops_cpu.svg "
        "(default bench/results; not written when --ops or --dtypes pick a subset)")  # fmt: skip
    add("--replot", action="store_true", help="only redraw ops_cpu.svg from ops_cpu.json")
    args = parser.parse_args(argv)
    if args.replot:
        draw_chart(read_rows(args.results / DATA_FILE), args.results / CHART_FILE)
        print(f"# wrote {os.path.relpath(args.results / CHART_FILE)}")
        return 0
    sizes = [int(s) for s in (args.sizes or ("16" if args.quick else "1,16,64")).split(",")]
    repeat = args.repeat or (3 if args.quick else 7)
    retries = args.retries if args.retries is not None else (1 if args.quick else 3)
    selected = selected_cases(parser, args)

    backend = NumpyBackend(args.threads)
    probe = SplitCopy()
    machine = (
        f"{cpu_model()}{platform.processor() or platform.machine()}, "
        f"nproc {os.cpu_count()}, backend {backend.device}, numpy {np.__version__}, "
        f"python {platform.python_version()}"
    )
    print(f"# tensorbits operator core: {machine}")
    print(f"# sizes {sizes} MiB, {len(selected)} operator/data-type rows per size, {repeat} rounds")
    print(HEADER)
    rows: list[Row] = []
    started = time.perf_counter()
    gc.disable()
    try:
        for mib in sizes:
            data = Inputs(mib * MIB)
            copy_dst = np.empty_like(data.pool_a)
            # Small sizes are quick and noisier: more rounds for the same wall time.
            rounds = repeat * max(1, min(8, 16 // mib))
            for case in selected:
                m = Measurement(backend, case, data, copy_dst, mib, probe)
                row = m.add_rounds(rounds)
                # Noise from other processes on the machine mostly costs the threaded runs: when
                # the second core looked busy, or ours came out slower than the plain call, give
                # every contestant more rounds (each keeps its best over all of them).
                for _ in range(retries):
                    if not row.busy and row.vs_numpy >= TARGET_NUMPY:
                        break
                    time.sleep(0.2)
                    row = m.add_rounds(rounds)
                rows.append(row)
                print(format_row(row), flush=True)
            del data, copy_dst
            gc.collect()
    finally:
        gc.enable()
        backend.close()
        probe.pool.shutdown()
    print("\n" + "\n".join(summary(rows)))
    seconds = time.perf_counter() - started
    print(f"# {seconds:.0f} s")
    if args.ops or args.dtypes:
        print("# results not written: --ops/--dtypes ran a subset of the rows")
    else:
        command = " ".join(["bench/ops.py", *(sys.argv[1:] if argv is None else argv)])
        written = write_results(
            rows, args.results, machine=machine, command=command, seconds=seconds
        )
        print(f"# wrote {', '.join(os.path.relpath(p) for p in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
