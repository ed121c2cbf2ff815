"""bench/gpu_ops.py, the CuPy operator benchmark the GPU check runs, as a subprocess: its NumPy
dry run here (every row printed, ours and the plain call agreeing), and where
CuPy is installed, a few real rows on the device (or the one ``skipped:`` line saying why not).
So a typo in the script shows here, not in a GPU session's only device call."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from gpu.devices import unavailable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_ops.py"


def bench_ops() -> ModuleType:
    """bench/ops.py, whose ``cases`` makes the rows gpu_ops.py prints (tests/ is not the
    repository root on sys.path: load it by path)."""
    name = "bench_ops_for_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "ops.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_bench(*args: str, timeout: float = 100) -> tuple[int, str]:
    # timeout: under pytest-timeout's 120 s per test (pyproject.toml), so a hang says which run.
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def table_rows(output: str) -> list[list[str]]:
    """The Markdown table's data rows, cells stripped (header and rule left out)."""
    lines = [line for line in output.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def test_dry_run_prints_every_row_and_agrees_with_numpy() -> None:
    """Every row, not --quick's UINT8/UINT32 only: the float and BOOL rows are where a compare
    of values instead of stored bits (NaN != NaN) would call equal outputs different."""
    code, output = run_bench("--xp", "numpy")
    assert code == 0, output
    assert output.startswith("# DRY RUN (--xp numpy)"), output
    rows = table_rows(output)
    expected = [(c.label, str(c.datatype)) for c in bench_ops().cases(None, None, False)]
    assert len(expected) == 166  # bench/ops.py's rows
    assert sorted((row[0], row[1]) for row in rows) == sorted(expected)
    for row in rows:
        assert row[2] == "1"  # MiB: the dry run's default size
        assert all(float(row[i]) > 0 for i in (3, 4, 5)), row  # ours, numpy, copy GB/s
        assert "DIFFERENT RESULT" not in row[10], row
        assert row[9] in {
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
            "invert",
            "bitwise_count",
            "left_shift",
            "right_shift",
        }
        # Only the shifts' plain calls follow another rule past the width.
        assert ("rule differs" in row[10]) == row[9].endswith("_shift"), row
    assert " 1 MiB: 166 rows;" in output


def test_rows_on_the_device_or_skipped_with_the_reason() -> None:
    """With CuPy and a device: real rows, ours agreeing with CuPy. Without: exit 0 and one
    ``skipped:`` line (what a GPU session without a working device gets), then a skip here, a
    failure in GPU mode (gpu/devices.py)."""
    ops = ["BIT_NOT", "BIT_COUNT", "BitShift"]
    code, output = run_bench(
        "--quick", "--sizes", "16", "--ops", ",".join(ops), "--repeat", "1", timeout=100
    )
    assert code == 0, output
    if output.startswith("skipped: "):
        assert output.count("\n") == 1, output
        unavailable(output.strip())
    rows = table_rows(output)
    expected = [(c.label, str(c.datatype)) for c in bench_ops().cases(ops, None, True)]
    assert len(expected) == 10  # BIT_NOT, BIT_COUNT to UINT8 and UINT32, BitShift both ways
    assert sorted((row[0], row[1]) for row in rows) == sorted(expected), output
    assert all("DIFFERENT RESULT" not in row[10] for row in rows), output
