"""Operator-core benchmark (GPU): the CuPy backend against the plain CuPy call and a device copy.

bench/ops.py's rows (166 a size) on device arrays: ``ours`` (``CupyBackend.run`` into a
preallocated output), ``cupy`` (bench/ops.py's plain call with ``xp=cupy``; each row first checks
that both write the same bytes: ``DIFFERENT RESULT`` is a finding, not noise; shifts past the
width follow another rule, ``rule differs``) and ``copy`` (a device-to-device copy of one
input-sized array). Timed with CUDA events on the stream: perf_counter around a synchronize
would add the host's wake-up to every contestant (``--clock wall`` to compare). Targets at 64 MiB
and above (below, the L2 cache flatters): ``/copy`` >= 0.8 for every row, and ours within 1.1x of
the plain call's time where both compute the same. Without CuPy or a device it prints
``skipped: <reason>`` and exits 0; ``--xp numpy`` is a dry run on NumPy, with no timing claims.
What a run of every row writes into bench/results/: bench/README.md.

  python bench/gpu_ops.py [--sizes 16,64,256] [--ops SUBSTR,...] [--dtypes T,...] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ is sys.path[0], where a bench module could shadow the standard library:
# import from the repository root instead (bench.ops is imported as a package module).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from bench.ops import (  # noqa: E402
    MIB,
    Case,
    Inputs,
    Measured,
    Timing,
    add_row_options,
    best_times,
    plain_call,
    plain_ufunc_name,
    selected_cases,
    target_lines,
)
from tensorbits.core.backends import Backend, BackendUnavailable, select_backend  # noqa: E402

TARGET_MIB = 64  # the targets apply at this size and above (below, the L2 cache flatters)
TARGET_COPY = 0.8
TARGET_CUPY = 1 / 1.1  # ours' time within 1.1x of the plain call's
# Plain calls whose rule is not ours past the data the benchmark feeds them (docs/semantics.md
# rule 3: CUDA's native shifts are undefined at or past the width).
RULE_DIFFERS = {"left_shift", "right_shift"}
RESULTS = _HERE / "results"
DATA_FILE, CHART_FILE = "gpu_ops.json", "gpu_ops.svg"

Timed = Callable[[Callable[[], object]], float]


def event_timer(cuda: Any) -> Timed:
    """``fn``'s seconds between two CUDA events on the current stream: the device's time, without
    the host's wake-up that perf_counter around a synchronize would add. ``cuda``: ``cupy.cuda``."""
    begin, end = cuda.Event(), cuda.Event()

    def timed(fn: Callable[[], object]) -> float:
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return float(cuda.get_elapsed_time(begin, end)) / 1e3  # ms -> s

    return timed


