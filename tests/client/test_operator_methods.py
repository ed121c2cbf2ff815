"""Every operator of the table has its typed client methods, and their parameters are the table's.

For each row of ``tensorbits_protocol.operators.OPERATORS``: exactly one method of
``client.<spec>`` sends it, on a ``Client`` and on an ``AsyncClient`` (found by calling every
public method of every family and reading the request that went out), with the operator's inputs
in order and every parameter at the table's default; for DML, the ``Batch`` method of the same
name dispatches it. Each method's keywords are the operator's parameters, with the table's
defaults, annotated with a Literal of exactly the table's choices; mypy sees each method typed.

A row added to OPERATORS without a method fails ``test_every_operator_has_one_method``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import httpx
import numpy as np
import pytest
from fake_server import FakeServer

from tensorbits_client import AsyncClient, Batch, Client, async_hamming_distances, hamming_distances
from tensorbits_client.types import AutoBroadcast, CountType, Direction, FeatureLevel
from tensorbits_protocol import codec
from tensorbits_protocol.operators import (
    AUTO_BROADCAST,
    DEFAULT_FEATURE_LEVEL,
    DIRECTION,
    FEATURE_LEVELS,
    OPERATORS,
    OUTPUT_DATATYPE,
    OperatorSpec,
)
from tensorbits_protocol.v1 import BatchRequest

X = np.arange(6, dtype=np.uint8).reshape(2, 3)  # a valid input of every operator
SPECS = ("dml", "openvino", "onnx")  # the families' attribute names are the specs' names
CLIENT_KEYWORDS = {"timeout", "out", "in_place"}  # keywords that are not operator parameters
DML_OPERATORS = [op for op in OPERATORS if op.spec == "dml"]


@dataclass(frozen=True)
class Sent:
    """What one family method sent: ``client.<family>.<method>`` -> the request's contents."""

    family: str
    method: str
    operator: str
    inputs: list[str]
    parameters: dict[str, Any]


def _answer(request: httpx.Request) -> httpx.Response:
    output = {"name": "Y", "shape": [1], "datatype": "UINT8", "data": [0]}
    return httpx.Response(200, json={"model_name": "m", "outputs": [output]})


