"""Operator-core benchmark (GPU): the CuPy backend against the plain CuPy call and a device copy.

The rows of bench/ops.py (every operator x each data type it allows, BIT_COUNT once per output
type, ONNX BitShift once per direction: 166 per size; ``cases`` imported from there), at sizes
16, 64 and 256 MiB of one input tensor (``--sizes``). Inputs are random bytes on the device
(bench/ops.py's ``Inputs`` made with ``xp=cupy``), shift counts uniform in [0, width). Each row
times, on the same device arrays, interleaved round by round (the order rotates), each keeping
its best (minimum) time:

* ``ours``: ``CupyBackend.run(call, inputs, out)`` into a preallocated device output
  (``select_backend("cupy")``): what the service runs after validation, on device arrays
  (``as_kernel_operands`` views, the device context, the backend's shift and popcount kernels).
* ``cupy``: the one plain CuPy call into the same output, on the views the kernel sees
  (``cupy.bitwise_and(a, b, out=o)``, ``cupy.invert``, ``cupy.bitwise_count``,
  ``cupy.left_shift``, ...: bench/ops.py's ``plain_call`` with ``xp=cupy``). For shifts that is
  C's ``<<``/``>>``, undefined past the width where our rule (docs/semantics.md rule 3) gives 0
  or -1: the row is timed (its counts are in range) and marked ``rule differs``; a CuPy without
  ``bitwise_count`` has no plain popcount (``-`` in the row). Before timing, each row runs both
  once and compares the outputs: ``DIFFERENT RESULT`` in a row is a finding, not noise.
* ``copy``: ``dst[...] = src``, a device-to-device copy of one input-sized byte array (read N,
  write N).

Timing: CUDA events (``cupy.cuda.Event``, ``cupy.cuda.get_elapsed_time``) recorded on the
stream just before and just after a contestant's launch, then ``end.synchronize()``. The events
are stamped by the device, so the figure is the stream's time from the first to the last: it
counts the host's launch work while the stream waits for it (ours' Python before its kernel
starts: the service pays that too) but not the host's wake-up after the synchronize, which
perf_counter around a synchronize adds to every contestant alike (tens of microseconds of OS
scheduling, a large share of a 64 MiB kernel's ~0.1 ms). ``--clock wall`` times with
perf_counter around the launch and a synchronize instead, to compare the two.

GB/s is bytes moved over time, 1 GB = 1e9 bytes: every input plus the output for an operator,
2N for the copy. ``/copy`` is ours GB/s over copy GB/s; ``/cupy`` is the plain call's time over
ours (above 1: we are faster). At 16 MiB a row's working set partly fits in the L2 cache (50 MB
on an H100), so the targets start at 64 MiB.

The targets: at 64 MiB and above, ``/copy`` >= 0.8 for every row, and ours
within 1.1x of the plain call's time (``/cupy`` >= 1/1.1) for every row where both compute the
same (not the shifts; not where the results differed).

Without CuPy or a CUDA device it prints ``skipped: <reason>`` and exits 0. ``--xp numpy`` is a
dry run of the same code path with NumPy standing in for CuPy and the NumPy backend for ours
(perf_counter; default 1 MiB): it proves the script end to end on a machine without a GPU and
claims nothing about speed.

Run: ``python bench/gpu_ops.py [--sizes 16,64,256] [--ops SUBSTR,...] [--dtypes T,...]
[--repeat N] [--retries N] [--clock events|wall] [--quick] [--xp cupy|numpy]``. ``--quick``:
64 MiB, UINT8 and UINT32 rows only (40 rows), 3 rounds. The table is Markdown; on a GPU
machine scripts/gpu_session.sh runs it, and the figures are in docs/gpu.md.
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
import os  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
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
from tensorbits.core.engine import validate_arrays  # noqa: E402
from tensorbits.core.kernels import as_kernel_operands  # noqa: E402
from tensorbits_protocol.dtypes import DTYPES  # noqa: E402
from tensorbits_protocol.operators import Function  # noqa: E402

TARGET_MIB = 64  # the targets apply at this size and above (below, the L2 cache flatters)
TARGET_COPY = 0.8
TARGET_CUPY = 1 / 1.1  # ours' time within 1.1x of the plain call's
# Plain calls whose rule is not ours past the data the benchmark feeds them (docs/semantics.md
# rule 3: CUDA's native shifts are undefined at or past the width).
RULE_DIFFERS = {"left_shift", "right_shift"}
SHIFTS = (Function.SHIFT, Function.SHIFT_LEFT, Function.SHIFT_RIGHT)

Timed = Callable[[Callable[[], object]], float]


class Stand:
    """What differs between a GPU run and the NumPy dry run: the array namespace, our backend,
    the clock, and the lines that say what ran."""

    def __init__(self, xp_name: str, clock: str) -> None:
        self.dry = xp_name == "numpy"
        self.backend: Backend = select_backend("numpy" if self.dry else "cupy").backend
        self.xp: Any = self.backend.xp
        self.name = self.xp.__name__
        wall = self.dry or clock == "wall"
        self.timed: Timed = self._wall if wall else self._events()
        self.clock = "perf_counter around a synchronize" if wall else "CUDA events"

    def _wall(self, fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        fn()
        self.backend.synchronize()
        return time.perf_counter() - start

    def _events(self) -> Timed:
        cuda = self.xp.cuda
        begin, end = cuda.Event(), cuda.Event()

        def timed(fn: Callable[[], object]) -> float:
            begin.record()
            fn()
            end.record()
            end.synchronize()
            return float(cuda.get_elapsed_time(begin, end)) / 1e3  # ms -> s

        return timed

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
        a, b = data.get(case.datatype, case.op.function in SHIFTS)
        arrays = dict(zip(case.op.inputs, (a, b), strict=False))
        call = validate_arrays(case.op.name, arrays, case.parameters)
        inputs = [arrays[name] for name in case.op.inputs]
        out = backend.empty(call.output_shape, np.dtype(DTYPES[call.output_datatype].numpy))
        operands, target = as_kernel_operands(call, inputs, out)
        src = data.pool_a

        def ours() -> None:
            backend.run(call, inputs, out)

        def copy() -> None:
            copy_dst[...] = src

        self.case, self.mib, self.timed = case, mib, stand.timed
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
        self.moved = sum(x.nbytes for x in inputs) + out.nbytes
        self.copied = 2 * src.nbytes
        self.best = [float("inf")] * len(self.fns)
        self.rounds = 0

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_row_options(parser, "16,64,256", "that misses a target (default 2, --quick 1)")
    parser.add_argument(
        "--clock",
        choices=("events", "wall"),
        default="events",
        help="CUDA events (default) or perf_counter around a synchronize",
    )
    parser.add_argument("--quick", action="store_true", help="64 MiB, UINT8/UINT32 only, 3 rounds")
    parser.add_argument(
        "--xp",
        choices=("cupy", "numpy"),
        default="cupy",
        help="numpy: a dry run without a GPU (NumPy for CuPy, default 1 MiB, no timing claims)",
    )
    args = parser.parse_args(argv)
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
    print()
    for line in summary(rows, stand.name):
        print(line)
    print(f"# {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
