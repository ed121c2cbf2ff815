"""The builder of a /v1 batch: named buffers, dispatches binding DML tensor descriptions into
them, and the buffers to bring back, sent as one request.

Only the inputs cross the network on the way in and only the outputs on the way back: every
intermediate buffer lives on the server for the duration of the batch. ``Buffer.tensor`` gives the
full DirectML binding model (data type, sizes, strides in elements with 0 to broadcast, byte
offset, TotalTensorSizeInBytes, alignment); ``Batch.bit_xor`` and friends bind packed tensors and
allocate the output for the common case in one line.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Generic, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from tensorbits_client._codec import Body, Framed, raw_bytes, wire_array
from tensorbits_client._families import DML, CountType, FeatureLevel, MethodOwner, method_shape
from tensorbits_client._types import NOT_GIVEN, Array, NotGiven, ParameterValue, TimeoutTypes
from tensorbits_protocol.dml import TensorDesc
from tensorbits_protocol.dtypes import DataType, from_numpy, itemsize, numpy_dtype, parse_datatype
from tensorbits_protocol.operators import OperatorSpec
from tensorbits_protocol.v1 import BindingGraph, BufferBinding, BufferDeclaration, Dispatch
from tensorbits_protocol.v1_codec import buffer_binding, encode_dispatch, encode_header

R = TypeVar("R")
DataTypeLike = DataType | str | np.dtype[Any] | type[np.generic]
_DML = "DML_OPERATOR_ELEMENT_WISE_"  # the rest of the name, lowercased, names an output made


# Shapes of Batch's DML methods (see _families.method_shape): ``Batch.bit_xor`` and friends.
@method_shape
def _dml_binary(
    op: OperatorSpec,
    batch: Batch[Any],
    a: Buffer | Binding,
    b: Buffer | Binding,
    *,
    out: Buffer | Binding | str | None = None,
    in_place: bool = False,
    feature_level: FeatureLevel = "6_4",
) -> Binding:
    """Dispatched on two packed tensors; returns the output: a new buffer by default, ``out``
    names or binds one, ``in_place`` overwrites ``a``."""
    return batch._dml(op, (a, b), {"feature_level": feature_level}, out, in_place)


@method_shape
def _dml_unary(
    op: OperatorSpec,
    batch: Batch[Any],
    x: Buffer | Binding,
    *,
    out: Buffer | Binding | str | None = None,
    in_place: bool = False,
    feature_level: FeatureLevel = "6_4",
) -> Binding:
    """Dispatched on a packed tensor; returns the output: a new buffer by default, ``out`` names
    or binds one, ``in_place`` overwrites ``x``."""
    return batch._dml(op, (x,), {"feature_level": feature_level}, out, in_place)


@method_shape
def _dml_count(
    op: OperatorSpec,
    batch: Batch[Any],
    x: Buffer | Binding,
    *,
    output_datatype: CountType = "UINT8",
    out: Buffer | Binding | str | None = None,
    feature_level: FeatureLevel = "6_4",
) -> Binding:
    """Dispatched into a new ``output_datatype`` tensor (or ``out``)."""
    params: dict[str, ParameterValue] = {
        "feature_level": feature_level,
        "output_datatype": output_datatype,
    }
    return batch._dml(op, (x,), params, out, False, DataType(output_datatype))


def as_datatype(value: DataTypeLike) -> DataType:
    """A wire data type from its v2 or DirectML name, or from a NumPy dtype."""
    if isinstance(value, str):
        return _parsed_datatype(value)
    return from_numpy(np.dtype(value))


@lru_cache(maxsize=64)  # a batch names the same data type for each of its tensors
def _parsed_datatype(name: str) -> DataType:
    parsed = parse_datatype(name)
    if parsed is None:
        raise ValueError(f"unknown data type {name!r}")
    return parsed


def _graph_tensor(name: str, datatype: DataType, shape: Sequence[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype.value, "shape": list(shape), "buffer": name}


def _round4(nbytes: int) -> int:
    # DirectML sizes buffers in multiples of 4 bytes (TotalTensorSizeInBytes is rounded up to 4).
    return -(-nbytes // 4) * 4


@dataclass(frozen=True, slots=True)
class Binding:
    """A DML buffer tensor: a description bound at a byte offset of one of the batch's buffers."""

    buffer: str
    desc: TensorDesc
    offset: int = 0
    size: int | None = None

    def to_wire(self) -> BufferBinding:
        return buffer_binding(self)


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named buffer of a batch; ``datatype`` and ``shape`` are the default view of its bytes."""

    name: str
    nbytes: int
    datatype: DataType | None = None
    shape: tuple[int, ...] | None = None

    def tensor(
        self,
        datatype: DataTypeLike | None = None,
        sizes: Sequence[int] | None = None,
        *,
        strides: Sequence[int] | None = None,
        offset: int = 0,
        total_size: int | None = None,
        alignment: int = 0,
        size: int | None = None,
    ) -> Binding:
        """Bind a DML tensor description at byte ``offset`` of this buffer.

        ``strides`` are in elements (0 broadcasts a dimension; None: packed row-major).
        ``datatype`` and ``sizes`` default to the buffer's own; a buffer viewed as another data
        type defaults to all its elements from ``offset`` on.
        """
        dt = as_datatype(datatype) if datatype is not None else self.datatype
        if dt is None:
            raise ValueError(f"buffer {self.name!r} has no data type: pass datatype=")
        if sizes is None:
            if dt == self.datatype and self.shape is not None and offset == 0:
                sizes = self.shape or (1,)  # DML tensors have rank 1 to 8
            else:
                sizes = ((self.nbytes - offset) // itemsize(dt),)
        desc = _description(
            dt,
            tuple(map(int, sizes)),
            None if strides is None else tuple(map(int, strides)),
            total_size,
            alignment,
        )
        return Binding(self.name, desc, offset=offset, size=size)


# One TensorDesc per distinct description made by ``Buffer.tensor``, so that its JSON is found by
# identity when a batch binds the same description at many offsets (``v1_codec.desc_json``).
# Only plain values are keys: NumPy's 64 == 64 would otherwise share an entry with a plain 64.
_DESCRIPTIONS: dict[tuple[object, ...], TensorDesc] = {}
_DESCRIPTIONS_MAX = 4096
_OPTIONAL_INT = frozenset({int, type(None)})


def _description(
    datatype: DataType,
    sizes: tuple[int, ...],
    strides: tuple[int, ...] | None,
    total_size: int | None,
    alignment: int,
) -> TensorDesc:
    if (
        type(datatype) is not DataType
        or type(total_size) not in _OPTIONAL_INT
        or type(alignment) is not int
    ):
        return TensorDesc(datatype, sizes, strides, total_size, alignment)
    key = (datatype, sizes, strides, total_size, alignment)
    desc = _DESCRIPTIONS.get(key)
    if desc is None:
        if len(_DESCRIPTIONS) >= _DESCRIPTIONS_MAX:
            _DESCRIPTIONS.clear()
        desc = _DESCRIPTIONS[key] = TensorDesc(datatype, sizes, strides, total_size, alignment)
    return desc


@dataclass(frozen=True, slots=True)
class _OutputView:
    """How to view one returned buffer: a typed (possibly strided) window of its bytes."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int = 0
    byte_strides: tuple[int, ...] | None = None

    def of(self, body: Body, start: int) -> Array:
        if self.byte_strides is None:
            return body.view(start + self.offset, self.dtype, self.shape)
        return np.ndarray(
            self.shape,
            dtype=self.dtype,
            buffer=body.buffer,
            offset=start + self.offset,
            strides=self.byte_strides,
        )


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """A batch ready to send: its body, and how to view each buffer that comes back."""

    body: Framed
    views: Mapping[str, _OutputView]

    def results(self, body: Body, starts: Mapping[str, int]) -> dict[str, Array]:
        missing = set(self.views) - set(starts)
        if missing:
            raise ValueError(f"batch response lacks outputs {sorted(missing)}")
        return {name: view.of(body, starts[name]) for name, view in self.views.items()}


