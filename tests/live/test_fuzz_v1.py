"""Hypothesis fuzz of POST /v1/batch: hostile strides, offsets, sizes and byte sizes around 2^32
and 2^64, overlapping bindings, missing buffers, self-referencing dispatches, unknown operators.
Every integer field (buffers' byte_size, bindings' offset and size, descs' sizes, strides,
total_size and alignment, parameter values) also gets integers no 64-bit field holds: past
±2^63 and 2^64, and thousands of digits long (``support.reliability.hostile_ints``).

Property: a 200 whose output buffers equal NumPy's, or a 4xx with a JSON ``error`` naming the
``field`` it is about; never a 5xx.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.framing import HEADER
from support.inprocess import TestClient
from support.reliability import (
    FUZZ,
    OUTSIDE_64_BITS,
    LongInt,
    assert_not_server_error,
    dumps,
    hostile_ints,
    small_client,
)

XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
EDGES = [
    0,
    1,
    3,
    15,
    16,
    17,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**32 + 16,
    2**63 - 1,
    2**63,
    2**64 - 16,
    2**64,
    2**64 + 16,
    -1,
    -16,
    -(2**63),
]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with small_client() as c:
        yield c


def post(client: TestClient, header: Any, data: bytes, framed: bool = True) -> Any:
    head = dumps(header)
    headers = {HEADER: str(len(head))} if framed else {}
    return client.post("/v1/batch", content=head + data, headers=headers)


@st.composite
def valid_batches(draw: st.DrawFn) -> dict[str, Any]:
    """XOR of two UINT32 vectors into a zero-filled buffer, optionally NOT in place after it."""
    n = draw(st.integers(1, 64))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = rng.integers(0, 2**32, size=n, dtype=np.uint32)
    b = rng.integers(0, 2**32, size=n, dtype=np.uint32)
    size = 4 * n

    def bind(buffer: str) -> dict[str, Any]:
        return {"buffer": buffer, "offset": 0, "desc": {"datatype": "UINT32", "sizes": [n]}}

    dispatches: list[dict[str, Any]] = [
        {
            "operator": XOR,
            "bindings": {"ATensor": bind("a"), "BTensor": bind("b"), "OutputTensor": bind("out")},
        }
    ]
    expected = a ^ b
    if draw(st.booleans()):
        dispatches.append(
            {"operator": NOT, "bindings": {"InputTensor": bind("out"), "OutputTensor": bind("out")}}
        )
        expected = ~expected
    header = {
        "buffers": [
            {"name": "a", "byte_size": size},
            {"name": "b", "byte_size": size},
            {"name": "out", "byte_size": size, "init": "zeros"},
        ],
        "dispatches": dispatches,
        "outputs": ["out"],
    }
    return {
        "header": header,
        "data": a.astype("<u4").tobytes() + b.astype("<u4").tobytes(),
        "expected": expected,
    }


def check_batch(response: Any, expected: np.ndarray[Any, Any]) -> None:
    assert response.status_code == 200, response.text[:300]
    n = int(response.headers[HEADER])
    document = json.loads(response.content[:n])
    assert document["outputs"] == [{"name": "out", "byte_size": expected.nbytes}]
    np.testing.assert_array_equal(np.frombuffer(response.content[n:], "<u4"), expected)


@FUZZ
@given(batch=valid_batches())
def test_rel_fuzz_v1_valid(client: TestClient, batch: dict[str, Any]) -> None:
    check_batch(post(client, batch["header"], batch["data"]), batch["expected"])


edge_ints = st.one_of(st.sampled_from(EDGES), st.integers(-(2**70), 2**70), hostile_ints)
wrong = st.one_of(
    edge_ints, st.text(max_size=4), st.none(), st.floats(), st.booleans(), st.just([])
)


@st.composite
def hostile_batches(draw: st.DrawFn) -> tuple[Any, bytes, bool]:
    batch = draw(valid_batches())
    header = copy.deepcopy(batch["header"])
    data: bytes = batch["data"]
    framed = True
    for _ in range(draw(st.integers(1, 4))):
        if not header["dispatches"]:
            break
        dispatch = draw(st.sampled_from(header["dispatches"]))
        if not dispatch["bindings"]:  # an earlier round removed them all
            continue
        binding = dispatch["bindings"][draw(st.sampled_from(sorted(dispatch["bindings"])))]
        desc = binding["desc"]
        kind = draw(
            st.sampled_from(
                [
                    "strides",
                    "sizes",
                    "offset",
                    "size",
                    "total_size",
                    "alignment",
                    "byte_size",
                    "overlap",
                    "missing_buffer",
                    "self_alias",
                    "operator",
                    "bindings",
                    "outputs",
                    "counts",
                    "datatype",
                    "framing",
                    "parameters",
                    "wrong_type",
                ]
            )
        )
        rank = len(desc["sizes"]) if isinstance(desc.get("sizes"), list) else 1
        if kind == "strides":
            desc["strides"] = draw(
                st.lists(edge_ints, min_size=max(rank - 1, 0), max_size=rank + 1)
            )
        elif kind == "sizes":
            desc["sizes"] = draw(st.lists(edge_ints, min_size=0, max_size=9))
        elif kind == "offset":
            binding["offset"] = draw(edge_ints)
        elif kind == "size":
            binding["size"] = draw(edge_ints)
        elif kind == "total_size":
            desc["total_size"] = draw(edge_ints)
        elif kind == "alignment":
            desc["alignment"] = draw(edge_ints)
        elif kind == "byte_size":
            buffer = draw(st.sampled_from(header["buffers"]))
            buffer["byte_size"] = draw(edge_ints)
        elif kind == "overlap":
            # The output over an input, shifted: partial aliasing.
            dispatch["bindings"]["OutputTensor"] = dict(
                copy.deepcopy(binding), offset=draw(st.sampled_from([0, 16, 32]))
            )
        elif kind == "missing_buffer":
            binding["buffer"] = draw(st.sampled_from(["nope", "", "a" * 200, "OUT"]))
        elif kind == "self_alias":
            # A dispatch reading and writing the same buffer with different views (a cycle
            # of data flow through one buffer).
            for other in dispatch["bindings"].values():
                other["buffer"] = binding["buffer"]
            if draw(st.booleans()):
                desc["strides"] = [0]
        elif kind == "operator":
            dispatch["operator"] = draw(
                st.one_of(
                    st.sampled_from(["DML_OPERATOR_GEMM", "", "onnx.BitwiseAnd-1", "x" * 300]),
                    st.text(max_size=10),
                )
            )
        elif kind == "bindings":
            key = draw(st.sampled_from(sorted(dispatch["bindings"])))
            if draw(st.booleans()):
                dispatch["bindings"].pop(key)
            else:
                dispatch["bindings"][key + "x"] = dispatch["bindings"][key]
        elif kind == "outputs":
            header["outputs"] = draw(
                st.lists(st.sampled_from(["out", "a", "zzz", "out"]), max_size=4)
            )
        elif kind == "counts":
            if draw(st.booleans()):
                header["dispatches"] = header["dispatches"] * draw(st.integers(2, 40))
            else:
                header["buffers"] += [
                    {"name": f"z{i}", "byte_size": 16, "init": "zeros"}
                    for i in range(draw(st.integers(1, 40)))
                ]
        elif kind == "datatype":
            desc["datatype"] = draw(
                st.sampled_from(["UINT128", "BYTES", "FLOAT32", "BOOL", "", "u4"])
            )
        elif kind == "framing":
            choice = draw(st.integers(0, 2))
            if choice == 0:
                data = data[: draw(st.integers(0, max(len(data) - 1, 0)))]
            elif choice == 1:
                data += draw(st.binary(min_size=1, max_size=32))
            else:
                framed = False
        elif kind == "parameters":
            name = draw(st.sampled_from(["feature_level", "output_datatype", "x"]))
            dispatch["parameters"] = {name: draw(edge_ints)}
        elif kind == "wrong_type":
            target = draw(st.sampled_from(["desc", "binding", "dispatch", "header"]))
            obj = {"desc": desc, "binding": binding, "dispatch": dispatch, "header": header}[target]
            field = draw(st.sampled_from([*sorted(obj), "extra"]))
            obj[field] = draw(wrong)
            break  # the structure may be gone: no further mutation can walk it
    return header, data, framed


@FUZZ
@given(case=hostile_batches())
def test_rel_fuzz_v1_hostile(client: TestClient, case: tuple[Any, bytes, bool]) -> None:
    header, data, framed = case
    response = post(client, header, data, framed)
    assert_not_server_error(
        response.status_code,
        response.content,
        response.headers.get("content-type", ""),
        names_field=True,
    )


def _binding(header: dict[str, Any]) -> dict[str, Any]:
    binding: dict[str, Any] = header["dispatches"][0]["bindings"]["ATensor"]
    return binding


# Every integer field of a batch header, by the path an error names it with, and how to set it.
INTEGER_FIELDS: dict[str, Callable[[dict[str, Any], Any], None]] = {
    "buffers[0].byte_size": lambda h, v: h["buffers"][0].update(byte_size=v),
    "dispatches[0].bindings.ATensor.offset": lambda h, v: _binding(h).update(offset=v),
    "dispatches[0].bindings.ATensor.size": lambda h, v: _binding(h).update(size=v),
    "dispatches[0].bindings.ATensor.desc.sizes[0]": lambda h, v: _binding(h)["desc"].update(
        sizes=[v]
    ),
    "dispatches[0].bindings.ATensor.desc.strides[0]": lambda h, v: _binding(h)["desc"].update(
        strides=[v]
    ),
    "dispatches[0].bindings.ATensor.desc.total_size": lambda h, v: _binding(h)["desc"].update(
        total_size=v
    ),
    "dispatches[0].bindings.ATensor.desc.alignment": lambda h, v: _binding(h)["desc"].update(
        alignment=v
    ),
    "dispatches[0].parameters.feature_level": lambda h, v: h["dispatches"][0].update(
        parameters={"feature_level": v}
    ),
}


@pytest.mark.parametrize("value", OUTSIDE_64_BITS, ids=lambda v: str(v)[:12])
@pytest.mark.parametrize("path", sorted(INTEGER_FIELDS))
def test_rel_v1_integer_outside_64_bits(client: TestClient, path: str, value: Any) -> None:
    """An integer no 64-bit field holds, in any integer field: a 400 naming that field, or, when
    it is too long for Python to read at all (over 4,300 digits), naming the header."""
    header = {
        "buffers": [
            {"name": "a", "byte_size": 16},
            {"name": "b", "byte_size": 16},
            {"name": "out", "byte_size": 16, "init": "zeros"},
        ],
        "dispatches": [
            {
                "operator": XOR,
                "bindings": {
                    name: {"buffer": buffer, "desc": {"datatype": "UINT32", "sizes": [4]}}
                    for name, buffer in (
                        ("ATensor", "a"),
                        ("BTensor", "b"),
                        ("OutputTensor", "out"),
                    )
                },
            }
        ],
        "outputs": ["out"],
    }
    INTEGER_FIELDS[path](header, value)
    response = post(client, header, bytes(32))
    assert response.status_code == 400, response.text[:300]
    document = response.json()
    expected = "header" if isinstance(value, LongInt) and value.digits > 4300 else path
    assert document["field"] == expected, document


@pytest.mark.parametrize("byte_size", [2**32, 2**63, 2**64 - 1], ids=lambda v: f"{v:#x}")
def test_rel_v1_huge_zero_buffer(client: TestClient, byte_size: int) -> None:
    """A tiny request asking for a giant zero-filled buffer is refused before any allocation.
    (Past 2**64 - 1 a byte size is no UInt64: the schema's 400, test_rel_v1_integer_outside_64_bits.)"""
    header = {
        "buffers": [{"name": "z", "byte_size": byte_size, "init": "zeros"}],
        "dispatches": [],
        "outputs": ["z"],
    }
    response = post(client, header, b"")
    assert response.status_code == 413, response.text


@pytest.mark.parametrize("dims", [1, 2, 8])
def test_rel_v1_span_wrapping_64_bits(client: TestClient, dims: int) -> None:
    """Sizes and strides at their maxima (2^32 - 1) in 8 dimensions on UINT64: the span
    sum((size - 1) * stride) * 8 is about 2^70, which would wrap in uint64 arithmetic."""
    top = 2**32 - 1
    binding = {
        "buffer": "a",
        "desc": {"datatype": "UINT64", "sizes": [top] * dims, "strides": [top] * dims},
    }
    header = {
        "buffers": [
            {"name": "a", "byte_size": 64},
            {"name": "o", "byte_size": 64, "init": "zeros"},
        ],
        "dispatches": [
            {
                "operator": NOT,
                "bindings": {
                    "InputTensor": binding,
                    "OutputTensor": {"buffer": "o", "desc": {"datatype": "UINT64", "sizes": [8]}},
                },
            }
        ],
        "outputs": ["o"],
    }
    response = post(client, header, bytes(64))
    assert 400 <= response.status_code < 500, response.text
    assert isinstance(response.json()["error"], str)
