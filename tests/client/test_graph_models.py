"""Graph models through the SDK, sync and async alike: ``load_onnx`` / ``load_model`` (Triton's
load parameters), ``repository_index``, ``infer`` with several outputs compared with ONNX
Runtime byte for byte, ``model_config``, ``unload_model``, and the server's refusals as the SDK's
status errors; against a real ``tensorbits serve`` (the session's), and the wire form offline."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
from core.graph_models import binding_example, constant, model_bytes, tensor
from fake_server import FakeServer, json_error
from onnx import TensorProto, helper

from tensorbits_client import (
    AsyncClient,
    BadRequestError,
    Client,
    LocalValidationError,
    NotFoundError,
    OverloadedError,
)
from tensorbits_client.types import RepositoryIndexEntry
from tensorbits_protocol.v1 import BindingGraph

ort = pytest.importorskip("onnxruntime")

T = TypeVar("T")
Arr = np.ndarray[Any, Any]
AnyClient = Client | AsyncClient
MODES = ("sync", "async")
U8 = TensorProto.UINT8
MODEL_FILE = "file:1/model.onnx"
BUILTIN = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"


def family_model() -> bytes:
    """Every operator of the family, broadcasting (y is one row), an initializer (k, a shift
    count per column), a symbolic dimension and three outputs."""
    nodes = [
        helper.make_node("BitwiseAnd", ["x", "y"], ["and"], name="and"),
        helper.make_node("BitwiseOr", ["x", "y"], ["or"], name="or"),
        helper.make_node("BitwiseXor", ["and", "or"], ["xor"], name="xor"),
        helper.make_node("BitwiseNot", ["xor"], ["not"], name="not"),
        helper.make_node("BitShift", ["not", "k"], ["left"], name="shl", direction="LEFT"),
        helper.make_node("BitShift", ["x", "k"], ["right"], name="shr", direction="RIGHT"),
    ]
    return model_bytes(
        nodes,
        [tensor("x", U8, ["n", 4]), tensor("y", U8, [4])],
        [tensor("left", U8, ["n", 4]), tensor("right", U8, ["n", 4]), tensor("or", U8, ["n", 4])],
        [constant("k", np.array([1, 2, 3, 7], np.uint8))],
    )


def xor_model() -> bytes:
    u32 = TensorProto.UINT32
    return model_bytes(
        [helper.make_node("BitwiseXor", ["a", "b"], ["c"])],
        [tensor("a", u32, [3]), tensor("b", u32, [3])],
        [tensor("c", u32, [3])],
    )


def add_model() -> bytes:
    """A node outside the family: ``Add``."""
    return model_bytes(
        [helper.make_node("Add", ["x", "x"], ["y"], name="adder")],
        [tensor("x", U8, [4])],
        [tensor("y", U8, [4])],
    )


FAMILY = family_model()
X = np.arange(24, dtype=np.uint8).reshape(6, 4) * 11
Y = np.array([0xF0, 0x0F, 0xAA, 0x55], np.uint8)
A = np.array([1, 0xFFFF0000, 7], np.uint32)
B = np.array([3, 0x0000FFFF, 7], np.uint32)


def onnxruntime_outputs(data: bytes, feeds: dict[str, Arr]) -> dict[str, Arr]:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def assert_identical(got: dict[str, Arr], want: dict[str, Arr]) -> None:
    assert list(got) == list(want)  # every output, in the file's order
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


async def done(value: T | Awaitable[T]) -> T:
    """A sync client's result as it is, an async client's awaited: one scenario for both."""
    if inspect.isawaitable(value):
        return await value
    return value


def run(mode: str, url: str, scenario: Callable[[AnyClient], Awaitable[None]]) -> None:
    """``scenario`` with a ``Client`` (its calls blocking the loop, which is all there is) or an
    ``AsyncClient`` of the live server."""

    async def main() -> None:
        if mode == "sync":
            with Client(url) as client:
                await scenario(client)
        else:
            async with AsyncClient(url) as client:
                await scenario(client)

    asyncio.run(main())


async def index_of(client: AnyClient, *, ready: bool = False) -> dict[str, RepositoryIndexEntry]:
    entries = await done(client.repository_index(ready=ready))
    assert all(isinstance(entry, RepositoryIndexEntry) for entry in entries)
    return {entry.name: entry for entry in entries}


async def unload_quietly(client: AnyClient, name: str) -> None:
    """Leave the session's server as it was, whatever the test did."""
    with contextlib.suppress(NotFoundError):
        await done(client.unload_model(name))


