"""Refusals a client that sends its whole body first can read: a soak of clients on
``http.client`` (which writes a request whole before reading its answer, as ``requests`` and
``tritonclient.http`` do) against a live server whose admission fills and whose body limit is
small, in a steady mix (per 100 requests: 60 BIT_NOT of 4 KiB, 20 XOR of 2 x 8 MiB, 19 invalid,
1 of 33 MiB past the 32 MiB body limit; ``TENSORBITS_MAX_INFLIGHT_BYTES`` 128 MiB, so admission
answers 503). Prints one JSON line: the requests by outcome (status, or the exception of a
request that got no answer: a transport error) and the server's RSS at the start, its peak and
at the end, in MiB.

    .venv/bin/python bench/soak_refusals.py [--seconds 40] [--clients 32]

The mix is tests/support/refusal_soak.py, which tests/reliability/test_rel_refusal_soak.py runs
briefly too (and asserts no transport errors)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.live import serve
from support.refusal_soak import SERVER_ENV, run_mix

MiB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args(argv)
    # No gRPC nor metrics listener: this measures HTTP, on whatever ports are free.
    os.environ.setdefault("TENSORBITS_GRPC_PORT", "0")
    os.environ.setdefault("TENSORBITS_METRICS_PORT", "0")
    with serve(dict(SERVER_ENV)) as server:
        start = server.reset_peak_rss()
        figures = run_mix(server, clients=args.clients, seconds=args.seconds)
        rss = {"start": start, "peak": server.peak_rss(), "end": server.rss()}
    line = {
        "seconds": args.seconds,
        "clients": args.clients,
        **figures.summary(),
        "rss_mib": {name: round(value / MiB) for name, value in rss.items()},
    }
    print(json.dumps(line), flush=True)
    return 1 if figures.transport_errors else 0


if __name__ == "__main__":
    sys.exit(main())
