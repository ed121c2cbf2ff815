"""This working tree against an earlier git revision of tensorbits, in one run on one machine.

Checks ``--base`` out into a git worktree in a temporary folder (removed at the end, on Ctrl-C
too) and starts ``tensorbits serve`` twice (NumPy backend, HTTP and gRPC on free 127.0.0.1
ports), both with this checkout's ``.venv`` (its dependencies, its ``tensorbits`` command):

  base  the revision's source: its service/src, protocol/src and client/src first on PYTHONPATH
        (the ``.venv`` holds editable installs of the working tree; PYTHONPATH comes first);
  head  the working tree's source, committed or not.

Before anything is measured, each server's interpreter is asked where ``tensorbits``,
``tensorbits_protocol`` and ``tensorbits_client`` come from; the run stops if they do not come
from that server's own tree. Then bench/grpc_vs_triton.py's measurements, over the two servers:

  (small) requests/s of a 16-element UINT8 BIT_NOT: HTTP v2 binary under wrk (one thread,
          ``--connections``), gRPC as one pre-serialized ModelInfer (``--streams`` calls in flight
          on ``--channels`` connections) driven by h2load (C, when installed) and by grpc.aio
          (Python), both checked against the server's own ModelStatistics counts. ``--rounds``
          rounds of ``--seconds``, every contestant once a round, the order rotated every round.
          Per figure (req/s, p50, p99, the server's CPU time per request, read from /proc):
          the median over the rounds for each server, and head/base as the median of the
          per-round ratios (base and head of one round ran minutes apart at most).
  (large) a 64 MiB BIT_NOT round trip (64 MiB in, 64 MiB out), HTTP through a plain-socket
          client and gRPC as one pre-serialized message, ``--repeat`` rounds (each on new
          connections: one warm-up call, then one timed call of each contestant, the servers'
          order alternating): the best time and the least server CPU time of each, and
          head/base as the ratio of the bests.

How to read it: a ratio above 1.00x means head gives more of that figure (better for req/s, worse
for latency, CPU and time). The ``base noise`` column is the spread of the base's own rounds
(max/min of that figure over them): how much the same code moved between rounds of this run,
drift of the machine included. A ratio inside [1/noise, noise] is no evidence of a change; one
outside is marked ``beyond``. The ``rounds`` column is the lowest and highest head/base within
one round (base and head of a round ran seconds apart, so drift moves both): when every round
falls on the same side of 1.00x (chance 1 in 128 for 8 rounds of two equal servers), the
difference is consistent even where it stays inside the base's noise. On a machine shared with
other work, read server CPU per request first: it is the figure that the other work moves least.

Loopback only, bounded: about 4 minutes with the defaults (h2load installed). Usage:

  .venv/bin/python bench/revisions.py --base REV [--rounds N] [--seconds S] [--repeat N] [--parts small,large]
  .venv/bin/python bench/revisions.py --base HEAD --parts large        # uncommitted edits alone
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.grpc_vs_triton import (
    AIO,
    H2LOAD,
    HTTP,
    LARGE_MIB,
    Endpoints,
    Rate,
    conditions,
    large_round_trips,
    parse_options,
    small_rounds,
    tensorbits,
)
from bench.harness import BIN, note
from bench.peers import stop_on_signals

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("service/src", "protocol/src", "client/src")
PACKAGES = ("tensorbits", "tensorbits_protocol", "tensorbits_client")
BASE, HEAD = "base", "head"


# --- the two trees ----------------------------------------------------------------------------


def git(*args: str) -> str:
    """A read-only git command in this checkout (worktree add/remove aside)."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def commit_of(rev: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"--base {rev}: not a commit of this repository")
    return done.stdout.strip()


@contextlib.contextmanager
def base_worktree(commit: str) -> Iterator[Path]:
    """``commit`` checked out (detached) into a temporary folder; the worktree is removed after,
    whatever happens in between."""
    folder = Path(tempfile.mkdtemp(prefix="tensorbits-base-"))
    tree = folder / "tree"
    try:
        git("worktree", "add", "--detach", "--quiet", str(tree), commit)
        yield tree
    finally:
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C does not leave it behind
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                capture_output=True, check=False,
            )  # fmt: skip
            shutil.rmtree(folder, ignore_errors=True)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)


