"""The SDK against a real ``tensorbits serve`` (NumPy backend) on a loopback port."""

from __future__ import annotations

import asyncio
import os
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tensorbits_client import (
    AsyncClient,
    BadRequestError,
    Client,
    LocalValidationError,
    NotFoundError,
)
from tensorbits_protocol.errors import OperatorNotFound
from tensorbits_protocol.operators import OPERATORS, get_operator

Arr = np.ndarray[Any, Any]
rng = np.random.default_rng(7)


def ints(dtype: Any, shape: tuple[int, ...] = (3, 5)) -> Arr:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def shift_ref(a: Arr, b: Arr, left: bool) -> Arr:
    """The service's shift rule: counts at or above the width give 0 (unsigned operands)."""
    width = a.dtype.itemsize * 8
    big = b >= width
    safe = np.where(big, 0, b).astype(a.dtype)
    out = np.left_shift(a, safe) if left else np.right_shift(a, safe)
    return np.where(big, 0, out).astype(a.dtype)


def bits(a: Arr) -> Arr:
    return a.view(f"u{a.dtype.itemsize}")


u8, u32, i64, f16 = (
    ints(np.uint8),
    ints(np.uint32),
    ints(np.int64),
    ints(np.uint16).view(np.float16),
)
counts8 = rng.integers(0, 12, size=(3, 5), dtype=np.uint8)
counts64 = rng.integers(0, 70, size=(3, 5), dtype=np.uint64)
u64 = ints(np.uint64)
flags_a, flags_b = rng.random((4, 3)) > 0.5, rng.random((4, 3)) > 0.5
i16, row = ints(np.int16), ints(np.int16, (1, 5))

