"""One v2 inference, from a decoded request to the response body: plan, run, encode.

A front end decodes its wire form into an ``InferRequest`` (``tensorbits_protocol.infer``: the
REST decoder checks the JSON, the framing and the tensor counts there); ``plan`` checks it
against the operator's rules and the limits, before any output memory exists. Binary inputs
stay where they arrived: ``np.frombuffer`` views of the request body. ``plan_rest`` is the REST
entry: it remembers the plans of repeated all-binary headers (``header_cache.py``). ``execute``
then knows the output's shape and type, so it writes the response's JSON header first, allocates
ONE buffer for header plus output, and has the kernel write the output straight into that
buffer's tail, which is sent as it is (no copy from output to response).

All are plain functions, CPU-bound; the HTTP layer decides whether to run them on a worker
thread. Every failure is a ``TensorbitsError`` (400, 404, 413), never a bare exception.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, Self

import numpy as np

from tensorbits.backends.base import Backend
from tensorbits.engine import flat_call, is_flat_elementwise, run_into
from tensorbits.header_cache import HeaderCache
from tensorbits.shared_memory import Location, SharedMemoryRegions, switched_on
from tensorbits_protocol import codec
from tensorbits_protocol.dtypes import itemsize, wire_dtype
from tensorbits_protocol.errors import InvalidRequest, OperatorNotFound, PayloadTooLarge
from tensorbits_protocol.infer import (
    UNSUPPORTED_OUTPUT_PARAMETERS,
    HostArray,
    InferRequest,
    InferResponse,
    RequestLimits,
    SharedMemoryRef,
    Tensor,
)
from tensorbits_protocol.jsondata import JsonLimits, MemberLimit, encode_data, require_json_form
from tensorbits_protocol.operators import OperatorSpec, get_operator
from tensorbits_protocol.parameters import MAX_OBJECT_KEYS, MAX_PARAMETERS
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

MODEL_VERSION = "1"
MODEL_VERSIONS = (MODEL_VERSION,)
# Room in the JSON value count for what surrounds tensor data: per tensor its keys, shape and
# parameters; per request its id and parameters. max_json_elements then bounds the data itself.
ENVELOPE_VALUES = 64
ENVELOPE_VALUES_PER_TENSOR = 64
# The keys a v2 document's request or one of its tensors may hold.
OBJECT_KEYS = MAX_OBJECT_KEYS
KEYS_WORDS = (
    f"{MAX_PARAMETERS} parameters per map, for the request and each of TENSORBITS_MAX_TENSORS "
    "inputs and outputs"
)
# JSON output costs far more per element than its binary bytes; this weighs it for offloading.
JSON_BYTES_PER_ELEMENT = 8
# A run from system regions to a system region streams pieces of this many bytes (of its widest
# tensor) through buffers that stay in the cache: read, compute, write. 256 KiB to 4 MiB measured
# alike, all twice as fast as whole tensors (docs/benchmarks.md).
STREAM_PIECE_BYTES = 1 << 20


class LimitSettings(Protocol):
    """The settings one inference's limits are made of (``config.Settings`` has them): the core
    takes these values, not the server's configuration."""

    @property
    def max_tensors(self) -> int: ...
    @property
    def max_tensor_elements(self) -> int: ...
    @property
    def max_json_elements(self) -> int: ...
    @property
    def max_json_depth(self) -> int: ...


def request_limits(settings: LimitSettings) -> RequestLimits:
    """The request limits one inference is held to, built once a runtime."""
    envelope = ENVELOPE_VALUES + ENVELOPE_VALUES_PER_TENSOR * settings.max_tensors
    return RequestLimits(
        max_tensors=settings.max_tensors,
        max_tensor_elements=settings.max_tensor_elements,
        max_json_elements=settings.max_json_elements,
        json=JsonLimits(
            settings.max_json_depth,
            settings.max_json_elements + envelope,
            members=(
                MemberLimit(
                    ("inputs", "outputs"),
                    settings.max_tensors,
                    "TENSORBITS_MAX_TENSORS",
                    "max_tensors",
                    "inputs and outputs",
                ),
            ),
            max_keys=OBJECT_KEYS + OBJECT_KEYS * settings.max_tensors,
            max_object_keys=OBJECT_KEYS,
            keys_words=KEYS_WORDS,
        ),
    )


