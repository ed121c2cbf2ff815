"""Shared memory for a client on the server's host: tensors passed by reference, not sent.

``client.shared_memory(nbytes)`` makes a ``SharedMemoryRegion``: a POSIX shared-memory object
(the standard library's ``multiprocessing.shared_memory``) that the server maps by name through
Triton's system shared-memory extension (the server needs ``TENSORBITS_SHARED_MEMORY=true``).
Entering it creates the object and registers it; leaving it unregisters, closes and unlinks it,
also when the body raised.

    with client.shared_memory(2 << 20) as region:
        x = region.array(np.uint8, (1 << 20,))      # a view of the region: fill it in place
        x[:] = data
        y = region.onnx.bitwise_not(x)              # y is a view of the region too

The region is carved into *blocks*, each starting at a multiple of ``alignment`` bytes (64). An
input that is already a block (or a contiguous part of one) is passed by its offset; any other
array is first copied into a new block. Each output gets a block before the request is sent, its
place and size read off the operator tables (``validation.validate_call``, the server's own
rules), so a region too small for a call fails here, before anything is sent. The result is a
NumPy view of that block: no byte of it crossed the socket or was copied in this process.

A block is in use for as long as any array viewing it exists (each block's arrays share one base
object, whose finalizer gives the block back), so dropping a result frees its room and keeping it
keeps its bytes from being reused. The views are valid while the region is open: once it is
closed the server no longer writes it and the object is gone from ``/dev/shm``; arrays still
held keep the mapping alive (never a dangling pointer), but they are no longer shared.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar
from urllib.parse import quote

import httpx
import numpy as np
import numpy.typing as npt

from tensorbits_client._base import BaseClient, Call, _decode_empty, _model_path
from tensorbits_client._catalog import Registry, datatype_of
from tensorbits_client._codec import (
    HEADER_LENGTH,
    Body,
    Framed,
    FramingError,
    InferResult,
    decode_infer,
    plain_parameters,
)
from tensorbits_client._exceptions import LocalValidationError
from tensorbits_client._families import Families, Runner, awaited_output_of, output_of
from tensorbits_client._types import (
    NOT_GIVEN,
    Array,
    Inputs,
    NotGiven,
    Parameters,
    TimeoutTypes,
)
from tensorbits_protocol.dtypes import wire_dtype
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import InferRequest, RequestedOutput, SharedMemoryRef
from tensorbits_protocol.infer import Tensor as WireTensor
from tensorbits_protocol.validation import validate_call

#: The server's default ``TENSORBITS_SHARED_MEMORY_PREFIX``: object names start with it.
DEFAULT_PREFIX = "/tensorbits"
#: Where each block starts: a multiple of this many bytes (a cache line, any dtype's alignment).
DEFAULT_ALIGNMENT = 64
# Where Linux's shm_open keeps its objects (the server opens the same path).
SHM_DIR = Path("/dev/shm")
SHARED_MEMORY_PATH = "/v2/systemsharedmemory"

T = TypeVar("T")
R = TypeVar("R")  # what an operator method returns: the array, or an awaitable of it


# What a region asks of its client, as protocols: _client.py imports this module to make
# regions, so this one names no class of that one.
class RegionClient(Protocol):
    """A ``SharedMemoryRegion``'s client (``Client`` is one): its request loop, retries
    included, and the server's operator tables."""

    def _request(self, call: Call[T]) -> T: ...

    def _registry(self) -> Registry: ...


class AsyncRegionClient(Protocol):
    """An ``AsyncSharedMemoryRegion``'s client (``AsyncClient`` is one): ``RegionClient``,
    awaited."""

    async def _request(self, call: Call[T]) -> T: ...

    async def _registry(self) -> Registry: ...


ClientT = TypeVar("ClientT", RegionClient, AsyncRegionClient)


class _Block:
    """The base object of every array viewing one block: NumPy reads the address from
    ``__array_interface__``, and the views keep this object (and through ``_mapping`` the
    mapping) alive; its finalizer gives the block back once the last of them is gone."""

    __slots__ = ("__array_interface__", "__weakref__", "_mapping")

    def __init__(self, address: int, nbytes: int, mapping: Array) -> None:
        self.__array_interface__ = {
            "version": 3,
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),  # writable
        }
        self._mapping = mapping