def _call_with_defaults(method: Callable[..., Any]) -> Any:
    """``method`` on one array per input, with the first choice for each required keyword."""
    parameters = inspect.signature(method, eval_str=True).parameters.values()
    arrays = [X for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    required = {
        p.name: get_args(p.annotation)[0]
        for p in parameters
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    }
    return method(*arrays, **required)


def _read(request: httpx.Request) -> tuple[str, list[str], dict[str, Any]]:
    """The model a v2 request names, its inputs' names in order, and its operator parameters."""
    header = json.loads(request.content[: int(request.headers[codec.HEADER_LENGTH])])
    parameters = {k: v for k, v in header["parameters"].items() if k != "binary_data_output"}
    model = request.url.path.removeprefix("/v2/models/").removesuffix("/infer")
    return model, [tensor["name"] for tensor in header["inputs"]], parameters


def _methods(client: Client | AsyncClient) -> list[tuple[str, str, Callable[..., Any]]]:
    """Every public method of every family: (family, name, the bound method)."""
    return [
        (spec, name, getattr(getattr(client, spec), name))
        for spec in SPECS
        for name in dir(getattr(client, spec))
        if not name.startswith("_")
    ]


@functools.cache
def _sent(asynchronous: bool) -> tuple[Sent, ...]:
    """Every family method called once, and what each sent."""
    server = FakeServer(_answer)

    async def call_all() -> list[tuple[str, str, Callable[..., Any]]]:
        async with server.async_client() as client:
            methods = _methods(client)
            for _, _, method in methods:
                await _call_with_defaults(method)
        return methods

    if asynchronous:
        methods = asyncio.run(call_all())
    else:
        with server.client() as client:
            methods = _methods(client)
            for _, _, method in methods:
                _call_with_defaults(method)
    return tuple(
        Sent(spec, name, *_read(request))
        for (spec, name, _), request in zip(methods, server.requests, strict=True)
    )


def _sending(op: OperatorSpec, asynchronous: bool = False) -> list[Sent]:
    return [sent for sent in _sent(asynchronous) if sent.operator == op.name]


def _table_defaults(op: OperatorSpec) -> dict[str, Any]:
    """Each parameter's default; a required one's first choice (what the calls here pass)."""
    return {p.name: p.choices[0] if p.required and p.choices else p.default for p in op.parameters}


def _check_keywords(method: Callable[..., Any], op: OperatorSpec) -> None:
    """``method``'s keywords are ``op``'s parameters: the table's defaults and choices."""
    parameters = inspect.signature(method, eval_str=True).parameters.values()
    keywords = {
        p.name: p for p in parameters if p.kind is p.KEYWORD_ONLY and p.name not in CLIENT_KEYWORDS
    }
    assert set(keywords) == set(op.parameter_index)
    for spec in op.parameters:
        keyword = keywords[spec.name]
        assert keyword.default == (keyword.empty if spec.required else spec.default), spec.name
        if spec.choices is None:
            assert keyword.annotation is int, spec.name
        else:
            assert get_args(keyword.annotation) == spec.choices, spec.name


# --- the client families ------------------------------------------------------------------------
@pytest.mark.parametrize("asynchronous", [False, True], ids=["Client", "AsyncClient"])
@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_every_operator_has_one_method(op: OperatorSpec, asynchronous: bool) -> None:
    sending = _sending(op, asynchronous)
    assert sending, f"no method of client.{op.spec} sends {op.name}"
    (sent,) = sending
    assert sent.family == op.spec
    assert sent.inputs == list(op.inputs)
    assert sent.parameters == _table_defaults(op)  # every parameter sent, at its default


@pytest.mark.parametrize("asynchronous", [False, True], ids=["Client", "AsyncClient"])
def test_every_method_sends_an_operator_of_the_table(asynchronous: bool) -> None:
    assert {sent.operator for sent in _sent(asynchronous)} == {op.name for op in OPERATORS}


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_method_keywords_are_the_tables_parameters(op: OperatorSpec) -> None:
    (sent,) = _sending(op)
    with Client("http://t.test") as client:
        _check_keywords(getattr(getattr(client, sent.family), sent.method), op)


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_docstrings_are_the_tables_summaries(op: OperatorSpec) -> None:
    (sent,) = _sending(op)
    with Client("http://t.test") as client:
        method = getattr(getattr(client, sent.family), sent.method)
    assert (method.__doc__ or "").startswith(f"``{op.name}``: {op.summary}.")


def test_literals_are_the_tables_choices() -> None:
    assert get_args(FeatureLevel) == FEATURE_LEVELS
    assert get_args(CountType) == OUTPUT_DATATYPE.choices
    assert get_args(AutoBroadcast) == AUTO_BROADCAST.choices
    assert get_args(Direction) == DIRECTION.choices


@pytest.mark.parametrize("recipe", [hamming_distances, async_hamming_distances])
def test_recipes_default_to_the_tables_feature_level(recipe: Callable[..., Any]) -> None:
    keyword = inspect.signature(recipe, eval_str=True).parameters["feature_level"]
    assert keyword.default == DEFAULT_FEATURE_LEVEL
    assert get_args(keyword.annotation) == FEATURE_LEVELS


# --- Batch: the DML operators, by the DML family's method names ---------------------------------
@pytest.mark.parametrize("op", DML_OPERATORS, ids=lambda op: op.name)
def test_every_dml_operator_has_a_batch_method(op: OperatorSpec) -> None:
    (sent,) = _sending(op)
    with Client("http://t.test") as client:
        batch = client.batch()
        buffers = [batch.input(f"in{i}", X) for i in range(len(op.inputs))]
        output = getattr(batch, sent.method)(*buffers)
        body = batch.plan().body
    raw = b"".join(bytes(part) for part in body.parts)
    header = BatchRequest.model_validate_json(raw[: int(body.headers[codec.HEADER_LENGTH])])
    (dispatch,) = header.dispatches
    assert dispatch.operator == op.name
    assert list(dispatch.bindings) == [*op.inputs, op.output]
    assert [dispatch.bindings[name].buffer for name in op.inputs] == [b.name for b in buffers]
    assert dispatch.bindings[op.output].buffer == output.buffer
    assert dispatch.parameters == _table_defaults(op)
    _check_keywords(getattr(batch, sent.method), op)
    assert (getattr(Batch, sent.method).__doc__ or "").startswith(f"``{op.name}``: {op.summary}.")


# --- what a type checker sees -------------------------------------------------------------------
def _typing_program() -> tuple[str, set[int]]:
    """A program calling every method as users do, and the lines where mypy must object."""
    lines = [
        "from typing import Any, Coroutine, assert_type",
        "from tensorbits_client import AsyncClient, Batch, Binding, Client",
        "from tensorbits_client.types import Array",
        "def check(c: Client, ac: AsyncClient, batch: Batch[Any], x: Array) -> None:",
        "    buf = batch.input('x', x)",
    ]
    wrong: set[int] = set()
    for op in OPERATORS:
        (sent,) = _sending(op)
        arrays = ", ".join(["x"] * len(op.inputs))
        required = "".join(
            f", {p.name}={p.choices[0]!r}" for p in op.parameters if p.required and p.choices
        )
        call = f"{sent.family}.{sent.method}({arrays}{required}"
        lines.append(f"    assert_type(c.{call}), Array)")
        lines.append(f"    assert_type(ac.{call}), Coroutine[Any, Any, Array]).close()")
        if op.spec == "dml":
            buffers = ", ".join(["buf"] * len(op.inputs))
            lines.append(f"    assert_type(batch.{sent.method}({buffers}), Binding)")
        for p in op.parameters:
            if p.choices is not None and not p.required:
                lines.append(f"    c.{call}, {p.name}='not a choice')")
                wrong.add(len(lines))
    return "\n".join(lines) + "\n", wrong


def test_mypy_sees_every_method_typed(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    program, wrong = _typing_program()
    (tmp_path / "calls.py").write_text(program)
    stdout, stderr, _ = api.run(["--strict", "--no-error-summary", str(tmp_path / "calls.py")])
    errors = [line for line in stdout.splitlines() if ": error: " in line]
    assert {int(line.split(":")[1]) for line in errors} == wrong, stdout + stderr
    assert all(line.endswith("[arg-type]") for line in errors), stdout


@pytest.mark.parametrize("asynchronous", [False, True], ids=["Client", "AsyncClient"])
def test_a_wrong_call_names_the_method_called(asynchronous: bool) -> None:
    """The TypeError of a call with an argument missing or unknown names the method the caller
    wrote (``ONNX.bitwise_and()``), not the private function every method of its shape shares;
    the call sends nothing."""
    client: Client | AsyncClient = (
        AsyncClient("http://127.0.0.1:1") if asynchronous else Client("http://127.0.0.1:1")
    )
    x = np.zeros(2, np.uint8)
    with pytest.raises(TypeError, match=r"^ONNX\.bitwise_and\(\) missing 1 required positional"):
        client.onnx.bitwise_and(x)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^DML\.bit_not\(\) got an unexpected keyword argument"):
        client.dml.bit_not(x, bogus=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^OpenVINO\.bitwise_not\(\) missing 1 required"):
        client.openvino.bitwise_not()  # type: ignore[call-arg]
    # Each method keeps its own name; the shared shape is untouched.
    assert client.onnx.bitwise_or.__qualname__ == "ONNX.bitwise_or"
