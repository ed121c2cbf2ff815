"""The admission bound: requests and bytes in flight; past either, Overloaded (503) at once."""

from __future__ import annotations

import asyncio

import pytest

from tensorbits.runtime import Admission
from tensorbits_protocol.errors import Overloaded


def test_bytes_bound_refuses_and_releases() -> None:
    async def scenario() -> None:
        admission = Admission(max_bytes=100, max_requests=10)
        async with admission.admit(60):
            assert admission.bytes_in_flight == 60
            with pytest.raises(Overloaded, match="needs 50 more"):
                async with admission.admit(50):
                    pass
            async with admission.admit(40):
                assert admission.bytes_in_flight == 100
        assert (admission.bytes_in_flight, admission.requests_in_flight) == (0, 0)

    asyncio.run(scenario())


def test_request_bound_refuses() -> None:
    async def scenario() -> None:
        admission = Admission(max_bytes=1 << 20, max_requests=2)
        async with admission.admit(1), admission.admit(1):
            with pytest.raises(Overloaded, match="2 requests in flight") as info:
                async with admission.admit(1):
                    pass
            assert info.value.status_code == 503
            assert info.value.retry_after >= 1
        async with admission.admit(1):
            assert admission.requests_in_flight == 1

    asyncio.run(scenario())


def test_release_happens_when_the_work_fails() -> None:
    async def scenario() -> None:
        admission = Admission(max_bytes=10, max_requests=1)
        with pytest.raises(RuntimeError):
            async with admission.admit(10):
                raise RuntimeError("kernel failed")
        assert (admission.bytes_in_flight, admission.requests_in_flight) == (0, 0)

    asyncio.run(scenario())
