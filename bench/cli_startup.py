"""Start-up time of the ``tensorbits`` command and of ``import tensorbits_client``.

Each command runs ``--runs`` times, each in a fresh process (nothing cached in memory but the
operating system's file cache, warmed by ``--warmup`` runs first), in turn with the others so
that a busy moment of the machine falls on all of them alike. Printed: the median and the
fastest wall time, and the median over the 0.3 s target where one is set
(docs/benchmarks.md, "CLI and client start-up"). ``python -c pass`` is the floor: the
interpreter alone.

    .venv/bin/python bench/cli_startup.py                 # 20 runs each: about 30 s
    .venv/bin/python bench/cli_startup.py --runs 5

Where the time goes: ``.venv/bin/python -X importtime -c "import tensorbits_client"``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 0.3  # the target for `tensorbits --help` and `import tensorbits_client`


def commands() -> dict[str, tuple[list[str], bool]]:
    """Label -> (argv, whether the 0.3 s target applies)."""
    python = sys.executable
    # The console script next to this interpreter: what a user of the venv runs.
    tensorbits = str(Path(python).with_name("tensorbits"))
    return {
        "python -c pass": ([python, "-c", "pass"], False),
        "tensorbits --help": ([tensorbits, "--help"], True),
        "tensorbits --version": ([tensorbits, "--version"], False),
        "tensorbits serve --help": ([tensorbits, "serve", "--help"], False),
        "tensorbits operators": ([tensorbits, "operators"], False),
        "import tensorbits_client": ([python, "-c", "import tensorbits_client"], True),
        "from tensorbits_client import Client": (
            [python, "-c", "from tensorbits_client import Client"],
            False,
        ),
    }


def run_once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="fresh processes per command")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per command first")
    args = parser.parse_args()

    table = commands()
    for argv, _ in table.values():
        for _ in range(args.warmup):
            run_once(argv)
    times: dict[str, list[float]] = {label: [] for label in table}
    for _ in range(args.runs):
        for label, (argv, _) in table.items():
            times[label].append(run_once(argv))

    print(
        f"# {args.runs} fresh processes per command, interleaved; python {sys.version.split()[0]}"
    )
    print(f"| {'command':<38} | median s | min s | median / {TARGET_S} s target |")
    print(f"|{'-' * 40}|---------:|------:|----------------------:|")
    for label, (_, targeted) in table.items():
        median = statistics.median(times[label])
        ratio = f"{median / TARGET_S:.2f}" if targeted else "-"
        print(f"| {label:<38} | {median:8.3f} | {min(times[label]):5.3f} | {ratio:>21} |")


if __name__ == "__main__":
    main()