class _Blocks:
    """Which bytes of the region are taken: first fit, each block at a multiple of ``alignment``.

    A finalizer may run anywhere (inside ``take`` too), so giving a block back only appends its
    start to ``_returned`` (atomic); ``take`` collects them under the lock."""

    def __init__(self, size: int, alignment: int) -> None:
        self.size = size
        self.alignment = alignment
        self._taken: dict[int, int] = {}  # start -> end
        self._returned: list[int] = []
        self._lock = threading.Lock()

    def give_back(self, start: int) -> None:
        self._returned.append(start)

    def _collect(self) -> None:
        while self._returned:
            self._taken.pop(self._returned.pop(), None)

    def take(self, nbytes: int) -> int | None:
        """The start of a free span of ``nbytes`` (aligned), now taken; None if none is free."""
        with self._lock:
            self._collect()
            start = 0
            for begin, end in sorted(self._taken.items()):
                if begin - start >= nbytes:
                    break
                start = -(-end // self.alignment) * self.alignment
            if start + nbytes > self.size:
                return None
            self._taken[start] = start + nbytes
            return start

    def usage(self) -> tuple[int, int]:
        """Bytes in blocks still viewed, and the largest free span."""
        with self._lock:
            self._collect()
            used = sum(end - begin for begin, end in self._taken.items())
            largest, start = 0, 0
            for begin, end in sorted(self._taken.items()):
                largest = max(largest, begin - start)
                start = -(-end // self.alignment) * self.alignment
            return used, max(largest, self.size - start)


class _Output:
    """Where one requested output goes: its array (a view of its block) and what it holds."""

    __slots__ = ("array", "name", "ref")

    def __init__(self, name: str, array: Array, ref: SharedMemoryRef) -> None:
        self.name = name
        self.array = array
        self.ref = ref


def _aligned(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


class _Region(Families[R], Generic[ClientT, R]):
    """What both regions share: the object, its blocks, each call's plan and the operator
    families; the subclasses add the I/O (``open``, ``close``, ``infer``) and the ``_runner``,
    as ``Client`` and ``AsyncClient`` do."""

    def __init__(
        self,
        client: ClientT,
        nbytes: int,
        *,
        prefix: str = DEFAULT_PREFIX,
        alignment: int = DEFAULT_ALIGNMENT,
    ) -> None:
        if not isinstance(nbytes, int) or nbytes < 1:
            raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
        if not prefix.startswith("/") or "/" in prefix[1:] or len(prefix) > 200:
            raise ValueError(
                f"prefix {prefix!r} is not the start of a POSIX shared-memory name "
                "('/' then characters other than '/')"
            )
        if alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self._client: ClientT = client
        self.nbytes = nbytes
        self.alignment = alignment
        #: The object's name (without the leading '/'), also the region's name on the server.
        self.name = f"{prefix[1:]}_{os.getpid()}_{secrets.token_hex(6)}"
        #: The POSIX shared-memory key the server opens: '/' + name.
        self.key = "/" + self.name
        self._state = "new"
        self._unlink: Callable[[], None] | None = None
        self._mmap: mmap.mmap | None = None
        self._root: Array | None = None
        self._address = 0
        self._blocks = _Blocks(nbytes, alignment)
        self._add_families()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key} {self.nbytes} bytes, {self._state}>"

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    # --- arrays ---------------------------------------------------------------------------------
    def array(self, dtype: npt.DTypeLike, shape: int | tuple[int, ...]) -> Array:
        """A new writable array of the region (a block of its own), to fill in place; its
        contents are unspecified (a reused block keeps the bytes it had)."""
        dt = np.dtype(dtype)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        if any(not isinstance(d, int | np.integer) or d < 0 for d in dims):
            raise ValueError(f"shape must be non-negative ints, got {shape!r}")
        return self._allocate(dt, dims, f"an array {dt} {list(dims)}")

    def put(self, array: npt.ArrayLike) -> Array:
        """A copy of ``array`` in the region (C order): pass it to ``infer`` without a copy."""
        source = np.asarray(array)
        view = self.array(source.dtype, source.shape)
        np.copyto(view, source)
        return view

    @property
    def buffer(self) -> Array:
        """Every byte of the region, read-only (e.g. for ``np.shares_memory``); arrays to fill
        come from ``array`` and ``put``, which keep their bytes from being handed out again."""
        root = self._open_root()
        view = root[:]
        view.flags.writeable = False
        return view

    def offset_of(self, array: Array) -> int | None:
        """Where ``array``'s bytes start in the region, if it is a C-contiguous little-endian
        view of one of its arrays (what the server can read in place); else None. (A view of
        ``buffer`` is not one: its bytes may belong to no array, or be handed out again.)"""
        if self._root is None or not array.flags.c_contiguous or array.dtype.byteorder == ">":
            return None
        base: object = array
        while isinstance(base, np.ndarray):
            base = base.base
        if not isinstance(base, _Block):
            return None
        if array.nbytes == 0:
            return 0
        start = int(array.__array_interface__["data"][0]) - self._address
        return start if start >= 0 and start + array.nbytes <= self.nbytes else None

    def _open_root(self) -> Array:
        if self._state != "open" or self._root is None:
            raise ValueError(f"shared-memory region {self.key} is {self._state}, not open")
        return self._root

    def _allocate(
        self, dtype: np.dtype[Any], shape: tuple[int, ...], what: str, call_bytes: int = 0
    ) -> Array:
        """A new block viewed as ``dtype`` and ``shape``; ``call_bytes``: what the whole call
        needs (aligned), to tell a region too small for it from one still in use."""
        root = self._open_root()
        nbytes = math.prod(shape) * dtype.itemsize
        start = self._blocks.take(nbytes) if nbytes else 0
        if start is None:
            if max(call_bytes, nbytes) > self.nbytes:
                why = (
                    f"the region is smaller than the {max(call_bytes, nbytes)} bytes the call's "
                    f"inputs and output need (each aligned to {self.alignment} bytes)"
                )
            else:
                used, largest = self._blocks.usage()
                why = (
                    f"{used} bytes are in arrays still referenced and the largest free span is "
                    f"{largest} bytes (drop arrays you no longer need, or copy results out)"
                )
            raise LocalValidationError(
                f"shared-memory region {self.key} ({self.nbytes} bytes) has no room for {what} "
                f"({nbytes} bytes): {why}; nothing was sent",
                field="shared_memory",
                rule="region_size",
            )
        block = _Block(self._address + start, nbytes, root)
        if nbytes:
            weakref.finalize(block, self._blocks.give_back, start)
        view: Array = np.asarray(block).view(dtype).reshape(shape)
        return view

    # --- lifecycle (local half) -----------------------------------------------------------------
    def _create(self) -> None:
        """Create the object, size it and map it (nothing is sent)."""
        from multiprocessing.shared_memory import SharedMemory  # only a region needs it

        if self._state != "new":
            raise ValueError(f"shared-memory region {self.key} is {self._state}; make a new one")
        shared = SharedMemory(self.name, create=True, size=self.nbytes)
        try:
            # Mapped here rather than through shared.buf: an mmap with arrays still viewing it
            # cannot be closed, and SharedMemory would then complain from its finalizer. This
            # one is unmapped when its last view is gone.
            fd = os.open(SHM_DIR / self.name, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                self._mmap = mmap.mmap(fd, self.nbytes)
            finally:
                os.close(fd)
        except BaseException:
            shared.close()
            shared.unlink()
            raise
        shared.close()  # its own mapping and descriptor; unlink() needs neither
        self._unlink = shared.unlink
        self._root = np.frombuffer(self._mmap, np.uint8)
        self._address = int(self._root.__array_interface__["data"][0])
        self._state = "open"

    def _release(self) -> None:
        """Unlink and unmap (after the server has let go); arrays still held keep the mapping."""
        self._state = "closed"
        self._root = None
        unlink, self._unlink = self._unlink, None
        mapping, self._mmap = self._mmap, None
        try:
            if unlink is not None:
                with contextlib.suppress(FileNotFoundError):  # someone else unlinked it
                    unlink()
        finally:
            if mapping is not None:
                # Arrays of the region may still exist: then it is unmapped when the last goes.
                with contextlib.suppress(BufferError):
                    mapping.close()

    def _register_call(self) -> Call[None]:
        document = {"key": self.key, "offset": 0, "byte_size": self.nbytes}
        return Call(
            "POST",
            f"{SHARED_MEMORY_PATH}/region/{quote(self.name, safe='')}/register",
            _decode_empty,
            body=Framed.json(json.dumps(document).encode()),
            max_retries=0,  # a lost answer would make the retry "already registered"
        )

    def _unregister_call(self) -> Call[None]:
        path = f"{SHARED_MEMORY_PATH}/region/{quote(self.name, safe='')}/unregister"
        return Call("POST", path, _decode_empty)

    @staticmethod
    def _exit_note(exc: BaseException | None, error: Exception) -> bool:
        """With the body's exception in flight, a failed unregister is a note on it (raising
        would hide it): True when it was noted."""
        if exc is None:
            return False
        exc.add_note(f"(and unregistering the shared-memory region failed: {error})")
        return True

    # --- one call -------------------------------------------------------------------------------
    def _plan(
        self,
        registry: Registry,
        model: str,
        inputs: Inputs,
        parameters: Parameters | None,
        out: Array | None,
        *,
        request_id: str | None,
        timeout: TimeoutTypes | NotGiven,
        max_retries: int | NotGiven,
    ) -> Call[InferResult]:
        """The request of one call, its inputs and output placed in the region (copied in when
        they are not there yet): every check and allocation before anything is sent."""
        self._open_root()
        named = BaseClient._named_inputs(registry, model, inputs)
        params = plain_parameters(parameters)
        specs = {name: datatype_of(name, array) for name, array in named}
        op = registry.get(model)
        resolved = None
        if op is not None:  # an unknown model is the server's to refuse (404)
            try:
                resolved = validate_call(op, specs, params)
            except InvalidRequest as exc:
                raise LocalValidationError.from_protocol(exc) from None
        elif out is not None:
            raise LocalValidationError(
                f"out: model '{model[:100]}' is not in the server's operator tables",
                field="out",
                rule="model",
            )
        # What all of the call's tensors take, for the message when there is no room.
        call_bytes = sum(_aligned(array.nbytes, self.alignment) for _, array in named)
        output: _Output | None = None
        if resolved is not None:
            dtype = wire_dtype(resolved.output_datatype)
            shape = resolved.output_shape
            name = resolved.op.output
            if out is None:
                call_bytes += math.prod(shape) * dtype.itemsize
                result = self._allocate(dtype, shape, f"output '{name}'", call_bytes)
            else:
                result = self._check_out(out, dtype, shape)
            offset = self.offset_of(result)
            assert offset is not None  # a block of this region
            output = _Output(name, result, SharedMemoryRef(self.name, result.nbytes, offset))
        keep: list[Array] = []  # the copies' blocks stay taken until the answer is decoded
        tensors = []
        for name, array in named:
            if self.offset_of(array) is None:
                copy = self._allocate(array.dtype, array.shape, f"input '{name}'", call_bytes)
                np.copyto(copy, array)
                keep.append(copy)
                array = copy
            offset = self.offset_of(array)
            assert offset is not None
            tensors.append(
                WireTensor(
                    name,
                    specs[name].datatype,
                    array.shape,
                    shared_memory=SharedMemoryRef(self.name, array.nbytes, offset),
                )
            )
        outputs = (
            None if output is None else (RequestedOutput(output.name, shared_memory=output.ref),)
        )
        header, _ = InferRequest(tuple(tensors), params, outputs, request_id).to_rest()
        return Call(
            "POST",
            f"{_model_path(model)}/infer",
            _decoder(output, keep),
            body=Framed.json(header),
            timeout=timeout,
            max_retries=max_retries,
        )

    def _check_out(self, out: Array, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Array:
        if self.offset_of(out) is None:
            raise LocalValidationError(
                "out: not a C-contiguous array of this region (make it with region.array)",
                field="out",
                rule="shared_memory",
            )
        if out.dtype != dtype or out.shape != shape:
            raise LocalValidationError(
                f"out: {out.dtype} {list(out.shape)} is not what the call produces "
                f"({dtype} {list(shape)})",
                field="out",
                rule="output_shape",
            )
        return out


def _decoder(
    output: _Output | None, keep: list[Array]
) -> Callable[[httpx.Response, Body], InferResult]:
    """The decoder of one call's answer: the output written into the region is its planned
    view (its data type and shape checked against the answer's), any other is read off the
    body as ``Client.infer`` reads it."""

    def array(tensor: WireTensor) -> Array:
        if output is None or tensor.name != output.name or tensor.raw is not None:
            return tensor.array("output")
        if tensor.data is not None or tensor.nbytes > output.ref.byte_size:
            raise FramingError(
                f"output '{tensor.name}' was asked in shared memory "
                f"({output.ref.byte_size} bytes) but came back "
                f"{'as data' if tensor.data is not None else 'larger'}"
            )
        view = output.array
        if view.dtype != wire_dtype(tensor.datatype) or view.shape != tensor.shape:
            view = view.reshape(-1).view(np.uint8)[: tensor.nbytes]
            view = view.view(wire_dtype(tensor.datatype)).reshape(tensor.shape)
        return view

    def decode(response: httpx.Response, body: Body) -> InferResult:
        result = decode_infer(body, response.headers.get(HEADER_LENGTH), array)
        keep.clear()  # the inputs copied in are done with
        return result

    return decode


class SharedMemoryRegion(_Region[RegionClient, Array]):
    """A POSIX shared-memory region registered with the server, made by
    ``Client.shared_memory(nbytes)``; use it as a context manager (``with``).

    ``array(dtype, shape)`` and ``put(array)`` give writable arrays of the region; ``infer``
    (and ``dml``, ``openvino``, ``onnx``, as on the client) run calls whose inputs and output
    live in it, and return the output as a view of it, without a copy. Inputs not in the region
    are copied in first. The module's docstring says how long views stay valid."""

    def open(self) -> Self:
        """Create the object and register it (a server with the extension off answers 400:
        ``BadRequestError``, and nothing is left behind)."""
        self._create()
        try:
            self._client._request(self._register_call())
        except BaseException:
            self._release()
            raise
        return self

    def close(self) -> None:
        """Unregister the region, then close and unlink the object (also if unregistering
        fails, which is then raised). Closing twice does nothing."""
        if self._state != "open":
            self._state = "closed"
            return
        try:
            self._client._request(self._unregister_call())
        finally:
            self._release()

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except Exception as error:
            if not self._exit_note(exc, error):
                raise

    def infer(
        self,
        model: str,
        inputs: Inputs,
        parameters: Parameters | None = None,
        *,
        out: Array | None = None,
        request_id: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int | NotGiven = NOT_GIVEN,
    ) -> InferResult:
        """``Client.infer`` with every tensor in the region: the result's outputs are views of
        it. ``out`` (an array of the region) receives the output instead of a new block, e.g.
        an input, in place, where the operator allows it. The output's place is planned from the
        operator tables, so the call is checked locally whatever ``local_validation`` says."""
        call = self._plan(
            self._client._registry(),
            model,
            inputs,
            parameters,
            out,
            request_id=request_id,
            timeout=timeout,
            max_retries=max_retries,
        )
        return self._client._request(call)

    def _runner(self) -> Runner[Array]:
        return output_of(self)


class AsyncSharedMemoryRegion(_Region[AsyncRegionClient, Coroutine[Any, Any, Array]]):
    """The asyncio twin of ``SharedMemoryRegion`` (``AsyncClient.shared_memory(nbytes)``):
    ``async with``, and ``infer`` and the operator methods awaited."""

    async def open(self) -> Self:
        """Create the object and register it (see ``SharedMemoryRegion.open``)."""
        self._create()
        try:
            await self._client._request(self._register_call())
        except BaseException:
            self._release()
            raise
        return self

    async def close(self) -> None:
        """Unregister, close and unlink (see ``SharedMemoryRegion.close``)."""
        if self._state != "open":
            self._state = "closed"
            return
        try:
            await self._client._request(self._unregister_call())
        finally:
            self._release()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.close()
        except Exception as error:
            if not self._exit_note(exc, error):
                raise

    async def infer(
        self,
        model: str,
        inputs: Inputs,
        parameters: Parameters | None = None,
        *,
        out: Array | None = None,
        request_id: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int | NotGiven = NOT_GIVEN,
    ) -> InferResult:
        """``SharedMemoryRegion.infer``, awaited."""
        call = self._plan(
            await self._client._registry(),
            model,
            inputs,
            parameters,
            out,
            request_id=request_id,
            timeout=timeout,
            max_retries=max_retries,
        )
        return await self._client._request(call)

    def _runner(self) -> Runner[Coroutine[Any, Any, Array]]:
        return awaited_output_of(self)


__all__ = [
    "DEFAULT_ALIGNMENT",
    "DEFAULT_PREFIX",
    "AsyncSharedMemoryRegion",
    "SharedMemoryRegion",
]