# (call on a client, expected result)
CASES: dict[str, tuple[Callable[[Any], Any], Arr]] = {
    "dml.bit_and u32": (lambda c: c.dml.bit_and(u32, u32[::-1]), u32 & u32[::-1]),
    "dml.bit_or i64": (lambda c: c.dml.bit_or(i64, i64[::-1]), i64 | i64[::-1]),
    "dml.bit_xor f16 bits": (
        lambda c: c.dml.bit_xor(f16, f16[::-1]),
        (bits(f16) ^ bits(f16[::-1])).view(np.float16),
    ),
    "dml.bit_not f16 bits": (lambda c: c.dml.bit_not(f16), (~bits(f16)).view(np.float16)),
    "dml.bit_not u8 fl3_0": (lambda c: c.dml.bit_not(u8, feature_level="3_0"), ~u8),
    "dml.bit_count int8": (
        lambda c: c.dml.bit_count(np.array([-1, 0, 3, -128], dtype=np.int8)),
        np.array([8, 0, 2, 1], dtype=np.uint8),
    ),
    "dml.bit_count u64 to u32": (
        lambda c: c.dml.bit_count(u64, output_datatype="UINT32"),
        np.bitwise_count(u64).astype(np.uint32),
    ),
    "dml.bit_shift_left u8": (
        lambda c: c.dml.bit_shift_left(u8, counts8),
        shift_ref(u8, counts8, left=True),
    ),
    "dml.bit_shift_right u64": (
        lambda c: c.dml.bit_shift_right(u64, counts64),
        shift_ref(u64, counts64, left=False),
    ),
    "openvino.bitwise_and bool": (
        lambda c: c.openvino.bitwise_and(flags_a, flags_b),
        flags_a & flags_b,
    ),
    "openvino.bitwise_or broadcast": (lambda c: c.openvino.bitwise_or(i16, row), i16 | row),
    "openvino.bitwise_xor bool": (
        lambda c: c.openvino.bitwise_xor(flags_a, flags_b),
        flags_a ^ flags_b,
    ),
    "openvino.bitwise_not bool": (lambda c: c.openvino.bitwise_not(flags_a), ~flags_a),
    "openvino.left_shift pdpd": (
        lambda c: c.openvino.left_shift(
            np.full((2, 3, 4), 3, np.int32),
            np.arange(3, dtype=np.int32),
            auto_broadcast="pdpd",
            axis=1,
        ),
        np.full((2, 3, 4), 3, np.int32) << np.arange(3, dtype=np.int32)[None, :, None],
    ),
    "openvino.left_shift numpy-scalar axis": (
        lambda c: c.openvino.left_shift(
            np.ones((2, 3), np.uint8),
            np.arange(2, dtype=np.uint8),
            auto_broadcast="pdpd",
            axis=np.int64(0),
        ),
        np.ones((2, 3), np.uint8) << np.arange(2, dtype=np.uint8)[:, None],
    ),
    "openvino.right_shift signed": (
        lambda c: c.openvino.right_shift(np.array([-16, 16], np.int8), np.array([2], np.int8)),
        np.array([-4, 4], np.int8),
    ),
    "onnx.bitwise_and": (lambda c: c.onnx.bitwise_and(i64, i64[:1]), i64 & i64[:1]),
    "onnx.bitwise_or": (lambda c: c.onnx.bitwise_or(u8, u8), u8),
    "onnx.bitwise_xor 0-d": (
        lambda c: c.onnx.bitwise_xor(np.array(5, np.uint16), np.array(3, np.uint16)),
        np.array(6, np.uint16),
    ),
    "onnx.bitwise_not empty": (
        lambda c: c.onnx.bitwise_not(np.zeros((0, 4), np.int32)),
        np.zeros((0, 4), np.int32),
    ),
    "onnx.bit_shift LEFT": (
        lambda c: c.onnx.bit_shift(u32, np.array([1], np.uint32), direction="LEFT"),
        u32 << np.uint32(1),
    ),
    "onnx.bit_shift RIGHT": (
        lambda c: c.onnx.bit_shift(u32, np.array([31], np.uint32), direction="RIGHT"),
        u32 >> np.uint32(31),
    ),
    "infer json": (
        lambda c: c.infer("onnx.BitwiseXor-18", [i64, i64[::-1]], binary=False).output,
        i64 ^ i64[::-1],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_family_method_against_numpy(live: Client, name: str) -> None:
    call, expected = CASES[name]
    got = call(live)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()  # bit-exact, NaN payloads included


def test_async_client_gives_the_same_results(server_url: str) -> None:
    names = [n for n in CASES if not n.startswith("infer")]

    async def main() -> list[Arr]:
        async with AsyncClient(server_url) as client:
            results = list(await asyncio.gather(*(CASES[n][0](client) for n in names)))
            json = await client.infer("onnx.BitwiseXor-18", [i64, i64[::-1]], binary=False)
            return [*results, json.output]

    *results, json = asyncio.run(main())
    for name, got in zip(names, results, strict=True):
        assert got.tobytes() == CASES[name][1].tobytes(), name
    np.testing.assert_array_equal(json, i64 ^ i64[::-1])


def test_large_binary_round_trip_is_exact(live: Client) -> None:
    a = ints(np.uint64, (1 << 20,))
    b = ints(np.uint64, (1 << 20,))
    out = live.dml.bit_xor(a, b)
    np.testing.assert_array_equal(out, a ^ b)
    assert out.ctypes.data % 8 == 0


# --- errors: local and remote say the same thing -------------------------------------------------
INVALID: dict[str, tuple[str, Any, dict[str, Any]]] = {
    "datatype at feature level": (
        "DML_OPERATOR_ELEMENT_WISE_BIT_AND",
        {"ATensor": i64, "BTensor": i64},
        {"feature_level": "3_0"},
    ),
    "not at feature level": ("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", [u8], {"feature_level": "2_1"}),
    "rank": ("onnx.BitwiseNot-18", [np.zeros((1,) * 9, np.int8)], {}),
    "mixed datatypes": ("onnx.BitwiseAnd-18", {"A": u8, "B": u32}, {}),
    "identical sizes": ("DML_OPERATOR_ELEMENT_WISE_BIT_OR", [u8, u8[:1]], {}),
    "broadcast": ("onnx.BitwiseOr-18", [u8, u8[:, :2]], {}),
    "required direction": ("onnx.BitShift-11", {"X": u8, "Y": u8}, {}),
    "parameter value": ("onnx.BitShift-11", [u8, u8], {"direction": "UP"}),
    "unknown parameter": ("onnx.BitwiseNot-18", [u8], {"feature_level": "6_4"}),
    "misspelt protocol parameter": ("onnx.BitwiseNot-18", [u8], {"sequence_ids": 1}),
    "missing input": ("onnx.BitwiseAnd-18", [u8], {}),
    # Two arrays in order are refused before naming (tests/api/test_error_suggestions.py).
    "extra input": ("onnx.BitwiseNot-18", {"X": u8, "Y": u8}, {}),
    "unknown input name": ("onnx.BitwiseNot-18", {"Q": u8}, {}),
    "signed shift in DML": ("DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT", [i64, i64], {}),
    "empty DML tensor": ("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", [np.zeros((0,), np.uint8)], {}),
    "count output type": (
        "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT",
        [u8],
        {"output_datatype": "UINT16"},
    ),
    "pdpd axis": (
        "openvino.BitwiseAnd-13",
        [u8, u8[0]],
        {"auto_broadcast": "pdpd", "axis": 5},
    ),
}


@pytest.mark.parametrize("name", list(INVALID))
def test_local_validation_says_what_the_server_says(live: Client, name: str) -> None:
    model, inputs, parameters = INVALID[name]
    with pytest.raises(LocalValidationError) as local:
        live.infer(model, inputs, parameters)
    with pytest.raises(BadRequestError) as remote:
        live.with_options(local_validation=False).infer(model, inputs, parameters)
    assert local.value.message == remote.value.message
    assert (local.value.field, local.value.rule) == (remote.value.field, remote.value.rule)
    assert local.value.code == remote.value.code == "invalid_request"


def test_reserved_parameters_pass_local_and_remote_checks(live: Client) -> None:
    # The request-level policy (tensorbits_protocol.parameters) is one table for both checks.
    parameters = {"sequence_id": 3, "priority": 1, "triton_enable_empty_final_response": True}
    for client in (live, live.with_options(local_validation=False)):
        np.testing.assert_array_equal(
            client.infer("onnx.BitwiseNot-18", [u8], parameters).output, ~u8
        )


def test_unknown_model_is_the_servers_404(live: Client) -> None:
    with pytest.raises(NotFoundError) as caught:
        live.infer("onnx.BitwiseNand-18", [u8])
    with pytest.raises(OperatorNotFound) as expected:
        get_operator("onnx.BitwiseNand-18")
    assert caught.value.message == expected.value.message
    assert caught.value.code == "not_found"


def test_server_side_errors_carry_the_servers_message(live: Client) -> None:
    client = live.with_options(local_validation=False)
    with pytest.raises(BadRequestError) as caught:
        client.infer("onnx.BitwiseNot-18", [np.zeros(3, np.float16)], binary=False)
    assert "FP16" in caught.value.message
    assert caught.value.field == "X"


# --- resources ----------------------------------------------------------------------------------
def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/fd")
def test_a_reused_client_leaks_no_connections(server_url: str) -> None:
    x = np.arange(16, dtype=np.uint8)
    with Client(server_url) as client:
        client.dml.bit_not(x)  # warm: the tables fetched, one connection open
        before = _open_fds()
        for _ in range(1000):
            client.dml.bit_not(x)
        after = _open_fds()
    assert after <= before
    assert _open_fds() < before  # closing the client closed its connection


# --- map ----------------------------------------------------------------------------------------
def test_map_keeps_order_and_pipelines(live: Client) -> None:
    arrays = [np.full(8, i, np.uint8) for i in range(40)]
    results = live.map("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", arrays, concurrency=6)
    assert len(results) == 40
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out, ~arrays[i])


def test_map_takes_mappings_and_a_generator(live: Client) -> None:
    items = ({"A": np.full(4, i, np.int32), "B": np.ones(4, np.int32)} for i in range(10))
    results = live.map("onnx.BitwiseAnd-18", items, concurrency=3)
    assert [int(r[0]) for r in results] == [i & 1 for i in range(10)]


def test_map_raises_the_first_failure_itself(live: Client) -> None:
    items = [[u8]] * 5 + [[np.zeros(3, np.float32)]] + [[u8]] * 5
    with pytest.raises(LocalValidationError, match="data type FP32"):
        live.map("onnx.BitwiseNot-18", items, concurrency=2)


def test_map_with_progress(live: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    bars: list[FakeBar] = []

    class FakeBar:
        def __init__(self, total: int | None, desc: str, unit: str) -> None:
            self.total, self.desc, self.n, self.closed = total, desc, 0, False
            bars.append(self)

        def update(self, n: int = 1) -> None:
            self.n += n

        def close(self) -> None:
            self.closed = True

    monkeypatch.setitem(sys.modules, "tqdm.auto", types.SimpleNamespace(tqdm=FakeBar))
    arrays = [np.arange(4, dtype=np.uint8)] * 12
    live.map("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", arrays, progress=True)
    (bar,) = bars
    assert (bar.total, bar.n, bar.closed) == (12, 12, True)
    assert bar.desc == "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"


def test_map_progress_without_tqdm_says_how_to_get_it(
    live: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(
        ImportError, match=r"pip install tqdm .*pip install \./protocol './client\[progress\]'"
    ):
        live.map("onnx.BitwiseNot-18", [[u8]], progress=True)


def test_map_with_real_tqdm(live: Client) -> None:
    pytest.importorskip("tqdm")
    results = live.map("onnx.BitwiseNot-18", [[u8]] * 3, progress=True)
    assert len(results) == 3


def test_sync_map_works_inside_a_running_event_loop(live: Client) -> None:
    async def inside() -> list[Arr]:
        return live.map("onnx.BitwiseNot-18", [[u8]] * 3)

    assert len(asyncio.run(inside())) == 3


def test_async_map(server_url: str) -> None:
    async def main() -> list[Arr]:
        async with AsyncClient(server_url) as client:
            return await client.map(
                "onnx.BitwiseNot-18", ([np.full(3, i, np.int8)] for i in range(20))
            )

    results = asyncio.run(main())
    assert [int(r[0]) for r in results] == [~i for i in range(20)]


def test_map_rejects_zero_concurrency(live: Client) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        live.map("onnx.BitwiseNot-18", [[u8]], concurrency=0)


def test_operators_are_the_servers(live: Client) -> None:
    tables = live.operators()
    assert set(tables) == {op.name for op in OPERATORS}
    assert live._catalog.source == "server"
    assert tables["onnx.BitShift-11"].inputs == ("X", "Y")