BatchRunner = Callable[[PreparedBatch, TimeoutTypes | NotGiven], R]


class Batch(MethodOwner[Binding], Generic[R]):
    """Builds one ``POST /v1/batch`` request; ``run()`` sends it and returns the outputs.

    Get one from ``client.batch()``. For ``Client`` ``run()`` returns ``dict[str, ndarray]``;
    for ``AsyncClient`` it returns an awaitable of it.
    """

    def __init__(self, runner: BatchRunner[R], request_id: str | None = None) -> None:
        self._runner = runner
        self.request_id = request_id
        self._buffers: dict[str, Buffer] = {}
        self._declarations: list[BufferDeclaration] = []
        self._data: list[memoryview] = []
        self._dispatches: list[str | Dispatch] = []
        self._outputs: dict[str, _OutputView] = {}
        self._last_output: Binding | None = None
        self._counter = itertools.count()

    # --- buffers --------------------------------------------------------------------------------
    def _declare(self, buffer: Buffer, *, zeros: bool) -> Buffer:
        if buffer.name in self._buffers:
            raise ValueError(f"batch already has a buffer named {buffer.name!r}")
        self._buffers[buffer.name] = buffer
        init: Literal["zeros"] | None = "zeros" if zeros else None
        declaration = BufferDeclaration(name=buffer.name, byte_size=buffer.nbytes, init=init)
        self._declarations.append(declaration)
        return buffer

    def _auto_name(self, stem: str) -> str:
        while (name := f"{stem}{next(self._counter)}") in self._buffers:
            pass
        return name

    def input(self, name: str, array: npt.ArrayLike) -> Buffer:
        """A buffer holding ``array``'s bytes (sent with the request), typed as the array.

        The buffer is padded with zeros to a multiple of 4 bytes, as DirectML sizes buffers."""
        data = wire_array(np.asarray(array))
        raw = raw_bytes(data)
        buffer = Buffer(name, _round4(len(raw)), from_numpy(data.dtype), tuple(data.shape))
        self._declare(buffer, zeros=False)
        self._data.append(raw)
        if buffer.nbytes != len(raw):
            self._data.append(memoryview(bytes(buffer.nbytes - len(raw))))
        return buffer

    def buffer(self, name: str, nbytes: int) -> Buffer:
        """A zero-filled buffer of ``nbytes`` allocated on the server (nothing is sent)."""
        if nbytes < 0:
            raise ValueError(f"buffer {name!r}: nbytes must be at least 0, got {nbytes}")
        return self._declare(Buffer(name, nbytes), zeros=True)

    def empty(self, name: str | None, shape: Sequence[int], datatype: DataTypeLike) -> Buffer:
        """A zero-filled server buffer sized and typed for one packed tensor of ``shape``."""
        dt = as_datatype(datatype)
        dims = tuple(int(s) for s in shape)
        nbytes = _round4(math.prod(dims) * itemsize(dt))
        buffer = Buffer(name or self._auto_name("buffer"), nbytes, dt, dims)
        return self._declare(buffer, zeros=True)

    # --- dispatches -----------------------------------------------------------------------------
    def dispatch(
        self,
        operator: str,
        /,
        parameters: Mapping[str, ParameterValue] | None = None,
        **bindings: Binding,
    ) -> None:
        """Run ``operator`` with every tensor bound by name (``ATensor=...``, ``OutputTensor=...``).

        Dispatches run in the order they are added; an output may be bound to exactly an input's
        range and description (in place)."""
        self._add(operator, parameters or {}, bindings)

    def _add(
        self,
        operator: str,
        parameters: Mapping[str, ParameterValue],
        bindings: Mapping[str, Binding],
    ) -> None:
        for binding in bindings.values():
            if binding.buffer not in self._buffers:
                raise ValueError(f"{operator}: no buffer named {binding.buffer!r} in this batch")
        self._dispatches.append(encode_dispatch(operator, parameters, bindings))
        output = bindings.get("OutputTensor")
        if output is not None:
            self._last_output = output

    def _output_binding(
        self,
        first: Binding,
        datatype: DataType,
        out: Buffer | Binding | str | None,
        in_place: bool,
        suffix: str,
    ) -> Binding:
        if in_place:
            if out is not None:
                raise ValueError("pass either out= or in_place=True, not both")
            return first
        if isinstance(out, Binding):
            return out
        if isinstance(out, Buffer):
            return out.tensor(datatype, first.desc.sizes)
        name = out or self._auto_name(suffix.lower())
        return self.empty(name, first.desc.sizes, datatype).tensor()

    def _dml(
        self,
        op: OperatorSpec,
        inputs: Sequence[Buffer | Binding],
        parameters: dict[str, ParameterValue],
        out: Buffer | Binding | str | None,
        in_place: bool,
        output_datatype: DataType | None = None,
    ) -> Binding:
        tensors: dict[str, Binding] = {}  # the inputs by the table's names, then the output
        for name, x in zip(op.inputs, inputs, strict=True):
            tensors[name] = x.tensor() if isinstance(x, Buffer) else x
        first = tensors[op.inputs[0]]
        datatype = output_datatype or first.desc.datatype
        suffix = op.name.removeprefix(_DML)
        output = tensors[op.output] = self._output_binding(first, datatype, out, in_place, suffix)
        self._add(op.name, parameters, tensors)
        return output

    # Each dispatches the operator that the DML family's method of the same name calls.
    bit_and = _dml_binary(DML.bit_and.spec)
    bit_or = _dml_binary(DML.bit_or.spec)
    bit_xor = _dml_binary(DML.bit_xor.spec)
    bit_not = _dml_unary(DML.bit_not.spec)
    bit_count = _dml_count(DML.bit_count.spec)
    bit_shift_left = _dml_binary(DML.bit_shift_left.spec)
    bit_shift_right = _dml_binary(DML.bit_shift_right.spec)

    # --- outputs and running --------------------------------------------------------------------
    def output(
        self,
        target: Buffer | Binding | str,
        datatype: DataTypeLike | None = None,
        shape: Sequence[int] | None = None,
    ) -> None:
        """Return this buffer's bytes, viewed as ``datatype``/``shape`` (default: the binding's
        description, else the buffer's own type and shape, else raw UINT8). Results are keyed by
        buffer name."""
        if isinstance(target, Binding):
            name = target.buffer
        elif isinstance(target, Buffer):
            name = target.name
        else:
            name = target
        if name not in self._buffers:
            raise ValueError(f"no buffer named {name!r} in this batch")
        buffer = self._buffers[name]
        self._outputs[name] = self._view(buffer, target, datatype, shape)

    @staticmethod
    def _view(
        buffer: Buffer,
        target: Buffer | Binding | str,
        datatype: DataTypeLike | None,
        shape: Sequence[int] | None,
    ) -> _OutputView:
        if datatype is not None or shape is not None:
            dt = as_datatype(datatype) if datatype is not None else buffer.datatype
            dtype = numpy_dtype(dt) if dt is not None else np.dtype(np.uint8)
            dims = tuple(shape) if shape is not None else (buffer.nbytes // dtype.itemsize,)
            offset = target.offset if isinstance(target, Binding) else 0
            return _OutputView(dtype, dims, offset)
        if isinstance(target, Binding):
            desc = target.desc
            dtype = numpy_dtype(desc.datatype)
            strides = None
            if desc.strides is not None and desc.strides != desc.packed_strides():
                strides = tuple(s * dtype.itemsize for s in desc.strides)
            return _OutputView(dtype, desc.sizes, target.offset, strides)
        if buffer.datatype is not None and buffer.shape is not None:
            return _OutputView(numpy_dtype(buffer.datatype), buffer.shape)
        return _OutputView(np.dtype(np.uint8), (buffer.nbytes,))

    def _views(self) -> dict[str, _OutputView]:
        views = dict(self._outputs)
        if not views and self._last_output is not None:
            last = self._last_output
            views[last.buffer] = self._view(self._buffers[last.buffer], last, None, None)
        if not views:
            raise ValueError("nothing to return: name a buffer with batch.output(...)")
        return views

    def plan(self) -> PreparedBatch:
        """The request body and the output views (what ``run`` sends)."""
        views = self._views()
        header = encode_header(self.request_id, self._declarations, self._dispatches, list(views))
        return PreparedBatch(Framed.framed(header, self._data), views)

    def graph(self) -> BindingGraph:
        """This batch as a graph model in the binding model (``client.load_graph``): its buffers
        and dispatches, each buffer given by ``input`` a model input of that name (the array's
        type and shape; its values are not kept), each buffer returned a model output of that
        name (its whole bytes, packed: not a strided or offset view)."""
        views = self._views()
        header = json.loads(encode_header(None, self._declarations, self._dispatches, []))
        inputs = []
        for declaration in self._declarations:
            if declaration.init is not None:
                continue
            buffer = self._buffers[declaration.name]
            assert buffer.datatype is not None  # input() types it
            assert buffer.shape is not None
            inputs.append(_graph_tensor(buffer.name, buffer.datatype, buffer.shape))
        outputs = []
        for name, view in views.items():
            if view.offset or view.byte_strides is not None:
                raise ValueError(
                    f"output {name!r}: a graph model's output is a whole buffer, packed; this "
                    "one is a view at an offset or with strides"
                )
            outputs.append(_graph_tensor(name, from_numpy(view.dtype), view.shape))
        return BindingGraph.model_validate(
            {
                "inputs": inputs,
                "outputs": outputs,
                "buffers": header["buffers"],
                "dispatches": header["dispatches"],
            }
        )

    def run(self, *, timeout: TimeoutTypes | NotGiven = NOT_GIVEN) -> R:
        """Send the batch; the outputs come back as arrays keyed by buffer name. Without any
        ``output(...)``, the last dispatch's output is returned."""
        return self._runner(self.plan(), timeout)
