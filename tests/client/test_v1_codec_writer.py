"""The batch header written directly as JSON (``tensorbits_protocol.v1_codec``) against the wire models writing it
(what the builder did before): the same bytes, and the same errors at the same calls."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from tensorbits_client import Batch, Binding, Buffer, Client, _batch
from tensorbits_protocol import codec, v1_codec
from tensorbits_protocol.dml import TensorDesc
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.v1 import BatchRequest, BufferDeclaration, Dispatch

XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"
AND_OV = "openvino.BitwiseAnd-13"


class Recorder:
    """A batch, and the same batch written by the wire models as the builder used to."""

    def __init__(self, client: Client, request_id: str | None = None) -> None:
        self.batch: Batch[Any] = client.batch(request_id)
        self.request_id = request_id
        self.declarations: list[BufferDeclaration] = []
        self.dispatches: list[Dispatch] = []

    def input(self, name: str, array: np.ndarray[Any, Any]) -> Buffer:
        buffer = self.batch.input(name, array)
        self.declarations.append(BufferDeclaration(name=name, byte_size=buffer.nbytes))
        return buffer

    def zeros(self, name: str, nbytes: int) -> Buffer:
        buffer = self.batch.buffer(name, nbytes)
        self.declarations.append(BufferDeclaration(name=name, byte_size=nbytes, init="zeros"))
        return buffer

    def dispatch(
        self, operator: str, parameters: Mapping[str, Any] | None = None, **bindings: Binding
    ) -> None:
        self.batch.dispatch(operator, parameters, **bindings)
        self.dispatches.append(
            Dispatch(
                operator=operator,
                parameters=dict(parameters or {}),
                bindings={name: b.to_wire() for name, b in bindings.items()},
            )
        )

    def headers(self, outputs: list[str]) -> tuple[bytes, bytes]:
        for name in outputs:
            self.batch.output(name)
        body = self.batch.plan().body
        sent = b"".join(bytes(p) for p in body.parts)[: int(body.headers[codec.HEADER_LENGTH])]
        request = BatchRequest(
            id=self.request_id,
            buffers=self.declarations,
            dispatches=self.dispatches,
            outputs=outputs,
        )
        return sent, request.model_dump_json(exclude_none=True).encode()


def _many_small(r: Recorder) -> list[str]:
    a, b = r.input("a", np.arange(64, dtype=np.uint32)), r.input("b", np.ones(64, np.uint32))
    c = r.zeros("c", 256)
    for i in range(16):
        at = 16 * i
        r.dispatch(
            XOR,
            {"feature_level": "6_4"},
            ATensor=a.tensor("UINT32", (4,), offset=at),
            BTensor=b.tensor("UINT32", (4,), offset=at),
            OutputTensor=c.tensor("UINT32", (4,), offset=at),
        )
    return ["c"]


def _every_field(r: Recorder) -> list[str]:
    m = r.input("m", np.zeros((4, 8), np.uint32))
    out = r.zeros("out", 256)
    view = m.tensor("UINT32", (4, 4), strides=(8, 2), offset=16, total_size=112, alignment=16)
    r.dispatch(XOR, ATensor=view, BTensor=view, OutputTensor=view)
    sized = m.tensor(DataType.UINT32, [2, 8], size=96, offset=32)
    r.dispatch(
        "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT",
        {"feature_level": "5_0", "output_datatype": "UINT32"},
        InputTensor=sized,
        OutputTensor=out.tensor("UINT32", (2, 8)),
    )
    r.dispatch(
        AND_OV,
        {"auto_broadcast": "pdpd", "axis": 0},
        input_1=m.tensor("UINT8", (4, 32)),
        input_2=m.tensor("UINT8", (4,), strides=(0,)),
        output_1=out.tensor(np.uint8, (4, 32), offset=128),
    )
    r.dispatch(  # a bool parameter and a huge integer: the server judges them, not the builder
        AND_OV,
        {"axis": True, "auto_broadcast": 2**64 - 1},
        input_1=m.tensor("FLOAT32", (2,)),
        input_2=m.tensor("FP32", (2,)),
        output_1=out.tensor("FP32", (2,)),
    )
    r.dispatch(
        "onnx.BitShift-11",
        {"direction": 'LE"FT\\\n\x01'},  # escapes
        X=m.tensor("UINT64", (16,)),
        Y=m.tensor("UINT64", (16,)),
        Z=out.tensor("UINT64", (16,), offset=128),
    )
    r.dispatch("onnx.BitwiseNot-18", {}, X=m.tensor("INT8", (1,)), Y=out.tensor("INT8", (1,)))
    return ["out", "m"]


def _no_plain_form(r: Recorder) -> list[str]:
    # Non-ASCII names and values, and a float parameter, go through the wire models.
    d = r.input("données", np.arange(16, dtype=np.uint8))
    for level in ("6_4", "6_4é"):
        r.dispatch(
            XOR,
            {"feature_level": level},
            ATensor=d.tensor(),
            BTensor=d.tensor(),
            OutputTensor=d.tensor(),
        )
    r.dispatch(AND_OV, {"axis": 1.5}, input_1=d.tensor(), input_2=d.tensor(), output_1=d.tensor())
    long = {"auto_broadcast": "n" * 300}
    r.dispatch(AND_OV, long, input_1=d.tensor(), input_2=d.tensor(), output_1=d.tensor())
    # A NumPy integer: the model reads it as the float 1.0 (and the server will refuse it).
    r.dispatch(
        AND_OV, {"axis": np.int64(1)}, input_1=d.tensor(), input_2=d.tensor(), output_1=d.tensor()
    )
    r.dispatch("ÓP", input_1=d.tensor(), input_2=d.tensor(), output_1=d.tensor())
    r.dispatch(AND_OV, {"ünïcode": 1}, input_1=d.tensor(), input_2=d.tensor(), output_1=d.tensor())
    # A description made by hand with a list: valid for the models, not remembered.
    listed = Binding("données", TensorDesc(DataType.UINT8, [16]))  # type: ignore[arg-type]
    r.dispatch(XOR, ATensor=listed, BTensor=listed, OutputTensor=listed)
    return ["données"]


@pytest.mark.parametrize("request_id", [None, "b-1", 'quote " and ✓'])
@pytest.mark.parametrize("build", [_many_small, _every_field, _no_plain_form])
def test_the_header_is_what_the_models_wrote(
    build: Callable[[Recorder], list[str]], request_id: str | None
) -> None:
    with Client("http://t.test") as client:
        r = Recorder(client, request_id)
        sent, expected = r.headers(build(r))
    assert sent == expected


def test_small_remembered_tables_still_write_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    # Past their bound the tables of descriptions and their JSON start afresh.
    monkeypatch.setattr(v1_codec, "_JSON_OF_MAX", 2)
    monkeypatch.setattr(_batch, "_DESCRIPTIONS_MAX", 3)
    with Client("http://t.test") as client:
        for _ in range(2):
            r = Recorder(client)
            sent, expected = r.headers(_every_field(r))
            assert sent == expected


# --- errors where the models raised them -------------------------------------------------------
def _errors(exc: ValidationError) -> list[tuple[Any, ...]]:
    return [(e["type"], e["loc"], e["msg"]) for e in exc.errors()]


def _same_error(new: Callable[[], object], old: Callable[[], object]) -> ValidationError:
    with pytest.raises(ValidationError) as got:
        new()
    with pytest.raises(ValidationError) as want:
        old()
    assert _errors(got.value) == _errors(want.value)
    return got.value


def test_values_the_models_refuse_are_refused_by_dispatch() -> None:
    with Client("http://t.test") as client:
        batch = client.batch()
        buf = batch.input("a", np.zeros(64, np.uint8))
        plain = buf.tensor("UINT8", (16,), total_size=16)
        batch.bit_not(plain, in_place=True)  # their JSON is now remembered...
        one = Binding("a", TensorDesc(DataType.UINT8, (1,)))
        batch.bit_not(one, in_place=True)
        cases: list[tuple[Binding, str]] = [
            # ... yet equal values of other types are still the models' to judge.
            (buf.tensor("UINT8", (16,), total_size=np.int64(16)), "total_size"),  # type: ignore[arg-type]
            (Binding("a", TensorDesc(DataType.UINT8, (True,))), "sizes"),
            (Binding("a", TensorDesc(DataType.UINT8, (16,), alignment=False)), "alignment"),
            (buf.tensor("UINT8", (16,), offset=np.int64(16)), "offset"),  # type: ignore[arg-type]
            (buf.tensor("UINT8", (16,), size=16.0), "size"),  # type: ignore[arg-type]
            (Binding("a", TensorDesc("uint8", (16,))), "datatype"),  # type: ignore[arg-type]
        ]
        for binding, field in cases:
            exc = _same_error(partial(batch.bit_not, binding, in_place=True), binding.to_wire)
            assert field in exc.errors()[0]["loc"]

        x = buf.tensor("UINT8", (16,))
        bindings = {"input_1": x, "input_2": x, "output_1": x}
        wire = {name: b.to_wire() for name, b in bindings.items()}
        # Parameters of any JSON type, the refused ones too: the models judge them.
        refused: list[tuple[str, dict[str, Any]]] = [
            ("", {}),
            ("O" * 257, {}),
            (AND_OV, {"": 1}),
            (AND_OV, {"p" * 129: 1}),
            (AND_OV, {"axis": None}),
            (AND_OV, {"axis": [1]}),
        ]
        for operator, parameters in refused:
            _same_error(
                partial(batch.dispatch, operator, parameters, **bindings),
                partial(Dispatch, operator=operator, parameters=parameters, bindings=wire),
            )
        _same_error(
            lambda: batch.dispatch(XOR, {}, **{"": x}),
            lambda: Dispatch(operator=XOR, bindings={"": x.to_wire()}),
        )


def test_an_id_the_models_refuse_is_refused_by_plan() -> None:
    with Client("http://t.test") as client:
        batch = client.batch("i" * 257)
        batch.bit_not(batch.input("a", np.zeros(4, np.uint8)))
        with pytest.raises(ValidationError) as info:
            batch.plan()
    assert info.value.errors()[0]["loc"] == ("id",)


def test_a_string_json_cannot_hold_fails_in_plan_as_before() -> None:
    # A lone surrogate is a valid str, so dispatch takes it; writing it out fails.
    with Client("http://t.test") as client:
        batch = client.batch()
        a = batch.input("a", np.zeros(4, np.uint8))
        batch.dispatch(
            AND_OV,
            {"auto_broadcast": "\ud800"},
            input_1=a.tensor(),
            input_2=a.tensor(),
            output_1=a.tensor(),
        )
        batch.output(a)
        with pytest.raises(PydanticSerializationError):
            batch.plan()
