"""The native batch planner (POST /v1/batch): check the whole batch before anything runs.

``plan_batch`` checks every rule first, so a bad dispatch 7 never leaves dispatches 0-6 half
done: buffer declarations against the body, every binding against its buffer (``dml.layout_of``
and ``dml.check_placement`` prove each strided view lies inside its bound range), every dispatch
against its operator's rule tables (``validate_call``), outputs for self-overlap and for aliasing
an input. Each error names its field path in the header, e.g.
``dispatches[2].bindings.BTensor.desc.strides``. ``plan_rest`` is the REST entry: it decodes the
header (``v1_codec.decode_request``) and remembers the plans of repeated headers
(``header_cache.py``), as ``inference.plan_rest`` does for v2.

``run_batch`` then runs the plan: the buffers on the backend's device (the data buffers
zero-copy on NumPy), the dispatches in order as strided views over them (a later dispatch reads
what an earlier one wrote), only the output buffers copied to the host, into the response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.backends.placement import Residence, Work, WorkKind, placed
from tensorbits.core.header_cache import HeaderCache
from tensorbits.core.kernels import DeviceArray
from tensorbits.core.limits import CoreLimits
from tensorbits_protocol import codec
from tensorbits_protocol.dml import DescLayout, TensorDesc, ViewLayout, check_placement, layout_of
from tensorbits_protocol.dtypes import DataType, numpy_dtype, parse_datatype
from tensorbits_protocol.errors import InvalidRequest, OperatorNotFound, PayloadTooLarge
from tensorbits_protocol.jsondata import JsonLimits, MemberLimit, check_length
from tensorbits_protocol.operators import OPERATORS, OperatorSpec, did_you_mean, get_operator
from tensorbits_protocol.parameters import MAX_OBJECT_KEYS, MAX_PARAMETERS
from tensorbits_protocol.plain import PlainDict
from tensorbits_protocol.v1_codec import decode_request, encode_response
from tensorbits_protocol.validation import (
    ResolvedCall,
    TensorSpec,
    validate_call,
    validate_output,
)


# The header is read by ``v1_codec.decode_request`` into plain dicts (``PlainDict``) of
# ``v1.BatchRequest``'s schema: ``BatchRequest``, ``Dispatch``, ``BufferBinding``,
# ``TensorDescription`` and ``BufferDeclaration`` field for field, defaults filled in.
# --- the plan -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BufferPlan:
    name: str
    byte_size: int
    body_offset: int | None  # where its bytes start in the request body; None: zero-filled


class BoundTensor(NamedTuple):
    """A tensor bound to [offset, offset + size) of a buffer, proven inside it.

    Two bindings are equal exactly when they are the same range of the same buffer read through
    the same layout and data type: the in-place condition. (A NamedTuple rather than a frozen
    dataclass: a batch makes one per binding, and this one is built in a third of the time.)"""

    buffer: int
    offset: int
    size: int
    desc: DescLayout

    @property
    def datatype(self) -> DataType:
        return self.desc.datatype

    @property
    def layout(self) -> ViewLayout:
        desc = self.desc
        return ViewLayout(self.offset, desc.shape, desc.byte_strides, desc.total_size)

    @property
    def end(self) -> int:
        return self.offset + self.size

    def overlaps(self, other: BoundTensor) -> bool:
        return self.buffer == other.buffer and self.offset < other.end and other.offset < self.end


class DispatchPlan(NamedTuple):  # one per dispatch: a NamedTuple is built fastest
    call: ResolvedCall
    inputs: tuple[BoundTensor, ...]  # in the operator's input order
    output: BoundTensor


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """A checked batch, ready to run (``run_batch``), with its response's JSON header."""

    id: str | None
    buffers: tuple[BufferPlan, ...]
    dispatches: tuple[DispatchPlan, ...]
    outputs: tuple[int, ...]  # buffer indices, in response order
    body_bytes: int
    response: codec.BodyLayout  # the response's header and output sizes (no bytes of the body)

    @property
    def data_bytes(self) -> int:
        return sum(b.byte_size for b in self.buffers if b.body_offset is not None)

    @property
    def temporary_bytes(self) -> int:
        return sum(b.byte_size for b in self.buffers if b.body_offset is None)

    @property
    def output_bytes(self) -> int:
        return sum(self.buffers[i].byte_size for i in self.outputs)

    def memory_needed(self, *, device_copies: bool) -> int:
        """Bytes this batch holds while it runs: the body, the zero-filled buffers, the response,
        and the data buffers again where the backend copies them to a device."""
        copies = self.data_bytes if device_copies else 0
        return self.body_bytes + self.temporary_bytes + self.response.total + copies


