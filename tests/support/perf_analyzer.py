"""One run of scripts/perf_analyzer.sh (Triton's perf_analyzer, set up in a venv of its own): its
exit status, its output and the rows of its CSV report. tests/live/test_perf_analyzer.py
checks the server with it; bench/compare.py times servers with it."""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "perf_analyzer.sh"


@dataclass(frozen=True)
class Report:
    returncode: int
    output: str  # stdout and stderr, as they came
    rows: list[dict[str, str]]  # the CSV report's, by column; none when it wrote none


def run_perf_analyzer(args: Sequence[str], report: Path, timeout_s: float) -> Report:
    """The script with ``args``, its CSV report written to ``report`` (replaced if there)."""
    report.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", str(SCRIPT), *args, "-f", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    rows: list[dict[str, str]] = []
    if report.exists():
        with report.open(newline="") as f:
            rows = list(csv.DictReader(f))
    return Report(done.returncode, done.stdout, rows)
