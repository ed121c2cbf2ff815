"""The admission bound: requests and bytes in flight; past either, Overloaded (503) at once."""

from __future__ import annotations

import pytest

from tensorbits.core.admission import Admission
from tensorbits_protocol.errors import Overloaded


def test_bytes_bound_refuses_and_releases() -> None:
    admission = Admission(max_bytes=100, max_requests=10)
    first = admission.acquire(60)
    assert admission.bytes_in_flight == 60
    with pytest.raises(Overloaded, match="needs 50 more"):
        admission.acquire(50)
    second = admission.acquire(40)
    assert admission.bytes_in_flight == 100
    second.release()
    first.release()
    assert (admission.bytes_in_flight, admission.requests_in_flight) == (0, 0)


def test_request_bound_refuses() -> None:
    admission = Admission(max_bytes=1 << 20, max_requests=2)
    grants = [admission.acquire(1), admission.acquire(1)]
    with pytest.raises(Overloaded, match="2 requests in flight") as info:
        admission.acquire(1)
    assert info.value.status_code == 503
    assert info.value.retry_after >= 1
    for grant in grants:
        grant.release()
    grant = admission.acquire(1)
    assert admission.requests_in_flight == 1
    grant.release()


def test_a_grant_grows_and_is_released_once() -> None:
    admission = Admission(max_bytes=10, max_requests=1)
    grant = admission.acquire(4)
    grant.grow(6)
    assert admission.bytes_in_flight == 10
    with pytest.raises(Overloaded):
        grant.grow(1)
    grant.release()
    grant.release()  # a second release (an error path after the first) gives back nothing more
    assert (admission.bytes_in_flight, admission.requests_in_flight) == (0, 0)