# --- error placement ----------------------------------------------------------------------------
# The shared validators name a tensor ("BTensor") and a field ("BTensor.strides") or a rule; in a
# batch the same error belongs at a path of the header. Where each of their fields lives:
_FIELD_OF_ATTRIBUTE = {
    "sizes": "desc.sizes",
    "strides": "desc.strides",
    "total_size": "desc.total_size",
    "alignment": "desc.alignment",
    "offset": "offset",
}
# ... and where an error without an attribute (from validate_call) points, by its rule.
_FIELD_OF_RULE = {
    "datatype": "desc.datatype",
    "mixed_datatype": "desc.datatype",
    "output_datatype": "desc.datatype",
    "rank": "desc.sizes",
    "shape": "desc.sizes",
    "empty": "desc.sizes",
    "broadcast": "desc.sizes",
    "output_shape": "desc.sizes",
}


def _relocated(exc: InvalidRequest, at: str) -> InvalidRequest:
    """The same error re-anchored under ``at`` (``dispatches[i]``), message and field alike."""
    field = exc.field or ""
    if field.startswith("parameters."):
        head, path = field, f"{at}.{field}"
    else:
        tensor, _, attribute = field.partition(".")
        where = _FIELD_OF_ATTRIBUTE.get(attribute) if attribute else None
        where = where or _FIELD_OF_RULE.get(exc.rule or "")
        head = tensor
        path = f"{at}.bindings.{tensor}" + (f".{where}" if where else "")
    text = exc.message.removeprefix(f"{head}: ")
    return InvalidRequest(f"{path}: {text}", field=path, rule=exc.rule)