def pythonpath(tree: Path) -> str:
    return ":".join(str(tree / source) for source in SOURCES)


def check_sources(label: str, tree: Path) -> None:
    """The server's interpreter, with the server's PYTHONPATH, imports our packages from ``tree``:
    or the run would compare a tree with itself."""
    code = "import json, " + ", ".join(PACKAGES) + "; print(json.dumps([" + ", ".join(
        f"{p}.__file__" for p in PACKAGES
    ) + "]))"  # fmt: skip
    done = subprocess.run(
        [str(BIN / "python"), "-c", code],
        env={**os.environ, "PYTHONPATH": pythonpath(tree)},
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{label}: its packages do not import:\n{done.stderr[-2000:]}")
    tree = tree.resolve()
    files = [Path(f).resolve() for f in json.loads(done.stdout)]
    stray = [str(f) for f in files if not f.is_relative_to(tree)]
    if stray:
        raise SystemExit(
            f"{label}: refusing to run: with PYTHONPATH={pythonpath(tree)} its server would "
            f"import {', '.join(stray)}, not the {label} tree's code ({tree}): has that tree no "
            f"{', '.join(SOURCES)}, or does this .venv place an import hook before PYTHONPATH?"
        )
    note(
        f"{label} imports from {tree}: " + ", ".join(str(f.parent.relative_to(tree)) for f in files)
    )


def describe(rev: str) -> tuple[str, str]:
    """One line for each side: the base's commit, and HEAD plus the working tree's changes."""
    base = git("log", "-1", "--format=%h %s", rev)
    changed = len(git("status", "--porcelain", "--", *SOURCES).splitlines())
    head = git("log", "-1", "--format=%h", "HEAD")
    if len(base) > 80:
        base = base[:77] + "..."
    return base, f"{head} + the working tree ({changed} files changed under {', '.join(SOURCES)})"


@contextlib.contextmanager
def servers(base_tree: Path) -> Iterator[list[Endpoints]]:
    with contextlib.ExitStack() as stack:
        started = []
        for label, tree in ((BASE, base_tree), (HEAD, ROOT)):
            check_sources(label, tree)
            started.append(stack.enter_context(tensorbits(label, PYTHONPATH=pythonpath(tree))))
        yield started


# --- the figures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One figure of one client: the base's and the head's value in each round."""

    part: str
    client: str
    figure: str
    base: list[float]
    head: list[float]
    ratio: float  # head/base: the median of the per-round ratios (small), of the bests (large)

    @property
    def rounds(self) -> list[float]:
        """head/base within each round."""
        return [h / b for b, h in zip(self.base, self.head, strict=True)]

    @property
    def noise(self) -> float:
        """max/min of the base's own rounds."""
        return spread(self.base)


@contextlib.contextmanager
def table() -> Iterator[list[Row]]:
    """The rows, printed at the end of the ``with`` (not when it ends with an error)."""
    rows: list[Row] = []
    yield rows
    print(
        f"\n{'part':<6} {'client':<12} {'figure':<18} {'base':>8} {'head':>8} {'head/base':>9} "
        f"{'base noise':>10} {'rounds':>13}"
    )
    for row in rows:
        pick = min if row.part == "large" else statistics.median
        beyond = "  beyond" if row.ratio > row.noise or row.ratio < 1 / row.noise else ""
        rounds = f"{min(row.rounds):.2f}-{max(row.rounds):.2f}x"
        print(
            f"{row.part:<6} {row.client:<12} {row.figure:<18} {number(pick(row.base)):>8} "
            f"{number(pick(row.head)):>8} {row.ratio:>8.3f}x {row.noise:>9.3f}x {rounds:>13}"
            + beyond
        )
    print(
        "(base/head: medians over the rounds (small), bests (large); base noise: max/min of the"
        " base's own rounds;\n rounds: the lowest and highest head/base within one round;"
        " beyond: head/base outside [1/noise, noise])"
    )


def number(value: float) -> str:
    return (
        f"{value:,.0f}" if value >= 99.95 else f"{value:.1f}" if value >= 9.995 else f"{value:.2f}"
    )


def spread(values: list[float]) -> float:
    """max/min: how far apart the rounds of one server came."""
    return max(values) / min(values) if min(values) > 0 else float("inf")


SMALL_FIGURES = (
    ("rps", "req/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("server_us", "server CPU us/req"),
)


def small(endpoints: list[Endpoints], args: argparse.Namespace, rows: list[Row]) -> None:
    rates = small_rounds(endpoints, args)
    print(
        f"(small) 16-element UINT8 BIT_NOT, {args.rounds} rotated rounds of {args.seconds:g} s; "
        f"{HTTP}: wrk -t1 -c{args.connections}; gRPC: {args.streams} calls in flight on "
        f"{args.channels} connections; medians over the rounds, head/base the median of the "
        "per-round ratios"
    )
    for client in (HTTP, H2LOAD, AIO):
        if (BASE, client) not in rates:
            continue
        base, head = rates[(BASE, client)], rates[(HEAD, client)]
        for field, figure in SMALL_FIGURES:
            b, h = values(base, field), values(head, field)
            ratio = statistics.median(y / x for x, y in zip(b, h, strict=True))
            rows.append(Row("small", client, figure, b, h, ratio))
        print(
            f"  {client} req/s each round: base "
            + " ".join(f"{r.rps:,.0f}" for r in base)
            + "; head "
            + " ".join(f"{r.rps:,.0f}" for r in head)
        )


def values(runs: list[Rate], field: str) -> list[float]:
    return [float(getattr(r, field)) for r in runs]


def large(endpoints: list[Endpoints], repeat: int, rows: list[Row]) -> None:
    times: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    for round_ in range(repeat):
        note(f"  (large) round {round_ + 1}/{repeat}")
        order = endpoints if round_ % 2 == 0 else endpoints[::-1]
        for name, (seconds, cpu) in large_round_trips(order, 1).items():
            times.setdefault(name, []).append(seconds * 1e3)
            cpus.setdefault(name, []).append(cpu * 1e3)
    print(
        f"(large) {LARGE_MIB} MiB BIT_NOT round trip, {repeat} rounds (servers' order alternating):"
        " best time and least server CPU, head/base the ratio of the bests"
    )
    for protocol in ("HTTP", "gRPC"):
        for figure, got in (("time ms", times), ("server CPU ms", cpus)):
            b, h = got[f"{BASE} {protocol}"], got[f"{HEAD} {protocol}"]
            rows.append(Row("large", protocol, figure, b, h, min(h) / min(b)))
        print(
            f"  {protocol} ms each round: base "
            + " ".join(f"{t:.1f}" for t in times[f"{BASE} {protocol}"])
            + "; head "
            + " ".join(f"{t:.1f}" for t in times[f"{HEAD} {protocol}"])
        )


# --- the run ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the earlier revision (a commit, tag, ...)")
    # Two rounds at least: the base's noise is the spread of its own rounds.
    args, parts = parse_options(parser, argv, rounds=8, repeat=7, least=2)
    stop_on_signals()  # a Ctrl-C or SIGTERM still stops both servers and removes the worktree
    start = time.monotonic()
    commit = commit_of(args.base)
    base_line, head_line = describe(commit)
    print(f"base: {base_line}\nhead: {head_line}\nmachine: {conditions()}")
    with (
        base_worktree(commit) as tree,
        servers(tree) as endpoints,
        table() as rows,
    ):
        if "small" in parts:
            note("(small) ...")
            small(endpoints, args, rows)
        if "large" in parts:
            note("(large) ...")
            large(endpoints, args.repeat, rows)
    print(f"\nmachine after: {conditions()}; {time.monotonic() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        note(f"interrupted ({exc}): both servers stopped, the worktree removed")
        sys.exit(130)