class Plan(NamedTuple):
    """A checked inference, ready to run: nothing about it can be the caller's fault any more.
    (A NamedTuple: one is built per request, in a third of a frozen dataclass's time.)"""

    op: OperatorSpec
    call: ResolvedCall
    request_id: str | None
    inputs: list[HostArray]  # in the operator's input order
    binary_output: bool
    output_nbytes: int
    # The binary response's JSON header when already known (a cached header's plan): it depends
    # on nothing that running the plan decides.
    response_header: bytes | None = None
    # Inputs in shared memory (their place in ``inputs`` holds an empty array until
    # ``shared_loaded`` reads them) and the region the output goes to (shared_memory.py), a CUDA
    # region when ``output_on_device``.
    shared_inputs: tuple[SharedInput, ...] = ()
    shared_output: SharedMemoryRef | None = None
    output_on_device: bool = False

    @property
    def shared_input_bytes(self) -> int:
        """Bytes of host memory the inputs read from system regions take (one in a CUDA region
        is computed on where it is)."""
        return sum(shared.nbytes for shared in self.shared_inputs if not shared.on_device)

    @property
    def work_bytes(self) -> int:
        """Memory the run touches: inputs read, output written (and JSON text for JSON output)."""
        out = self.output_nbytes
        if not self.binary_output and self.shared_output is None:
            out += math.prod(self.call.output_shape) * JSON_BYTES_PER_ELEMENT
        return sum(x.nbytes for x in self.inputs) + self.shared_input_bytes + out

    def memory_needed(self, body_bytes: int, backend: Backend | None = None) -> int:
        """Bytes of host memory this inference holds while it runs on ``backend``: the
        request's body, the inputs read from system shared memory, and the output (none when a
        CUDA region gets it; a streamed run holds one piece of each shared tensor)."""
        inputs = self.shared_input_bytes
        output = 0 if self.output_on_device else self.output_nbytes
        if backend is not None and _streams(self, backend):
            inputs = min(inputs, len(self.shared_inputs) * STREAM_PIECE_BYTES)
            if self.shared_output is not None:
                output = min(output, STREAM_PIECE_BYTES)
        return body_bytes + inputs + output

    def response(self, data: list[Any] | None = None) -> InferResponse:
        """The response to this plan: the output as binary data, with its JSON ``data``, or as
        written into its shared-memory region."""
        call = self.call
        output = Tensor(
            self.op.output, call.output_datatype, call.output_shape, data=data,
            shared_memory=self.shared_output,
        )  # fmt: skip
        return InferResponse(self.op.name, (output,), MODEL_VERSION, self.request_id)


class SharedInput(NamedTuple):
    """An input whose bytes are in shared memory: its place in the operator's inputs, where
    (``on_device``: in a CUDA region)."""

    position: int
    name: str
    ref: SharedMemoryRef
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    on_device: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


# --- planning -----------------------------------------------------------------------------------


def _binary_output(op: OperatorSpec, request: InferRequest) -> bool:
    """Whether the output goes back as binary data: the request-wide default
    ``binary_data_output``, overridden by the output's own ``binary_data``."""
    default = request.binary_output
    seen: set[str] = set()
    for output in request.outputs or ():
        if output.name != op.output:
            raise InvalidRequest(
                f"output '{output.name[:100]}': {op.name} has no output of that name "
                f"(outputs: {op.output})",
                field=output.name[:100],
                rule="unknown_output",
            )
        if output.name in seen:
            raise InvalidRequest(
                f"output '{output.name}' is requested more than once",
                field=output.name,
                rule="duplicate_output",
            )
        seen.add(output.name)
        for key, what in UNSUPPORTED_OUTPUT_PARAMETERS.items():
            if key in output.parameters:
                raise InvalidRequest(
                    f"output '{output.name}': parameters.{key}: {what} is not supported",
                    field=output.name,
                    rule="unsupported_parameter",
                )
        if output.binary is not None:
            default = output.binary
    return default


