"""The /v1 batch header cache: a repeated batch header is planned once; each batch still runs on
its own buffers, and a header that differs in any way, or whose body differs in length, or that
failed, takes the full path."""

from __future__ import annotations

from typing import Any

import numpy as np
from support.v1 import batch, bind, data, dispatch, error, outputs, post, v1_client, zeros

from tensorbits.core.header_cache import HeaderCache

U32 = "UINT32"


def _cache(client: Any) -> HeaderCache[Any]:
    cache = client.app.state.runtime.plane.batch_plans
    assert isinstance(cache, HeaderCache)
    return cache


def _hamming(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> tuple[dict[str, Any], bytes]:
    """XOR then BIT_COUNT of two rows of 8 UINT32, in place where it may be."""
    return batch(
        [data("a", a), data("b", b), zeros("c", 8)],
        [
            dispatch(
                "BIT_XOR",
                ATensor=bind("a", U32, [8]),
                BTensor=bind("b", U32, [8]),
                OutputTensor=bind("a", U32, [8]),
            ),
            dispatch(
                "BIT_COUNT",
                {"output_datatype": "UINT8"},
                InputTensor=bind("a", U32, [8]),
                OutputTensor=bind("c", "UINT8", [8]),
            ),
        ],
        ["a", "c"],
        id="pipeline",
    )


def test_a_repeated_batch_header_is_planned_once_and_runs_on_each_bodys_buffers() -> None:
    rng = np.random.default_rng(11)
    with v1_client() as client:
        for _ in range(4):
            a = rng.integers(0, 2**32, 8, dtype=np.uint32)
            b = rng.integers(0, 2**32, 8, dtype=np.uint32)
            header, payload = _hamming(a, b)
            reply, buffers = outputs(post(client, header, payload))
            assert reply["id"] == "pipeline"
            np.testing.assert_array_equal(np.frombuffer(buffers["a"], np.uint32), a ^ b)
            counts = [bin(int(v)).count("1") for v in a ^ b]
            np.testing.assert_array_equal(np.frombuffer(buffers["c"], np.uint8), counts)
            assert len(_cache(client)) == 1


def test_a_body_of_another_length_or_a_failed_header_is_checked_in_full() -> None:
    a = np.arange(8, dtype=np.uint32)
    header, payload = _hamming(a, a)
    with v1_client() as client:
        outputs(post(client, header, payload))
        assert error(post(client, header, payload + b"\x00" * 4))["rule"] == "body_leftover"
        assert error(post(client, header, payload[:-4]))["rule"] == "body_short"
        broken = {**header, "outputs": ["nowhere"]}
        for _ in range(2):
            assert error(post(client, broken, payload))["field"].startswith("outputs")
        assert len(_cache(client)) == 1
