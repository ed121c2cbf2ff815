"""What the live tests check through the SDK against a running server."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorbits_client import Client


def assert_both_apis_answer(client: Client, data: np.ndarray[Any, Any]) -> None:
    """NOT of ``data`` through both APIs, each result checked: a v2 inference, and a /v1 batch of
    one dispatch from an input buffer into an output buffer."""
    np.testing.assert_array_equal(client.dml.bit_not(data), ~data)
    batch = client.batch()
    out = batch.empty("out", data.shape, "UINT8")
    batch.bit_not(batch.input("x", data).tensor(), out=out.tensor())
    batch.output(out)
    np.testing.assert_array_equal(batch.run()["out"], ~data)