def _check_output(call: ResolvedCall, binary: bool, limits: RequestLimits) -> None:
    name, count = call.op.output, math.prod(call.output_shape)
    if count > limits.max_tensor_elements:
        raise PayloadTooLarge(
            f"output '{name}': shape {list(call.output_shape)} has {count} elements, more than "
            f"the limit of {limits.max_tensor_elements} (TENSORBITS_MAX_TENSOR_ELEMENTS)",
            field=name,
            rule="max_tensor_elements",
        )
    if binary:
        return
    require_json_form(name, call.output_datatype, "output")
    if count > limits.max_json_elements:
        raise PayloadTooLarge(
            f"output '{name}': {count} elements are too many for JSON data (limit "
            f"{limits.max_json_elements}, TENSORBITS_MAX_JSON_ELEMENTS); request binary data",
            field=name,
            rule="max_json_elements",
        )


_NOT_READ = np.empty(0, np.uint8)  # an input in shared memory, until shared_loaded reads it


def plan(
    op: OperatorSpec,
    request: InferRequest,
    limits: RequestLimits,
    regions: SharedMemoryRegions | None = None,
) -> Plan:
    """Check a decoded request against ``op``'s rules and the limits; raise on anything wrong.

    Whatever front end decoded it (``InferRequest.from_rest``, the gRPC ``messages``), the
    checks and their messages are these. Tensors in shared memory need ``regions`` (the server's,
    when the extension is on); they are located and checked here, read by ``shared_loaded`` once
    the request is admitted for them."""
    call = validate_call(
        op,
        {t.name: TensorSpec(t.datatype, t.shape) for t in request.inputs},
        request.parameters,
    )
    shared_output = next(
        (o.shared_memory for o in request.outputs or () if o.shared_memory is not None), None
    )
    binary = _binary_output(op, request)
    _check_output(call, binary or shared_output is not None, limits)
    output_nbytes = math.prod(call.output_shape) * itemsize(call.output_datatype)
    arrays: dict[str, HostArray] = {}
    shared: list[SharedInput] = []
    places: dict[str, Location] = {}
    for tensor in request.inputs:
        if tensor.shared_memory is None:
            arrays[tensor.name] = tensor.array()
            continue
        ref = switched_on(regions, tensor.name, "input")
        place = ref.locate(tensor.shared_memory, tensor.nbytes, tensor.name, "input")
        _check_device_alignment(place, itemsize(tensor.datatype), tensor.name, "input")
        places[tensor.name] = place
        arrays[tensor.name] = _NOT_READ
        shared.append(
            SharedInput(
                op.inputs.index(tensor.name), tensor.name, tensor.shared_memory,
                wire_dtype(tensor.datatype), tensor.shape, place.on_device,
            )
        )  # fmt: skip
    output_on_device = False
    if shared_output is not None:
        out = switched_on(regions, op.output, "output").locate(
            shared_output, output_nbytes, op.output, "output"
        )
        _check_device_alignment(out, itemsize(call.output_datatype), op.output, "output")
        _check_aliasing(op, out, places)
        output_on_device = out.on_device
    return Plan(
        op=op,
        call=call,
        request_id=request.id,
        inputs=[arrays[name] for name in op.inputs],
        binary_output=binary and shared_output is None,
        output_nbytes=output_nbytes,
        shared_inputs=tuple(shared),
        shared_output=shared_output,
        output_on_device=output_on_device,
    )