def _invalid(path: str, text: str, rule: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {text}", field=path, rule=rule)


def listed(names: Sequence[str], most: int = 20) -> str:
    shown = ", ".join(names[:most])
    return f"{shown}, … ({len(names)} in all)" if len(names) > most else shown or "none"


# --- planning: buffers --------------------------------------------------------------------------
# Values a valid header's dispatch can hold, per binding and besides them: members, elements
# of Sizes and Strides (at most 8 each), with room to spare. They bound the header's JSON values.
_VALUES_PER_BINDING = 32
_VALUES_PER_DISPATCH = 8 + max(len(op.parameters) for op in OPERATORS)
_BINDINGS_PER_DISPATCH = max(len(op.inputs) + 1 for op in OPERATORS)
_VALUES_PER_BUFFER = 4
# A header of fewer raw commas and brackets than this (about 400 small dispatches) has its counts
# checked once parsed, not on its bytes: counting them on the bytes would add a third to its
# decoding, and what the parser builds for it is a few hundred kilobytes at most. (Its depth and
# values are judged on the bytes first, as every JSON document's are: jsondata.check_structure.)
MEMBERS_PARSED_BELOW = 8192


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The limits that one batch is held to, built once a runtime (as v2's
    ``RequestLimits``): the header's JSON bounds, checked on its bytes before it is parsed and
    again, exactly, on what was parsed (the count limits, the header's length, and as many JSON
    values as the largest header those limits allow); the zero-filled bytes; the elements of a
    tensor."""

    header: JsonLimits
    max_temporary_bytes: int
    max_tensor_elements: int

    @classmethod
    def of(cls, limits: CoreLimits) -> BatchLimits:
        members = (
            MemberLimit(
                ("buffers",),
                limits.max_buffers,
                "TENSORBITS_MAX_BUFFERS",
                "max_buffers",
                "buffers",
            ),
            MemberLimit(
                ("dispatches",),
                limits.max_dispatches,
                "TENSORBITS_MAX_DISPATCHES",
                "max_dispatches",
                "dispatches",
            ),
            # Each output names a declared buffer: no more of them than buffers.
            MemberLimit(
                ("outputs",),
                limits.max_buffers,
                "TENSORBITS_MAX_BUFFERS",
                "max_buffers",
                "outputs",
            ),
        )
        per_dispatch = _VALUES_PER_DISPATCH + _BINDINGS_PER_DISPATCH * _VALUES_PER_BINDING
        values = per_dispatch * limits.max_dispatches + 2 * _VALUES_PER_BUFFER * limits.max_buffers
        header = JsonLimits(
            max_depth=limits.max_json_depth,
            max_values=values + 16,
            max_bytes=limits.max_batch_header_bytes,
            bytes_setting="TENSORBITS_MAX_BATCH_HEADER_BYTES",
            members=members,
            members_parsed_below=MEMBERS_PARSED_BELOW,
            # No object of a batch header (a dispatch, its bindings, a descriptor, a parameter
            # map) has more keys than a v2 request's: one bound on one object's keys, both APIs.
            max_object_keys=MAX_OBJECT_KEYS,
            keys_words=f"{MAX_PARAMETERS} parameters per map",
        )
        # Zero-filled buffers cost no body bytes, so they get the body's limit of their own.
        return cls(header, limits.max_body_bytes, limits.max_tensor_elements)


def _plan_buffers(
    declarations: Sequence[PlainDict], data_start: int, body_length: int, limit: int
) -> tuple[BufferPlan, ...]:
    """Buffers with their place in the body (``codec.spans``), checked against it the way Triton
    checks inputs: each data buffer must find all its bytes, and no byte may be left over."""
    places = codec.spans(
        (None if decl["init"] is not None else decl["byte_size"] for decl in declarations),
        data_start,
    )
    first_seen: dict[str, int] = {}
    plans: list[BufferPlan] = []
    for i, (decl, place) in enumerate(zip(declarations, places, strict=True)):
        name, byte_size = decl["name"], decl["byte_size"]
        if name in first_seen:
            raise _invalid(
                f"buffers[{i}].name",
                f"duplicate buffer name '{name}' (first declared at buffers[{first_seen[name]}])",
                "duplicate_buffer",
            )
        first_seen[name] = i
        if place is not None and place[1] > body_length:
            raise _invalid(
                f"buffers[{i}].byte_size",
                f"unexpected size for buffer '{name}', expecting {byte_size} "
                f"additional bytes but the body has {body_length - place[0]} left",
                "body_short",
            )
        plans.append(BufferPlan(name, byte_size, None if place is None else place[0]))
    position = codec.end_of(places, data_start)
    if position != body_length:
        raise _invalid(
            "body",
            f"unexpected additional input data: {body_length - position} bytes follow the last "
            f"data buffer (the buffers declare {position - data_start} bytes)",
            "body_leftover",
        )
    temporary = sum(p.byte_size for p in plans if p.body_offset is None)
    if temporary > limit:
        # Zero-filled buffers cost no body bytes, so they get the body's limit of their own:
        # a small request must not make the server allocate without bound.
        raise PayloadTooLarge(
            f"buffers: {temporary} bytes of zero-filled buffers, more than the limit of {limit} "
            "(TENSORBITS_MAX_BODY_BYTES)",
            field="buffers",
            rule="max_temporary_bytes",
        )
    return tuple(plans)


def _plan_outputs(outputs: Sequence[str], index: Mapping[str, int]) -> tuple[int, ...]:
    first_seen: dict[str, int] = {}
    for j, name in enumerate(outputs):
        if name not in index:
            raise _invalid(
                f"outputs[{j}]",
                f"no buffer named '{name}' (declared: {listed(list(index))})",
                "unknown_buffer",
            )
        if name in first_seen:
            raise _invalid(
                f"outputs[{j}]",
                f"buffer '{name}' is already listed at outputs[{first_seen[name]}]",
                "duplicate_output",
            )
        first_seen[name] = j
    return tuple(index[name] for name in outputs)


# --- planning: bindings -------------------------------------------------------------------------
# A description as the header writes it: (datatype, sizes, strides, total_size, alignment). The
# wire model has read every one of these strictly, so equal keys are equal descriptions.
DescKey = tuple[str, tuple[int, ...], tuple[int, ...] | None, int | None, int]
# What decides a dispatch's checks beyond its bindings' offsets and sizes: the operator, its
# parameters (each value with its type: 1, 1.0 and True compare equal but are not the same
# parameter) and the description bound to each tensor, in the operator's order (as the id of its
# DescLayout).
Signature = tuple[object, ...]


def _desc_key(desc: PlainDict) -> DescKey:
    strides = desc["strides"]
    return (
        desc["datatype"],
        tuple(desc["sizes"]),
        None if strides is None else tuple(strides),
        desc["total_size"],
        desc["alignment"],
    )


class _Planner:
    """The checks of one batch's dispatches, each rule in the order docs/batch-api.md gives.

    A batch of many small dispatches repeats a few descriptions and a few calls at many offsets,
    so what depends only on a description (``dml.layout_of``) or only on a dispatch's signature
    (the operator's tables, the output layout) is checked once per batch and remembered when it
    passes; what depends on where a tensor is bound is checked for every binding. A failure is
    never remembered: the first one in request order raises, with the message it always had."""

    def __init__(self, buffers: Sequence[BufferPlan], max_elements: int) -> None:
        self.buffers = buffers
        self.index = {b.name: i for i, b in enumerate(buffers)}
        self.labels = [f"buffer '{b.name}'" for b in buffers]  # as errors name them
        self.max_elements = max_elements
        self.layouts: dict[DescKey, DescLayout] = {}
        self.calls: dict[Signature, ResolvedCall] = {}

    def layout(self, at: str, name: str, desc: PlainDict) -> DescLayout:
        key = _desc_key(desc)
        layout = self.layouts.get(key)
        if layout is None:
            datatype = parse_datatype(desc["datatype"])
            assert datatype is not None  # the wire model's Literal admits only names it reads
            tensor_desc = TensorDesc(datatype, key[1], key[2], key[3], key[4])
            try:
                layout = layout_of(name, tensor_desc)
            except InvalidRequest as exc:
                raise _relocated(exc, at) from None
            self.layouts[key] = layout
        return layout

    def bind(self, at: str, name: str, binding: PlainDict) -> BoundTensor:
        buffer_index = self.index.get(binding["buffer"])
        if buffer_index is None:
            raise _invalid(
                f"{at}.bindings.{name}.buffer",
                f"no buffer named '{binding['buffer']}' (declared: {listed(list(self.index))})",
                "unknown_buffer",
            )
        byte_size = self.buffers[buffer_index].byte_size
        layout = self.layout(at, name, binding["desc"])
        offset = binding["offset"]
        total = layout.total_size
        # check_placement's rules, tested inline first: this runs for every binding.
        if offset < 0 or offset % layout.alignment or offset + total > byte_size:
            try:
                check_placement(
                    name, layout, offset, byte_size, buffer_name=self.labels[buffer_index]
                )
            except InvalidRequest as exc:
                raise _relocated(exc, at) from None
        if layout.elements > self.max_elements:
            path = f"{at}.bindings.{name}.desc.sizes"
            raise PayloadTooLarge(
                f"{path}: {layout.elements} elements, more than the limit of "
                f"{self.max_elements} per tensor (TENSORBITS_MAX_TENSOR_ELEMENTS)",
                field=path,
                rule="max_tensor_elements",
            )
        size = binding["size"]
        if size is None:
            size = total
        elif size < total:
            raise _invalid(
                f"{at}.bindings.{name}.size",
                f"bound size {size} is less than the desc's TotalTensorSizeInBytes "
                f"{total} (allowed: at least {total})",
                "binding_size",
            )
        if offset + size > byte_size:
            raise _invalid(
                f"{at}.bindings.{name}.size",
                f"bound range [{offset}, {offset + size}) reaches past the end of "
                f"{self.labels[buffer_index]} ({byte_size} bytes) (allowed: offset + size "
                f"≤ {byte_size})",
                "buffer_bounds",
            )
        return BoundTensor(buffer_index, offset, size, layout)

    def dispatch(self, at: str, dispatch: PlainDict) -> DispatchPlan:
        op = _operator(at, dispatch["operator"])
        tensors = _check_binding_names(at, op, dispatch)
        bindings = dispatch["bindings"]
        bound = [self.bind(at, name, bindings[name]) for name in tensors]
        parameters = dispatch["parameters"]
        # The layouts stand for their descriptions by identity: one object per description and
        # batch, alive (in self.layouts) as long as this table.
        signature = (
            op.name,
            tuple(parameters.items()),
            tuple(map(type, parameters.values())),
            *[id(tensor.desc) for tensor in bound],
        )
        call = self.calls.get(signature)
        if call is None:
            call = _checked_call(at, op, dict(zip(tensors, bound, strict=True)), parameters)
            self.calls[signature] = call
        inputs, out = tuple(bound[:-1]), bound[-1]
        for tensor in inputs:
            if out.overlaps(tensor):  # rare: only then is it worth naming the tensors
                _check_aliasing(at, op, dict(zip(tensors, bound, strict=True)), self.buffers)
                break
        return DispatchPlan(call, inputs, out)


def _check_distinct_elements(path: str, layout: DescLayout) -> None:
    """Refuse an output layout in which two elements share bytes (stride 0, or strides that
    interleave), since the result of writing both would depend on the order of the writes.

    Sorted by stride, each dimension's stride must reach past everything the smaller ones span.
    That is sufficient for distinct elements, and it admits every packed, padded or permuted
    layout."""
    if layout.packed:
        return  # row-major without gaps: every element at its own place
    width = layout.itemsize
    extent = width
    for stride, size in sorted(
        (stride, size)
        for size, stride in zip(layout.shape, layout.byte_strides, strict=True)
        if size > 1
    ):
        if stride < extent:
            strides = [s // width for s in layout.byte_strides]
            raise _invalid(
                f"{path}.desc.strides",
                f"Strides {strides} with Sizes {list(layout.shape)} map more than one output "
                "element to the same bytes (allowed: every output element at its own place: "
                "stride 0 only where the size is 1, and each stride, smallest first, at least "
                "the span of the dimensions with smaller strides)",
                "output_overlap",
            )
        extent += stride * (size - 1)


def _checked_call(
    at: str, op: OperatorSpec, bound: Mapping[str, BoundTensor], parameters: Mapping[str, object]
) -> ResolvedCall:
    """The operator's tables on the bound descriptions, then the output's own layout."""
    out = bound[op.output].desc
    try:
        call = validate_call(
            op,
            {n: TensorSpec(bound[n].desc.datatype, bound[n].desc.shape) for n in op.inputs},
            parameters,
        )
        validate_output(call, out.datatype, out.shape)
    except InvalidRequest as exc:
        raise _relocated(exc, at) from None
    _check_distinct_elements(f"{at}.bindings.{op.output}", out)
    return call


def _check_aliasing(
    at: str, op: OperatorSpec, bound: Mapping[str, BoundTensor], buffers: Sequence[BufferPlan]
) -> None:
    """An output may share bytes with an input only when the operator computes in place and the
    two bindings are identical (docs/semantics.md rule 8); any partial overlap is refused."""
    out = bound[op.output]
    for name in op.inputs:
        tensor = bound[name]
        if not out.overlaps(tensor) or (name in op.in_place and tensor == out):
            continue
        allowed = (
            f"an output may share bytes only with an input it is computed in place of "
            f"({', '.join(op.in_place)}), bound to the same buffer, offset, size and desc"
            if op.in_place
            else f"{op.name} computes nothing in place"
        )
        raise _invalid(
            f"{at}.bindings.{op.output}",
            f"bound range [{out.offset}, {out.end}) of buffer "
            f"'{buffers[out.buffer].name}' overlaps {name}'s bound range "
            f"[{tensor.offset}, {tensor.end}) ({allowed})",
            "output_aliasing",
        )


def _operator(at: str, name: str) -> OperatorSpec:
    # An unknown operator inside a batch is a 400 at its field, not the 404 of an unknown v2
    # model: /v1/batch exists, and it is this request's content that is wrong.
    try:
        return get_operator(name)
    except OperatorNotFound as exc:
        raise _invalid(f"{at}.operator", exc.message, "unknown_operator") from None


def _check_binding_names(at: str, op: OperatorSpec, dispatch: PlainDict) -> tuple[str, ...]:
    """The operator's tensors, inputs first then the output: exactly the names bound."""
    tensors, names = _tensors(op.name)
    bindings = dispatch["bindings"]
    if bindings.keys() == names:
        return tensors
    for name in bindings:
        if name not in tensors:
            raise _invalid(
                f"{at}.bindings.{name}",
                f"{op.name} has no tensor of that name (tensors: {', '.join(tensors)})"
                f"{did_you_mean(name, tensors)}",
                "unknown_binding",
            )
    for name in tensors:
        if name not in bindings:
            raise _invalid(
                f"{at}.bindings.{name}",
                f"missing binding of {op.name}'s tensor {name} (tensors: {', '.join(tensors)})",
                "missing_binding",
            )
    return tensors


@cache  # one entry per operator of the registry (the only operators a batch can name)
def _tensors(name: str) -> tuple[tuple[str, ...], frozenset[str]]:
    op = get_operator(name)
    tensors = (*op.inputs, op.output)
    return tensors, frozenset(tensors)


def plan_batch(
    request: PlainDict, *, data_start: int, body_length: int, limits: BatchLimits
) -> BatchPlan:
    """Check the whole batch; the plan it returns can run without another check. ``request``
    is a decoded header (``v1_codec.decode_request``: its counts already checked)."""
    buffers = _plan_buffers(request["buffers"], data_start, body_length, limits.max_temporary_bytes)
    planner = _Planner(buffers, limits.max_tensor_elements)
    dispatches = tuple(
        planner.dispatch(f"dispatches[{i}]", d) for i, d in enumerate(request["dispatches"])
    )
    outputs = _plan_outputs(request["outputs"], planner.index)
    return BatchPlan(
        id=request["id"],
        buffers=buffers,
        dispatches=dispatches,
        outputs=outputs,
        body_bytes=body_length,
        response=encode_response(
            request["id"], [(buffers[i].name, buffers[i].byte_size) for i in outputs]
        ),
    )


def plan_rest(
    body: bytearray,
    header_length: int | None,
    limits: BatchLimits,
    cache: HeaderCache[BatchPlan] | None = None,
) -> BatchPlan:
    """Decode and plan one REST batch; with a ``cache``, a header planned before (for a body of
    this length) is not decoded and checked again (header_cache.py): a plan holds no byte of
    the body."""
    head = codec.split_body(memoryview(body), header_length)[0]
    check_length(len(head), limits.header, "header")  # before the header is copied
    header = bytes(head)
    key = (header, len(body))
    if cache is not None and cache.keeps(header):
        remembered = cache.get(key)
        if remembered is not None:
            return remembered
    plan = plan_batch(
        decode_request(header, limits.header),
        data_start=len(header),
        body_length=len(body),
        limits=limits,
    )
    if cache is not None:
        cache.put(key, plan, len(header))
    return plan


# --- running a plan -------------------------------------------------------------------------------
_UINT8 = np.dtype(np.uint8)


def _place(backend: Backend, body: bytearray, buffer: BufferPlan) -> DeviceArray:
    """The buffer as a flat uint8 array on the device. On NumPy a data buffer is the body's own
    memory (the body is a writable bytearray, so outputs may be written into it in place)."""
    if buffer.body_offset is None:
        return zeroed(backend, buffer.byte_size)
    host = np.frombuffer(body, dtype=_UINT8, count=buffer.byte_size, offset=buffer.body_offset)
    return backend.asarray(host)


def zeroed(backend: Backend, nbytes: int) -> DeviceArray:
    """``nbytes`` zero bytes on the backend's device (zeros: the bytes no output covers go back
    to the client too). ``xp.zeros`` would allocate on the calling thread's current device,
    device 0 on a worker thread whatever the backend's; ``empty`` allocates on the backend's,
    and the fill runs under the array's own device (a CuPy array's ``device`` is its context)."""
    if backend.host_memory:
        return np.zeros(nbytes, dtype=_UINT8)
    array = backend.empty((nbytes,), _UINT8)
    with array.device:
        array.fill(0)  # CuPy: a memset on that device's current stream
    return array


class _Views:
    """The arrays a batch's dispatches work on, as views of the placed buffers.

    A packed tensor (``DescLayout.packed``, the common case) is a slice of its buffer viewed as
    its data type, reshaped: a few hundred nanoseconds, and the typed view of each buffer is made
    once per data type. Any other layout goes through ``as_strided``, ten times slower. Both stay
    within the bytes [offset, offset + total size) that the planner proved hold every element
    (``dml.layout_of`` and ``dml.check_placement``), so neither
    reads or writes outside the bound range: the unchecked ``as_strided`` included."""

    def __init__(self, xp: Any, buffers: Sequence[DeviceArray]) -> None:
        self.xp = xp
        self.buffers = buffers
        self.typed: dict[tuple[int, DataType], DeviceArray] = {}

    def of(self, tensor: BoundTensor) -> DeviceArray:
        desc = tensor.desc
        if not desc.packed:
            return self.strided(tensor)
        typed = self.typed.get((tensor.buffer, desc.datatype))
        if typed is None:
            typed = self.typed_buffer(tensor.buffer, desc.datatype)
        start = tensor.offset // desc.itemsize  # offsets are multiples of 16: whole elements
        flat = typed[start : start + desc.elements]
        return flat if len(desc.shape) == 1 else flat.reshape(desc.shape)

    def typed_buffer(self, index: int, datatype: DataType) -> DeviceArray:
        dtype = numpy_dtype(datatype)
        buffer = self.buffers[index]
        whole = buffer.shape[0] // dtype.itemsize * dtype.itemsize
        typed = buffer[:whole].view(dtype)
        self.typed[(index, datatype)] = typed
        return typed

    def strided(self, tensor: BoundTensor) -> DeviceArray:
        desc = tensor.desc
        dtype = numpy_dtype(desc.datatype)
        whole = desc.total_size // dtype.itemsize * dtype.itemsize
        base = self.buffers[tensor.buffer][tensor.offset : tensor.offset + whole].view(dtype)
        return self.xp.lib.stride_tricks.as_strided(
            base, shape=desc.shape, strides=desc.byte_strides
        )


def run_dispatches(
    backend: Backend, buffers: Sequence[DeviceArray], dispatches: Sequence[DispatchPlan]
) -> None:
    """Run checked dispatches in order over the placed buffers (flat uint8 arrays on the
    backend's device, in declaration order): a later dispatch reads what an earlier one wrote."""
    views = _Views(backend.xp, buffers)
    for dispatch in dispatches:
        inputs = [views.of(t) for t in dispatch.inputs]
        backend.run(dispatch.call, inputs, views.of(dispatch.output))


def batch_work(plan: BatchPlan) -> Work:
    """What a planned batch computes, for placement: its body's bytes, one step a dispatch."""
    return Work(WorkKind.BATCH, Residence.BODY, plan.body_bytes, len(plan.dispatches))


def run_batch(
    plan: BatchPlan, body: bytearray, backend: Backend, sinks: Sequence[memoryview]
) -> None:
    """Run a planned batch (``plan_batch``) over the request ``body``; copy each output
    buffer into its sink (in ``plan.outputs`` order). Blocking (it waits for the device). On
    a server that places work (backends/placement.py) the whole batch runs on one backend."""
    backend = placed(backend, batch_work(plan))
    arrays = [_place(backend, body, b) for b in plan.buffers]
    run_dispatches(backend, arrays, plan.dispatches)
    for i, sink in zip(plan.outputs, sinks, strict=True):
        backend.to_host(arrays[i], np.frombuffer(sink, dtype=_UINT8))


def execute(plan: BatchPlan, body: bytearray, backend: Backend) -> codec.Framed:
    """Run a plan (``run_batch``) into its response: one buffer, the header written in and
    each output buffer copied into its place."""
    response, sinks = plan.response.allocate()
    run_batch(plan, body, backend, sinks)
    return codec.Framed((response,), plan.response.header_length)