# --- against the live server ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_load_infer_several_outputs_index_unload(server_url: str, mode: str) -> None:
    name = f"family_{mode}"
    want = onnxruntime_outputs(FAMILY, {"x": X, "y": Y})

    async def scenario(client: AnyClient) -> None:
        assert name not in await index_of(client)
        try:
            await done(client.load_onnx(name, FAMILY))
            entry = (await index_of(client))[name]
            assert (entry.state, entry.version, entry.reason) == ("READY", "1", None)
            assert name in await index_of(client, ready=True)

            result = await done(client.infer(name, {"y": Y, "x": X}))  # by name, any order
            assert result.model_name == name
            assert_identical(result.outputs, want)
            with pytest.raises(ValueError, match="3 outputs"):
                result.output  # noqa: B018  (several outputs: .output refuses to pick one)
            as_json = await done(client.infer(name, {"x": X, "y": Y}, binary=False))
            assert_identical(as_json.outputs, want)
            # A symbolic dimension takes one size per request.
            one_row = await done(client.infer(name, {"x": X[:1], "y": Y}))
            assert_identical(one_row.outputs, onnxruntime_outputs(FAMILY, {"x": X[:1], "y": Y}))

            await done(client.unload_model(name))
            assert name not in await index_of(client)
            with pytest.raises(NotFoundError) as caught:
                await done(client.infer(name, {"x": X, "y": Y}))
            assert caught.value.status_code == 404
            assert name in caught.value.message
            with pytest.raises(NotFoundError):  # unloaded already: nothing of that name
                await done(client.unload_model(name))
        finally:
            await unload_quietly(client, name)

    run(mode, server_url, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_load_onnx_from_a_path_and_again_replaces(
    server_url: str, mode: str, tmp_path: Path
) -> None:
    name = f"from_path_{mode}"
    path = tmp_path / "model.onnx"
    path.write_bytes(FAMILY)

    async def scenario(client: AnyClient) -> None:
        try:
            await done(client.load_onnx(name, path))
            result = await done(client.infer(name, {"x": X, "y": Y}))
            assert_identical(result.outputs, onnxruntime_outputs(FAMILY, {"x": X, "y": Y}))
            # The same name again, as a str path to another file: the new file is served.
            path.write_bytes(xor_model())
            await done(client.load_onnx(name, str(path)))
            result = await done(client.infer(name, {"a": A, "b": B}))
            assert_identical(result.outputs, {"c": A ^ B})
        finally:
            await unload_quietly(client, name)

    run(mode, server_url, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_load_model_with_a_dict_config_and_with_json_text(server_url: str, mode: str) -> None:
    name = f"xor_{mode}"
    config = {
        "backend": "onnxruntime",
        "max_batch_size": 0,
        "input": [{"name": "a", "data_type": "TYPE_UINT32", "dims": [3]}],
    }

    async def scenario(client: AnyClient) -> None:
        try:
            await done(client.load_model(name, config=config, files={MODEL_FILE: xor_model()}))
            result = await done(client.infer(name, {"a": A, "b": B}))
            assert_identical(result.outputs, {"c": A ^ B})
            # The dict reached the server as the configuration: one that disagrees with the
            # file is refused, naming the entry and the rule, and the loaded model stays.
            wrong = {**config, "input": [{"name": "a", "data_type": "TYPE_UINT8", "dims": [3]}]}
            with pytest.raises(BadRequestError) as caught:
                await done(client.load_model(name, config=wrong, files={MODEL_FILE: xor_model()}))
            assert (caught.value.field, caught.value.rule) == (
                "config.input[0].data_type",
                "datatype",
            )
            assert "TYPE_UINT32" in caught.value.message
            assert (await index_of(client))[name].state == "READY"
            # JSON text is sent as it is.
            text = json.dumps({"platform": "onnxruntime_onnx"})
            await done(client.load_onnx(name, FAMILY, config=text))
            result = await done(client.infer(name, {"x": X, "y": Y}))
            assert_identical(result.outputs, onnxruntime_outputs(FAMILY, {"x": X, "y": Y}))
        finally:
            await unload_quietly(client, name)

    run(mode, server_url, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_model_config_of_a_graph_model(server_url: str, mode: str) -> None:
    name = f"config_{mode}"

    async def scenario(client: AnyClient) -> None:
        try:
            await done(client.load_onnx(name, FAMILY))
            config = await done(client.model_config(name))
        finally:
            await unload_quietly(client, name)
        assert (config.name, config.platform, config.max_batch_size) == (
            name,
            "onnxruntime_onnx",
            0,
        )
        inputs = [(t.name, t.data_type, t.dims) for t in config.input]
        outputs = [(t.name, t.data_type, t.dims) for t in config.output]
        assert inputs == [("x", "TYPE_UINT8", [-1, 4]), ("y", "TYPE_UINT8", [4])]
        assert outputs == [
            ("left", "TYPE_UINT8", [-1, 4]),
            ("right", "TYPE_UINT8", [-1, 4]),
            ("or", "TYPE_UINT8", [-1, 4]),
        ]

    run(mode, server_url, scenario)


# (name, file, config, field, rule): every load the server refuses, loading nothing.
REFUSED = {
    "unknown op": ("hostile_add", add_model(), None, "nodes[0]", "unknown_operator"),
    "built-in name": (BUILTIN, FAMILY, None, "model_name", "builtin_model"),
    "other backend": (
        "hostile_backend",
        FAMILY,
        {"backend": "tensorflow"},
        "config.backend",
        "unsupported_backend",
    ),
    "not onnx": ("hostile_bytes", b"\x08\x0a not a model", None, None, None),
}


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("mode", MODES)
def test_a_refused_load_is_a_bad_request_naming_the_rule(
    server_url: str, mode: str, case: str
) -> None:
    name, data, config, field, rule = REFUSED[case]

    async def scenario(client: AnyClient) -> None:
        before = await index_of(client)
        with pytest.raises(BadRequestError) as caught:
            await done(client.load_onnx(name, data, config=config))
        error = caught.value
        assert (error.status_code, error.code) == (400, "invalid_request")
        if rule is not None:
            assert (error.field, error.rule) == (field, rule)
        else:
            assert error.rule  # whichever reader rule the bytes break, it is named
        if case == "unknown op":
            assert "'adder' ('Add')" in error.message
        assert await index_of(client) == before  # nothing loaded, nothing replaced
        if name == BUILTIN:  # the operator still answers as itself
            out = await done(client.infer(BUILTIN, {"InputTensor": Y}))
            assert out.output.tobytes() == (~Y).tobytes()

    run(mode, server_url, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_files_without_a_config_are_refused(server_url: str, mode: str) -> None:
    async def scenario(client: AnyClient) -> None:
        with pytest.raises(BadRequestError) as caught:
            await done(client.load_model(f"no_config_{mode}", files={MODEL_FILE: FAMILY}))
        assert (caught.value.field, caught.value.rule) == ("parameters.config", "missing_config")
        assert f"no_config_{mode}" not in await index_of(client)

    run(mode, server_url, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_unload_and_load_a_built_in_model(server_url: str, mode: str) -> None:
    name = "onnx.BitwiseOr-18"

    async def scenario(client: AnyClient) -> None:
        try:
            await done(client.unload_model(name))
            assert (await index_of(client))[name].state == "UNAVAILABLE"
            assert name not in await index_of(client, ready=True)
        finally:
            await done(client.load_model(name))
        assert (await index_of(client, ready=True))[name].state == "READY"
        out = await done(client.infer(name, {"A": X, "B": Y}))
        assert out.output.tobytes() == (X | Y).tobytes()

    run(mode, server_url, scenario)


ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "client.md"
EXAMPLES = ROOT / "examples"


def test_the_docs_example_runs(server_url: str, tmp_path: Path) -> None:
    """docs/client.md's graph-model example, verbatim, with the repository's example model it
    names (examples/models/masked), run from a copy of the repository's root."""
    match = re.search(r"^## Graph models\n.*?^```python\n(.*?)^```", DOCS.read_text(), re.M | re.S)
    assert match is not None
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    env = {**os.environ, "TENSORBITS_URL": server_url}
    result = subprocess.run(
        [sys.executable, "-c", match.group(1)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    *outputs, ready = result.stdout.splitlines()
    assert outputs == ["[[0 1 2 3]", " [0 1 6 7]]"]  # [[0..3], [4..7]] & [1, 3, 7, 15]
    assert "'masked'" in ready
    assert "'DML_OPERATOR_ELEMENT_WISE_BIT_NOT'" in ready
    with Client(server_url) as client:  # and it unloaded it
        assert "masked" not in {entry.name for entry in client.repository_index()}


# --- offline: what goes on the wire --------------------------------------------------------------


def _ok(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v2/repository/index":
        return httpx.Response(200, json=[{"name": "g", "version": "1", "state": "READY"}])
    return httpx.Response(200)


@pytest.mark.parametrize("mode", MODES)
def test_the_requests_are_tritons(mode: str) -> None:
    server = FakeServer(_ok)

    async def scenario(client: AnyClient) -> None:
        await done(client.load_onnx("a/b c", b"\x01\x02\xff"))
        await done(
            client.load_model("m", config={"backend": "onnxruntime"}, files={"file:1/x": b""})
        )
        await done(client.load_model("builtin"))
        await done(client.unload_model("a/b c"))
        entries = await done(client.repository_index())
        assert entries == [RepositoryIndexEntry(name="g", version="1", state="READY")]
        await done(client.repository_index(ready=True))

    async def main() -> None:
        if mode == "sync":
            with server.client() as client:
                await scenario(client)
        else:
            async with server.async_client() as client:
                await scenario(client)

    asyncio.run(main())
    sent = [(r.method, r.url.raw_path.decode(), r.content) for r in server.requests]
    config = json.dumps({"backend": "onnxruntime"})
    assert [(method, path) for method, path, _ in sent] == [
        ("POST", "/v2/repository/models/a%2Fb%20c/load"),
        ("POST", "/v2/repository/models/m/load"),
        ("POST", "/v2/repository/models/builtin/load"),
        ("POST", "/v2/repository/models/a%2Fb%20c/unload"),
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/index"),
    ]
    bodies = [json.loads(content) if content else None for _, _, content in sent]
    assert bodies[0] == {
        "parameters": {"config": config, MODEL_FILE: base64.b64encode(b"\x01\x02\xff").decode()}
    }
    assert bodies[1] == {"parameters": {"config": config, "file:1/x": ""}}
    assert bodies[2:] == [{}, None, {}, {"ready": True}]
    assert server.requests[0].headers["content-type"] == "application/json"


def test_a_file_named_config_is_refused_before_sending() -> None:
    server = FakeServer(_ok)
    with server.client() as client, pytest.raises(ValueError, match="not a file's name"):
        client.load_model("m", config="{}", files={"config": b"{}"})
    assert server.requests == []


def test_a_busy_server_is_asked_again_to_load_but_not_to_unload() -> None:
    """Loading the same files again changes nothing; unloading again would be a 404 when the
    first answer was lost, so an unload is sent once."""
    answers = iter([json_error(503, "busy", retry_after="0"), httpx.Response(200)])
    server = FakeServer(lambda request: next(answers))
    with server.client(max_retries=1) as client:
        client.load_onnx("g", b"\x00")
        assert len(server.requests) == 2
        server.handler = lambda request: json_error(503, "busy", retry_after="0")
        with pytest.raises(OverloadedError):
            client.unload_model("g")
    assert len(server.requests) == 3


@pytest.mark.parametrize("mode", MODES)
def test_load_graph_of_the_binding_model(server_url: str, mode: str) -> None:
    """A /v1 binding graph loaded from its document and from the protocol's model, inferred by
    name; a document its schema refuses is a LocalValidationError naming the field, not sent."""
    name = f"binding_{mode}"
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 1 << 32, (4, 8), dtype=np.uint32)
    query = rng.integers(0, 1 << 32, (8,), dtype=np.uint32)

    async def scenario(client: AnyClient) -> None:
        try:
            await done(client.load_graph(name, binding_example()))
            result = await done(client.infer(name, {"codes": codes, "query": query}))
            assert result.output.dtype == np.uint8
            assert result.output.tolist() == np.bitwise_count(codes ^ query).tolist()
            config = await done(client.model_config(name))
            assert (config.platform, config.backend) == ("tensorbits_graph", "tensorbits")
            await done(client.load_graph(name, BindingGraph.model_validate(binding_example())))
            assert name in await index_of(client, ready=True)
            wrong = binding_example()
            wrong["inputs"][0]["shape"] = "4x8"
            with pytest.raises(LocalValidationError) as caught:
                await done(client.load_graph(name, wrong))
            assert (caught.value.field, caught.value.rule) == ("inputs[0].shape", "list_type")
            past = binding_example()
            past["dispatches"][0]["bindings"]["BTensor"]["offset"] = 16
            with pytest.raises(BadRequestError) as refused:  # the server's rule: past its buffer
                await done(client.load_graph(name, past))
            assert refused.value.rule == "buffer_bounds"
        finally:
            await unload_quietly(client, name)

    run(mode, server_url, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_a_batch_built_with_the_sdk_loaded_as_a_graph(server_url: str, mode: str) -> None:
    """``Batch.graph()``: the batch's buffers and dispatches as a binding graph (its input
    buffers the model's inputs, its returned buffers the outputs), loaded once and inferred
    with other values; the same answers as the batch run with those values."""
    name = f"built_{mode}"
    rng = np.random.default_rng(9)
    shape = (3, 5)  # UINT8: 15 bytes, buffers of 16 (DirectML's 4-byte sizes)

    def build(client: AnyClient, a: Arr, b: Arr) -> Any:
        batch = client.batch()
        x, y = batch.input("x", a), batch.input("y", b)
        masked = batch.bit_and(x, y, out="masked")
        batch.bit_not(masked, out="flipped")
        batch.output("flipped", "UINT8", shape)
        batch.output("masked", "UINT8", shape)
        return batch

    async def scenario(client: AnyClient) -> None:
        a = rng.integers(0, 256, shape, dtype=np.uint8)
        b = rng.integers(0, 256, shape, dtype=np.uint8)
        graph = build(client, np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)).graph()
        assert [(t.name, t.shape) for t in graph.inputs] == [("x", [3, 5]), ("y", [3, 5])]
        assert [t.name for t in graph.outputs] == ["flipped", "masked"]
        try:
            await done(client.load_graph(name, graph))
            result = await done(client.infer(name, {"x": a, "y": b}))
            assert result.outputs["masked"].tolist() == (a & b).tolist()
            assert result.outputs["flipped"].tolist() == (~(a & b)).tolist()
            ran = await done(build(client, a, b).run())
            for output in ("masked", "flipped"):
                assert result.outputs[output].tobytes() == ran[output].tobytes()
        finally:
            await unload_quietly(client, name)

    run(mode, server_url, scenario)


def test_a_strided_output_cannot_be_a_graphs() -> None:
    batch = Client("http://127.0.0.1:9").batch()
    x = batch.input("x", np.zeros((2, 2), np.uint32))
    batch.bit_not(x, in_place=True)
    batch.output(x.tensor("UINT32", (2, 2), strides=(1, 2)))
    with pytest.raises(ValueError, match="whole buffer, packed"):
        batch.graph()