def _check_device_alignment(place: Location, item_bytes: int, tensor: str, direction: str) -> None:
    """A tensor in a CUDA region starts on a multiple of its element size: a kernel that reads
    a misaligned element faults the device context, and with it every later request (a host
    copy would not care; the device does)."""
    if place.on_device and place.start % item_bytes:
        raise InvalidRequest(
            f"{direction} '{tensor}': in a CUDA shared-memory region it must start on a multiple "
            f"of its element size ({item_bytes} bytes); its shared_memory_offset does not",
            field=tensor,
            rule="shared_memory_alignment",
        )


def _check_aliasing(op: OperatorSpec, output: Location, inputs: dict[str, Location]) -> None:
    """An output region may overlap an input's only as the operator's in-place rule allows:
    the very same bytes, of an input the output may replace (``op.in_place``)."""
    for name, place in inputs.items():
        if not place.overlaps(output):
            continue
        if place == output and name in op.in_place:
            continue
        allowed = ", ".join(op.in_place) or "none"
        raise InvalidRequest(
            f"output '{op.output}': its shared-memory bytes overlap input '{name}''s; "
            f"{op.name} may write its output over exactly the bytes of an input among: {allowed}",
            field=op.output,
            rule="output_aliasing",
        )


@contextmanager
def shared_loaded(plan: Plan, regions: SharedMemoryRegions | None) -> Iterator[Plan]:
    """``plan`` with its shared-memory inputs in place, for the block: one in a system region
    read (a copy, never a mapping: see shared_memory.py; into a buffer the regions recycle once
    the block ends, so nothing may keep the inputs past it), one in a CUDA region as a device
    array over the client's memory (the region held until the block ends); the plan itself when
    it has none."""
    if not plan.shared_inputs:
        yield plan
        return
    assert regions is not None  # plan() refused shared memory without regions
    inputs = list(plan.inputs)
    buffers: list[bytearray] = []
    try:
        with ExitStack() as held:
            for shared in plan.shared_inputs:
                if shared.on_device:
                    raw = held.enter_context(
                        regions.device_bytes(shared.ref, shared.nbytes, shared.name, "input")
                    )
                    inputs[shared.position] = raw.view(shared.dtype).reshape(shared.shape)
                    continue
                data = regions.read(shared.ref, shared.nbytes, shared.name)
                buffers.append(data)
                array = np.frombuffer(data, shared.dtype, math.prod(shared.shape))
                inputs[shared.position] = array.reshape(shared.shape)
            yield plan._replace(inputs=inputs)
    finally:
        regions.recycle(buffers)


def run_to_region(plan: Plan, backend: Backend, regions: SharedMemoryRegions) -> None:
    """Run a plan whose output goes into shared memory, its shared inputs read here. A CUDA
    region: the kernel writes the client's device memory directly. A system region: streamed
    in pieces where the call allows it (``_run_streamed``); otherwise the inputs are read whole
    and the output is computed into the buffer of an input read from a system region when the
    operator may write its output over that input (``op.in_place``, same type and shape: that
    buffer is the server's own copy), else into a new array, then written into the region."""
    call, op = plan.call, plan.op
    dtype = wire_dtype(call.output_datatype)
    assert plan.shared_output is not None
    if _streams(plan, backend):
        _run_streamed(plan, backend, regions)
        return
    with shared_loaded(plan, regions) as loaded:
        if plan.output_on_device:
            with regions.device_bytes(
                plan.shared_output, plan.output_nbytes, op.output, "output"
            ) as raw:
                run_into(backend, call, loaded.inputs, raw.view(dtype).reshape(call.output_shape))
            return
        over = _replaceable_input(plan)
        out = np.empty(call.output_shape, dtype) if over is None else loaded.inputs[over]
        run_into(backend, call, loaded.inputs, out)
        regions.write(plan.shared_output, out.reshape(-1).view(np.uint8).data, op.output)