class Stand:
    """What differs between a GPU run and the NumPy dry run: the array namespace, our backend,
    the clock, and the lines that say what ran."""

    def __init__(self, xp_name: str, clock: str) -> None:
        self.dry = xp_name == "numpy"
        self.backend: Backend = select_backend("numpy" if self.dry else "cupy").backend
        self.xp: Any = self.backend.xp
        self.name = self.xp.__name__
        wall = self.dry or clock == "wall"
        self.timed: Timed = self._wall if wall else event_timer(self.xp.cuda)
        self.clock = "perf_counter around a synchronize" if wall else "CUDA events"

    def _wall(self, fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        fn()
        self.backend.synchronize()
        return time.perf_counter() - start

    def describe(self) -> str:
        common = f"numpy {np.__version__}, python {platform.python_version()}"
        if self.dry:
            return (
                f"# DRY RUN (--xp numpy): NumPy stands in for CuPy, backend {self.backend.device}, "
                f"nproc {os.cpu_count()}, {common}; no timing claims"
            )
        runtime = self.xp.cuda.runtime
        return (
            f"# tensorbits operator core on the GPU: {self.backend.device}, NVIDIA driver "
            f"{nvidia_driver()}, CUDA driver API {runtime.driverGetVersion()}, CUDA runtime "
            f"{runtime.runtimeGetVersion()}, cupy {self.xp.__version__}, {common}"
        )

    def release(self) -> None:
        """Give the device memory pool's free blocks back between sizes."""
        gc.collect()
        if not self.dry:
            self.xp.get_default_memory_pool().free_all_blocks()


def nvidia_driver() -> str:
    """The kernel driver's version (e.g. 580.65.06), as /proc says, or 'unknown'."""
    try:
        line = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "unknown"
    words = line.split()
    return next((w for w in words if w[:1].isdigit() and "." in w), line.strip())


@dataclass
class Row(Measured):
    plain: float | None  # GB/s; None: the namespace has no plain call for it
    call: str  # the plain call's name
    same: bool | None  # ours and the plain call wrote the same bytes (None: no plain call)

    @property
    def vs_plain(self) -> float | None:
        return None if self.plain is None else self.ours / self.plain

    @property
    def comparable(self) -> bool:
        """Ours and the plain call compute the same thing: the /cupy target applies."""
        return self.same is True and self.call not in RULE_DIFFERS

    @property
    def judged(self) -> bool:
        return self.mib >= TARGET_MIB

    def meets(self) -> bool:
        if self.vs_copy < TARGET_COPY:
            return False
        return not self.comparable or (self.vs_plain or 0.0) >= TARGET_CUPY

    def notes(self) -> str:
        words = []
        if self.judged and not self.meets():
            words.append("MISS")
        if self.same is None:
            words.append(f"no {self.call}")
        elif not self.same:
            words.append("DIFFERENT RESULT")
        elif self.call in RULE_DIFFERS:
            words.append("rule differs")
        return " ".join(words)


class Measurement(Timing):
    """One row: ours, the plain call and the copy, on the same device arrays."""

    def __init__(self, stand: Stand, case: Case, data: Inputs, copy_dst: Any, mib: int) -> None:
        xp, backend = stand.xp, stand.backend
        ours, operands, target = self.prepare(case, data, mib, backend)
        src = data.pool_a

        def copy() -> None:
            copy_dst[...] = src

        self.timed = stand.timed
        self.call = plain_ufunc_name(case)
        self.fns: list[Callable[[], object]] = [ours, copy]
        self.same: bool | None = None
        if hasattr(xp, self.call):
            plain = plain_call(case, operands, target, xp)
            self.fns.insert(1, plain)
            # Both once, outputs compared (also the warm-up: kernel compilation, allocation), as
            # the kernel's view: the stored bits for DML, where a float NaN is not equal to itself.
            ours()
            want = target.copy()
            target.fill(0)
            plain()
            self.same = bool(xp.array_equal(target, want))
            del want
        for fn in self.fns:
            fn()
        backend.synchronize()
        self.best = [float("inf")] * len(self.fns)

    def add_rounds(self, rounds: int) -> Row:
        best_times(self.fns, rounds, self.best, self.timed)
        self.rounds += rounds
        t_ours, t_copy = self.best[0], self.best[-1]
        plain = self.moved / self.best[1] / 1e9 if self.same is not None else None
        return self.row(Row, t_ours, t_copy, plain=plain, call=self.call, same=self.same)


def header(name: str) -> str:
    return (
        f"| operator | dtype | MiB | ours GB/s | {name} GB/s | copy GB/s | /copy | /{name} "
        f"| rounds | {name} call | |\n"
        "|---|---|--:|--:|--:|--:|--:|--:|--:|---|---|"
    )


def figure(value: float | None, spec: str) -> str:
    """``value`` formatted, or '-' where the plain call does not exist."""
    return "-" if value is None else format(value, spec)


def format_row(row: Row) -> str:
    return (
        f"| {row.label} | {row.datatype} | {row.mib} | {row.ours:.1f} | "
        f"{figure(row.plain, '.1f')} | {row.copy:.1f} | {row.vs_copy:.2f} | "
        f"{figure(row.vs_plain, '.2f')} | {row.rounds} | {row.call} | "
        f"{row.notes()} |"
    )


def summary(rows: list[Row], name: str) -> list[str]:
    lines = []
    for mib in sorted({r.mib for r in rows}):
        sel = [r for r in rows if r.mib == mib]
        same = [r for r in sel if r.comparable]
        vs_plain = [v for r in same if (v := r.vs_plain) is not None]
        copy_ok = sum(r.vs_copy >= TARGET_COPY for r in sel)
        plain_ok = sum(v >= TARGET_CUPY for v in vs_plain)
        line = (
            f"{mib:>3} MiB: {len(sel)} rows; /copy >= {TARGET_COPY}: {copy_ok}; "
            f"median /copy {float(np.median([r.vs_copy for r in sel])):.2f}, "
            f"min {min(r.vs_copy for r in sel):.2f}; rows computing what {name} computes: "
            f"{len(same)}, ours within 1.1x of {name}: {plain_ok}"
        )
        if vs_plain:
            line += f", median /{name} {float(np.median(vs_plain)):.2f}, min {min(vs_plain):.2f}"
        lines.append(line)
    different = [r for r in rows if r.same is False]
    for r in different:
        lines.append(f"DIFFERENT RESULT: {r.label} {r.datatype} {r.mib} MiB: ours != {r.call}")
    judged = [r for r in rows if r.judged]
    lines += target_lines(
        judged,
        TARGET_MIB,
        "them",
        lambda r: f"/copy {r.vs_copy:.2f}, /{name} {figure(r.vs_plain, '.2f')}",
    )
    return lines


@dataclass
class SizeFigures:
    """One size of a device's run: its rows' ``/copy`` (ours GB/s over the copy's), and where
    known the absolute figures (the entries recorded before this file have ratios only)."""

    mib: int
    rows: int
    median_vs_copy: float
    min_vs_copy: float | None = None
    rows_at_target: int | None = None  # rows with /copy >= TARGET_COPY
    median_gb_per_s: float | None = None  # ours
    median_copy_gb_per_s: float | None = None


@dataclass
class DeviceRun:
    """A device's entry in bench/results/gpu_ops.json: the latest full run on it."""

    device: str
    date: str
    command: str
    environment: str
    source: str  # where the figures come from: this benchmark's output, or the page they were on
    sizes: list[SizeFigures] = field(default_factory=list)

    def record(self) -> dict[str, object]:
        """As written: the fields in declaration order, unknown figures left out."""
        record = asdict(self)
        record["sizes"] = [
            {k: v for k, v in asdict(s).items() if v is not None} for s in self.sizes
        ]
        return record


def device_run(rows: list[Row], stand: Stand, command: str) -> DeviceRun:
    """This run's entry: per size, the median and least /copy, the rows at the target and the
    median GB/s of ours and of the copy."""
    device = str(stand.backend.device).split(" ", 1)[-1]  # "cuda:0 NVIDIA H100 ...": the name
    run = DeviceRun(
        device=device,
        date=datetime.now(UTC).date().isoformat(),
        command=command,
        environment=stand.describe().removeprefix("# tensorbits operator core on the GPU: "),
        source="bench/gpu_ops.py",
    )
    for mib in sorted({r.mib for r in rows}):
        sel = [r for r in rows if r.mib == mib]
        run.sizes.append(
            SizeFigures(
                mib=mib,
                rows=len(sel),
                median_vs_copy=round(float(np.median([r.vs_copy for r in sel])), 2),
                min_vs_copy=round(min(r.vs_copy for r in sel), 2),
                rows_at_target=sum(r.vs_copy >= TARGET_COPY for r in sel),
                median_gb_per_s=round(float(np.median([r.ours for r in sel])), 1),
                median_copy_gb_per_s=round(float(np.median([r.copy for r in sel])), 1),
            )
        )
    return run


def read_runs(data: Path) -> list[DeviceRun]:
    """The entries of a results file (none if it does not exist yet)."""
    if not data.exists():
        return []
    runs = []
    for r in json.loads(data.read_text())["runs"]:
        sizes = [SizeFigures(**s) for s in r.pop("sizes")]
        runs.append(DeviceRun(**r, sizes=sizes))
    return runs


def write_results(run: DeviceRun, folder: Path) -> tuple[Path, Path]:
    """``run`` into ``folder``/gpu_ops.json in place of its device's entry (the others kept,
    sorted by device: the same figures give the same bytes), then the chart beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / DATA_FILE
    runs = [r for r in read_runs(data) if r.device != run.device] + [run]
    document = {
        "benchmark": "bench/gpu_ops.py",
        "vs_copy": "ours GB/s / a device-to-device copy's GB/s of the same bytes, CUDA events",
        "runs": [r.record() for r in sorted(runs, key=lambda r: r.device)],
    }
    data.write_text(json.dumps(document, indent=1) + "\n")
    return data, draw_chart(data)


def draw_chart(data: Path) -> Path:
    """gpu_ops.svg beside ``data``: the median /copy against the size, a line per device."""
    runs = read_runs(data)
    series: dict[str, list[tuple[float, float]]] = {
        f"{r.device} ({r.date})": [(s.mib, s.median_vs_copy) for s in r.sizes] for r in runs
    }
    sizes = sorted({s.mib for r in runs for s in r.sizes})
    series["device-to-device copy"] = [(mib, 1.0) for mib in sizes]
    chart = data.with_name(CHART_FILE)
    counts = {s.rows for r in runs for s in r.sizes}
    rows = f" ({counts.pop()} rows a size)" if len(counts) == 1 else ""
    # matplotlib only where a chart is drawn: the GPU check's wheelhouse runs --quick without it
    from bench.harness.charts import line_chart

    line_chart(
        chart,
        title=f"Operator core on the GPU against a device copy{rows}",
        x_label="MiB of one input tensor",
        y_label="median of ours GB/s / copy GB/s",
        series=series,
        log_x=True,
    )
    return chart


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_row_options(parser, "16,64,256", "that misses a target (default 2, --quick 1)")
    add = parser.add_argument
    add("--clock", choices=("events", "wall"), default="events",
        help="CUDA events (default) or perf_counter around a synchronize")  # fmt: skip
    add("--quick", action="store_true", help="64 MiB, UINT8/UINT32 only, 3 rounds")
    add("--xp", choices=("cupy", "numpy"), default="cupy",
        help="numpy: a dry run without a GPU (NumPy for CuPy, default 1 MiB, no timing claims)")  # fmt: skip
    add("--results", type=Path, default=RESULTS, help="folder of gpu_ops.json and gpu_ops.svg "
        "(default bench/results; written by a run of every row on a device)")  # fmt: skip
    add("--replot", action="store_true",
        help="only redraw gpu_ops.svg from gpu_ops.json (no device needed)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.replot:
        print(f"# wrote {os.path.relpath(draw_chart(args.results / DATA_FILE))}")
        return 0
    default_sizes = "1" if args.xp == "numpy" else ("64" if args.quick else "16,64,256")
    sizes = [int(s) for s in (args.sizes or default_sizes).split(",")]
    repeat = args.repeat or (3 if args.quick else 7)
    retries = args.retries if args.retries is not None else (1 if args.quick else 2)
    selected = selected_cases(parser, args)
    try:
        stand = Stand(args.xp, args.clock)
    except BackendUnavailable as exc:  # no CuPy, no device, no driver: said, not failed
        print(f"skipped: {exc}")
        return 0
    print(stand.describe())
    print(
        f"# sizes {sizes} MiB, {len(selected)} operator/data-type rows per size, {repeat} rounds "
        f"(more below 256 MiB), {stand.clock}"
    )
    print(header(stand.name))
    rows: list[Row] = []
    started = time.perf_counter()
    try:
        for mib in sizes:
            data = Inputs(mib * MIB, xp=stand.xp)
            copy_dst = stand.xp.empty_like(data.pool_a)
            # Small sizes are quick and noisier: more rounds for the same device time.
            rounds = repeat * max(1, min(8, 256 // mib))
            for case in selected:
                m = Measurement(stand, case, data, copy_dst, mib)
                row = m.add_rounds(rounds)
                for _ in range(retries):  # a miss gets more rounds, for every contestant
                    if not row.judged or row.meets():
                        break
                    row = m.add_rounds(rounds)
                rows.append(row)
                print(format_row(row), flush=True)
                del m
            del data, copy_dst
            stand.release()
    finally:
        stand.backend.close()
    print("\n" + "\n".join(summary(rows, stand.name)))
    print(f"# {time.perf_counter() - started:.0f} s")
    if not (stand.dry or args.ops or args.dtypes or args.quick):
        command = " ".join(["bench/gpu_ops.py", *(sys.argv[1:] if argv is None else argv)])
        written = write_results(device_run(rows, stand, command), args.results)
        print(f"# wrote {', '.join(os.path.relpath(p) for p in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
