"""A rolling restart behind a real haproxy, its figures printed: N replicas of ``tensorbits
serve`` on loopback ports, each replaced in turn while clients send HTTP and gRPC inference
requests through haproxy; one JSON line per run (requests sent and failed per protocol,
p50/p99 latency during the roll). ``--drain-delay 0`` shows what the delay prevents.

    .venv/bin/python bench/rolling_restart.py [--replicas 3] [--runs 3] [--drain-delay 2]

Needs haproxy (Debian: ``apt-get install haproxy``). The harness is tests/support/rolling.py,
which ``make test`` runs too (tests/deploy/test_rolling_restart.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.rolling import main

if __name__ == "__main__":
    sys.exit(main())