def _replaceable_input(plan: Plan) -> int | None:
    """The position of an input read from a system region that the output may be computed
    over (``op.in_place``, the output's type and shape): that buffer is the server's own copy,
    so no output buffer is needed."""
    call = plan.call
    dtype = wire_dtype(call.output_datatype)
    return next(
        (
            shared.position
            for shared in plan.shared_inputs
            if shared.name in plan.op.in_place
            and not shared.on_device
            and shared.dtype == dtype
            and shared.shape == call.output_shape
        ),
        None,
    )


def _streams(plan: Plan, backend: Backend) -> bool:
    """Whether ``_run_streamed`` runs ``plan``: host memory throughout (a host backend, no CUDA
    region) and an element-wise call without broadcasting."""
    return (
        backend.host_memory
        and not plan.output_on_device
        and not any(shared.on_device for shared in plan.shared_inputs)
        and is_flat_elementwise(plan.call)
    )


def _run_streamed(
    plan: Plan,
    backend: Backend,
    regions: SharedMemoryRegions,
    host_out: np.ndarray[Any, Any] | None = None,
) -> None:
    """Run ``plan`` in pieces of ``STREAM_PIECE_BYTES``: for each, read the inputs' piece from
    their regions (body inputs: a slice of their view), run the kernel on the flat piece
    (``engine.flat_call``), and write the output's piece into its system region, or straight
    into ``host_out`` (flat: a response's body) when given. The pieces' buffers stay in the
    cache, so each byte crosses memory once in and once out instead of three times (``preadv``
    into a whole buffer, the kernel, ``pwritev`` out of it). Every region is held for the whole
    run (``system_bytes``). An output in exactly an input's bytes (``op.in_place``) is safe:
    each piece is read before it is written, and no later piece reads it."""
    call, op = plan.call, plan.op
    out_dtype = wire_dtype(call.output_datatype)
    shared = {each.position: each for each in plan.shared_inputs}
    dtypes = [shared[i].dtype if i in shared else x.dtype for i, x in enumerate(plan.inputs)]
    total = math.prod(call.output_shape)
    if total == 0:
        return  # an empty output: nothing to read or write
    step = max(1, STREAM_PIECE_BYTES // max(out_dtype.itemsize, *(d.itemsize for d in dtypes)))
    step = min(step, total)
    buffers = {i: regions.pool.take(step * shared[i].dtype.itemsize) for i in shared}
    # The output's pieces go straight into host_out when given, else into the buffer of an
    # input the operator may replace, else into a buffer of their own.
    over = None if host_out is not None else _replaceable_input(plan)
    out_buffer = (
        regions.pool.take(step * out_dtype.itemsize) if over is None and host_out is None else None
    )
    flat = [x.reshape(-1) if i not in shared else None for i, x in enumerate(plan.inputs)]
    try:
        with ExitStack() as held:
            sources = {
                i: held.enter_context(
                    regions.system_bytes(each.ref, each.nbytes, each.name, "input")
                )
                for i, each in shared.items()
            }
            sink = None
            if host_out is None:
                assert plan.shared_output is not None
                sink = held.enter_context(
                    regions.system_bytes(
                        plan.shared_output, plan.output_nbytes, op.output, "output"
                    )
                )
            for start in range(0, total, step):
                count = min(step, total - start)
                pieces: list[np.ndarray[Any, Any]] = []
                for i, dtype in enumerate(dtypes):
                    whole = flat[i]
                    if whole is not None:
                        pieces.append(whole[start : start + count])
                        continue
                    into = memoryview(buffers[i])[: count * dtype.itemsize]
                    sources[i].read_into(start * dtype.itemsize, into)
                    pieces.append(np.frombuffer(into, dtype))
                if host_out is not None:
                    out = host_out[start : start + count]
                elif over is None:
                    assert out_buffer is not None
                    raw = memoryview(out_buffer)[: count * out_dtype.itemsize]
                    out = np.frombuffer(raw, out_dtype)
                else:
                    out = pieces[over]
                run_into(backend, flat_call(call, count), pieces, out)
                if sink is not None:
                    sink.write(start * out_dtype.itemsize, out.view(np.uint8).data)
    finally:
        regions.recycle([*buffers.values(), *([out_buffer] if out_buffer is not None else [])])


# Where an input's bytes lie in a request: the buffer that holds them (its index in the buffers
# a template is given), their span in it, and the wire dtype and shape they are read as.
InputPlace = tuple[int, slice, np.dtype[Any], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class PlanTemplate:
    """What one request whose inputs are all raw bytes decides: everything in its plan but those
    bytes, and where they lie (per operator input, an ``InputPlace``). Keyed by the request
    without those bytes, a repeated request is planned from it without being parsed or checked
    again: over HTTP the one buffer is the body's tail (``from_rest``), over gRPC each input's raw
    contents is one (``grpc.messages.PlanTemplate``)."""

    op: OperatorSpec
    call: ResolvedCall
    request_id: str | None
    binary_output: bool
    output_nbytes: int
    inputs: tuple[InputPlace, ...]
    response_header: bytes | None  # for binary output over HTTP

    def plan(self, buffers: Sequence[memoryview]) -> Plan:
        return Plan(
            op=self.op,
            call=self.call,
            request_id=self.request_id,
            inputs=[
                np.frombuffer(buffers[index][span], dtype).reshape(shape)
                for index, span, dtype, shape in self.inputs
            ],
            binary_output=self.binary_output,
            output_nbytes=self.output_nbytes,
            response_header=self.response_header,
        )

    @classmethod
    def decided(
        cls,
        planned: Plan,
        where: Mapping[str, InputPlace],
        *,
        binary_output: bool,
        response_header: bytes | None,
        **added: Any,
    ) -> Self:
        """The template of ``planned``, whose inputs lie ``where`` (by name; kept in the
        operator's input order), and the fields a subclass adds."""
        return cls(
            op=planned.op,
            call=planned.call,
            request_id=planned.request_id,
            binary_output=binary_output,
            output_nbytes=planned.output_nbytes,
            inputs=tuple(where[name] for name in planned.op.inputs),
            response_header=response_header,
            **added,
        )

    @classmethod
    def from_rest(cls, planned: Plan, request: InferRequest) -> PlanTemplate:
        """The template of a plan made from an all-binary request: where each input's bytes lie
        in the tail (``codec.spans``, in the order sent)."""
        places = codec.spans(tensor.nbytes for tensor in request.inputs)
        where = {
            tensor.name: (0, slice(*place), wire_dtype(tensor.datatype), tensor.shape)
            for tensor, place in zip(request.inputs, places, strict=True)
            if place is not None
        }
        header = planned.response().to_rest().header if planned.binary_output else None
        return cls.decided(
            planned, where, binary_output=planned.binary_output, response_header=header
        )


# The longest v2 header worth remembering: a few inputs' names, shapes and parameters.
CACHED_HEADER_MAX_BYTES = 4096


def plan_rest(
    op: OperatorSpec,
    body: bytearray,
    header_length: int | None,
    limits: RequestLimits,
    cache: HeaderCache[PlanTemplate] | None = None,
    regions: SharedMemoryRegions | None = None,
    version: str | None = None,
) -> Plan:
    """Decode and plan one REST inference request for ``op`` (at the URL's ``version``, if it
    names one); raise on anything wrong with it.

    With a ``cache``, an all-binary header planned before is not decoded again (header_cache.py):
    the plan is rebuilt from what it decided, with views of this body's bytes."""
    head, tail = codec.split_body(memoryview(body), header_length)
    header = bytes(head)
    key: tuple[str, str | None, bytes, int] | None = None
    if cache is not None and header_length is not None and cache.keeps(header):
        key = (op.name, version, header, len(tail))
        template = cache.get(key)
        if template is not None:
            return template.plan((tail,))
    request = InferRequest.from_rest(
        header, tail, model=op.name, header_given=header_length is not None, limits=limits
    )
    check_named_model(request, op, version)
    planned = plan(op, request, limits, regions)
    if (
        key is not None
        and cache is not None
        and planned.shared_output is None
        and all(t.raw is not None for t in request.inputs)
    ):
        cache.put(key, PlanTemplate.from_rest(planned, request), len(header))
    return planned


# --- running and encoding -----------------------------------------------------------------------


def execute(
    plan: Plan, backend: Backend, regions: SharedMemoryRegions | None = None
) -> codec.Framed:
    """Run a plan and encode the response (binary: one buffer, written in place; shared
    memory: the inputs read first, the output written into its region, the response its JSON
    header alone). Called once the request is admitted for ``plan.memory_needed``."""
    if plan.shared_output is not None:
        assert regions is not None  # plan() refused shared memory without regions
        run_to_region(plan, backend, regions)
        return codec.Framed.json(plan.response().to_rest().header)
    call = plan.call
    dtype = wire_dtype(call.output_datatype)
    if plan.binary_output:
        if plan.response_header is not None:
            layout = codec.BodyLayout(plan.response_header, (plan.output_nbytes,))
        else:
            layout = plan.response().to_rest()
        body, (tail,) = layout.allocate()
        run_to_host(plan, backend, regions, np.frombuffer(tail, dtype).reshape(call.output_shape))
        return codec.Framed((body,), layout.header_length)
    out = np.empty(call.output_shape, dtype)
    run_to_host(plan, backend, regions, out)
    return codec.Framed.json(plan.response(encode_data(plan.op.output, out)).to_rest().header)


def run_to_host(
    plan: Plan, backend: Backend, regions: SharedMemoryRegions | None, out: np.ndarray[Any, Any]
) -> None:
    """Run a plan whose output goes to the host array ``out`` (a response's body), its shared
    inputs read here: streamed in pieces from their regions where the call allows it
    (``_run_streamed``), else read whole (``shared_loaded``)."""
    if plan.shared_inputs and out.flags.c_contiguous and _streams(plan, backend):
        assert regions is not None  # plan() refused shared memory without regions
        _run_streamed(plan, backend, regions, out.reshape(-1))  # a view: out is contiguous
        return
    with shared_loaded(plan, regions) as loaded:
        run_into(backend, plan.call, loaded.inputs, out)


def check_named_model(request: InferRequest, op: OperatorSpec, version: str | None) -> None:
    """The model (and version) a REST body names beside its URL, as KServe's REST client
    writes them: accepted when they are the URL's ``op`` and ``version`` (a URL without one
    asks for the server's choice, ``MODEL_VERSION``), refused naming both when not: never
    answered for another model than the one the caller meant."""
    named = request.model_name
    if named is not None and named != op.name:
        raise InvalidRequest(
            f"model_name '{named[:100]}' in the request body is not the model the URL names, "
            f"'{op.name}'",
            field="model_name",
            rule="model_mismatch",
        )
    named = request.model_version
    meant = MODEL_VERSION if version is None else version
    if named is not None and named != meant:
        where = "the URL names" if version is not None else "a URL without one asks for"
        raise InvalidRequest(
            f"model_version '{named[:40]}' in the request body is not the version {where}, "
            f"'{meant[:40]}'",
            field="model_version",
            rule="model_mismatch",
        )


def resolve_model(name: str, version: str | None) -> OperatorSpec:
    """The operator a v2 model name (and optional version) names; 404 for any other."""
    op = get_operator(name)
    if version is not None and version not in MODEL_VERSIONS:
        raise OperatorNotFound(
            f"model '{op.name}' has no version '{version[:40]}' "
            f"(versions: {', '.join(MODEL_VERSIONS)})",
            field="model_version",
            rule="unknown_version",
        )
    return op


__all__ = [
    "MODEL_VERSION",
    "MODEL_VERSIONS",
    "Plan",
    "PlanTemplate",
    "check_named_model",
    "execute",
    "plan",
    "plan_rest",
    "request_limits",
    "resolve_model",
    "run_to_host",
    "run_to_region",
    "shared_loaded",
]
