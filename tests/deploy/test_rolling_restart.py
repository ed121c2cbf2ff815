"""A rolling restart that drops nothing, run for real: three replicas of ``tensorbits serve``
behind a real haproxy (HTTP and gRPC), each replaced in turn (SIGTERM with a drain delay,
haproxy's readiness check taking it out while it still accepts, a new replica in its place)
while clients send inference requests through haproxy on both protocols; three whole rolls in a
row, every request answered, and answered right (``support/rolling.py``).

haproxy does not retry: a request sent to a closed port would be a failure here. With no drain
delay the same roll does fail some requests (the listener closes before haproxy's next check):
``bench/load.py rolling-restart --drain-delay 0`` shows it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.rolling import cluster, haproxy

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(haproxy() is None, reason="haproxy is not installed (.ci/run installs it)"),
    pytest.mark.timeout(240),
]

RUNS = 3
# Far longer than haproxy needs to see the readiness turn (one check: 100 ms): the margin
# between "not ready" and "not accepting" is what the roll depends on.
DRAIN_DELAY_S = 2.0


def test_rolling_restart_fails_no_request(record_property: Callable[[str, object], None]) -> None:
    with cluster(replicas=3, drain_delay_s=DRAIN_DELAY_S) as running:
        for run in range(1, RUNS + 1):
            figures = running.roll()
            summary = figures.summary()
            record_property(f"run{run}", summary)
            print(f"rolling restart, run {run}: {summary}")
            assert figures.http.sent > 0, summary
            assert figures.grpc.sent > 0, summary
            assert figures.failed == 0, summary
