"""``Client`` and ``AsyncClient``: the same API, one over blocking I/O, one over asyncio.

Everything but the I/O loop is in ``_base.BaseClient``: keep the two classes line-for-line alike.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import httpx
import numpy.typing as npt

from tensorbits_client import _constants as constants
from tensorbits_client._base import BaseClient, Call, OnnxFile, read_onnx_file
from tensorbits_client._batch import Batch, PreparedBatch
from tensorbits_client._catalog import Registry
from tensorbits_client._codec import HEADER_LENGTH, Body, FramingError, InferResult, decode_batch
from tensorbits_client._exceptions import APIError, APIResponseValidationError
from tensorbits_client._families import Runner, awaited_output_of, output_of
from tensorbits_client._map import as_inputs, open_progress, pipeline, run_sync, total_of
from tensorbits_client._shared_memory import (
    DEFAULT_ALIGNMENT,
    DEFAULT_PREFIX,
    AsyncSharedMemoryRegion,
    SharedMemoryRegion,
)
from tensorbits_client._streaming import aiter_parts, iter_parts
from tensorbits_client._types import (
    NOT_GIVEN,
    Array,
    Inputs,
    NotGiven,
    Parameters,
    TimeoutTypes,
)
from tensorbits_protocol.v1 import BindingGraph
from tensorbits_protocol.v2 import (
    ModelConfigResponse,
    ModelStatisticsResponse,
    RepositoryIndexEntry,
)

T = TypeVar("T")


def _batch_decoder(plan: PreparedBatch) -> Callable[[httpx.Response, Body], dict[str, Array]]:
    def decode(response: httpx.Response, body: Body) -> dict[str, Array]:
        _, starts = decode_batch(body, response.headers.get(HEADER_LENGTH))
        return plan.results(body, starts)

    return decode


class Client(BaseClient[httpx.Client, Array]):
    """A blocking client of one tensorbits server. Create one, reuse it, close it (``with``).

    ``base_url`` defaults to ``$TENSORBITS_URL``, then ``http://127.0.0.1:8000``; ``host:port``
    means ``http://host:port`` (``https://`` when ``verify`` is not True), and a URL that cannot
    work raises ValueError here. A connection error names the URL and the attempts. ``timeout``
    defaults to 60 s with 5 s to connect. Connection errors, 408, 429, 502, 503 and 504 are
    retried ``max_retries`` times with exponential backoff (honouring ``Retry-After``).
    Calls are checked against the server's operator tables before they are sent unless
    ``local_validation=False``. ``api_key`` (default ``$TENSORBITS_API_KEY``) is sent as
    ``Authorization: Bearer`` to a server that has keys. ``verify`` checks an HTTPS server's
    certificate: True (the system's CAs, the default), a CA bundle's path, an ``ssl.SSLContext``,
    or False. ``http_client`` injects a configured ``httpx.Client`` (which the caller then
    closes; ``verify`` is then its business).
    """

    _http_class = httpx.Client

    # --- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection pool (unless it was injected or belongs to another client)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- calls ----------------------------------------------------------------------------------
    def infer(
        self,
        model: str,
        inputs: Inputs | npt.NDArray[Any],
        parameters: Parameters | None = None,
        *,
        binary: bool = True,
        request_id: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int | NotGiven = NOT_GIVEN,
    ) -> InferResult:
        """Run ``model`` (a v2 model name) on ``inputs``, by name or in the operator's order; an
        array alone is the one input of a unary operator (as ``map`` takes it).

        ``binary=False`` sends and receives JSON instead of the binary extension."""
        inputs = as_inputs(inputs)
        registry = self._registry() if self._needs_registry(inputs) else None
        call = self._infer_call(
            registry,
            model,
            inputs,
            parameters,
            binary=binary,
            request_id=request_id,
            timeout=timeout,
            max_retries=max_retries,
        )
        return self._request(call)

    def _runner(self) -> Runner[Array]:
        return output_of(self)

    def map(
        self,
        model: str,
        items: Iterable[Inputs | npt.NDArray[Any]],
        parameters: Parameters | None = None,
        *,
        concurrency: int = constants.DEFAULT_MAP_CONCURRENCY,
        progress: bool = False,
        binary: bool = True,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> list[Array]:
        """``[infer(model, item).output for item in items]``, with ``concurrency`` requests in
        flight (an ``AsyncClient`` with this client's options, on a private event loop).

        An item is the inputs of one call, or a single array for a unary operator. ``progress``
        shows a tqdm bar (the ``progress`` extra)."""

        async def run() -> list[Array]:
            async with self._async_twin() as twin:
                return await twin.map(
                    model,
                    items,
                    parameters,
                    concurrency=concurrency,
                    progress=progress,
                    binary=binary,
                    timeout=timeout,
                )

        return run_sync(run())

    def _async_twin(self) -> AsyncClient:
        return AsyncClient(
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=self.max_retries,
            default_headers=self.default_headers,
            local_validation=self.local_validation,
            api_key=self._api_key,
            verify=self._verify,
            _catalog=self._catalog,
        )

    def shared_memory(
        self, nbytes: int, *, prefix: str = DEFAULT_PREFIX, alignment: int = DEFAULT_ALIGNMENT
    ) -> SharedMemoryRegion:
        """A POSIX shared-memory region of ``nbytes`` for a client on the server's host: ``with``
        creates and registers it (the server needs ``TENSORBITS_SHARED_MEMORY=true``) and then
        unregisters and unlinks it. Its ``infer`` and operator methods pass tensors by reference
        and return views of the region. ``prefix`` must match the server's
        ``TENSORBITS_SHARED_MEMORY_PREFIX``; each array starts at a multiple of ``alignment``."""
        return SharedMemoryRegion(self, nbytes, prefix=prefix, alignment=alignment)

    def batch(self, request_id: str | None = None) -> Batch[dict[str, Array]]:
        """A new /v1 batch; ``run()`` sends it and returns its outputs by buffer name."""
        return Batch(self._run_batch, request_id)

    def _run_batch(self, plan: PreparedBatch, timeout: TimeoutTypes | NotGiven) -> dict[str, Array]:
        call = Call("POST", "/v1/batch", _batch_decoder(plan), body=plan.body, timeout=timeout)
        result: dict[str, Array] = self._request(call)
        return result

    def operators(self) -> Registry:
        """The server's operator tables (fetched once, then cached)."""
        return self._registry()

    def statistics(self, model: str | None = None) -> ModelStatisticsResponse:
        """Inference statistics (Triton's statistics extension) of ``model``, or of every model:
        counts and summed durations since the server started, by phase."""
        return self._request(self._statistics_call(model))

    def model_config(self, model: str) -> ModelConfigResponse:
        """``model``'s configuration in Triton's form (ModelConfig): its inputs and outputs, and
        in ``parameters`` every data type, rank and request parameter it takes."""
        return self._request(self._model_config_call(model))

    def load_model(
        self,
        model: str,
        *,
        config: str | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load ``model`` (Triton's model repository extension). With ``files`` (by Triton's
        names: ``{"file:1/model.onnx": data}``) and its ``config`` (JSON text, or a mapping
        sent as JSON), a graph model, replacing one of that name; without, a built-in model
        unloaded before. A refused load raises ``BadRequestError`` (``rule`` says why) or
        ``PayloadTooLargeError`` and loads nothing (a model of that name stays as it was)."""
        self._request(self._load_call(model, config, files))

    def load_onnx(
        self,
        model: str,
        file: OnnxFile,
        *,
        config: str | Mapping[str, Any] | None = None,
    ) -> None:
        """Load an ONNX file (its bytes, or its path) as the graph model ``model``:
        ``load_model`` with the file as ``file:1/model.onnx`` and ``config`` defaulting to
        ``{"backend": "onnxruntime"}``."""
        self._request(self._load_onnx_call(model, read_onnx_file(file), config))

    def load_graph(
        self,
        model: str,
        graph: BindingGraph | Mapping[str, Any],
        *,
        config: str | Mapping[str, Any] | None = None,
    ) -> None:
        """Load a graph in the /v1 binding model (``BindingGraph``, or its JSON document) as
        the graph model ``model``: its buffers and dispatches, with named model inputs and
        outputs, checked against the schema before sending; ``load_model`` with the file as
        ``file:1/model.json`` and ``config`` defaulting to ``{"backend": "tensorbits"}``."""
        self._request(self._load_graph_call(model, graph, config))

    def unload_model(self, model: str) -> None:
        """Unload ``model``: a graph model is removed (its inferences then raise
        ``NotFoundError`` until it is loaded again with its file); a built-in one is not ready
        until ``load_model(model)``."""
        self._request(self._unload_call(model))

    def repository_index(self, *, ready: bool = False) -> list[RepositoryIndexEntry]:
        """Every model the server has (Triton's repository index): name, version, ``state``
        (READY or UNAVAILABLE) and why it is unavailable; ``ready=True``: the READY ones only."""
        return self._request(self._repository_index_call(ready))

    def _registry(self) -> Registry:
        if self._catalog.registry is not None:
            return self._catalog.registry
        try:
            body = self._request(self._catalog_call())
        except APIError as error:
            return self._catalog_failed(error)
        return self._catalog.load(body)

    # --- I/O ------------------------------------------------------------------------------------
    def _request(self, call: Call[T]) -> T:
        max_retries = self._max_retries_for(call)
        retries_taken = 0
        while True:
            try:
                return self._send(call)
            except APIError as error:
                if not self._should_retry(error, retries_taken, max_retries):
                    self._gave_up(error, retries_taken + 1)
                    raise
                self._sleep(self._retry_delay(retries_taken, error))
                retries_taken += 1

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _send(self, call: Call[T]) -> T:
        # httpx's annotation says bytes; h11 sends any buffer, and memoryviews avoid a copy.
        request = self._http.build_request(
            call.method,
            self._url(call.path),
            content=None if call.body is None else cast(Iterator[bytes], iter_parts(call.body)),
            headers=self._headers(call.body),
            timeout=self._timeout_for(call),
        )
        try:
            response = self._http.send(request, stream=True)
            try:
                if response.is_error:
                    response.read()
                    raise self._make_status_error(response)
                raw = self._raw_available(response)
                sink = self._sink(response, raw)
                if raw:
                    for chunk in response.iter_raw():
                        sink.feed(chunk)
                else:
                    sink.feed(response.read())
            finally:
                response.close()
        except httpx.TransportError as exc:
            raise self._transport_error(exc, request) from exc
        except FramingError as exc:
            raise APIResponseValidationError(response, str(exc), body=None) from None
        return self._decode(call, response, sink)


class AsyncClient(BaseClient[httpx.AsyncClient, Coroutine[Any, Any, Array]]):
    """The asyncio twin of ``Client``: the same options and methods, awaited.

    An ``AsyncClient`` belongs to the event loop it is first used on; create it inside that
    loop and close it there (``async with``).
    """

    _http_class = httpx.AsyncClient

    # --- lifecycle ------------------------------------------------------------------------------
    async def close(self) -> None:
        """Close the connection pool (unless it was injected or belongs to another client)."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- calls ----------------------------------------------------------------------------------
    async def infer(
        self,
        model: str,
        inputs: Inputs | npt.NDArray[Any],
        parameters: Parameters | None = None,
        *,
        binary: bool = True,
        request_id: str | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int | NotGiven = NOT_GIVEN,
    ) -> InferResult:
        """Run ``model`` (a v2 model name) on ``inputs``, by name or in the operator's order; an
        array alone is the one input of a unary operator (as ``map`` takes it).

        ``binary=False`` sends and receives JSON instead of the binary extension."""
        inputs = as_inputs(inputs)
        registry = await self._registry() if self._needs_registry(inputs) else None
        call = self._infer_call(
            registry,
            model,
            inputs,
            parameters,
            binary=binary,
            request_id=request_id,
            timeout=timeout,
            max_retries=max_retries,
        )
        return await self._request(call)

    def _runner(self) -> Runner[Coroutine[Any, Any, Array]]:
        return awaited_output_of(self)

    async def map(
        self,
        model: str,
        items: Iterable[Inputs | npt.NDArray[Any]],
        parameters: Parameters | None = None,
        *,
        concurrency: int = constants.DEFAULT_MAP_CONCURRENCY,
        progress: bool = False,
        binary: bool = True,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> list[Array]:
        """``[(await infer(model, item)).output for item in items]``, with ``concurrency``
        requests in flight; results in input order. An item is the inputs of one call, or a
        single array for a unary operator. ``progress`` shows a tqdm bar (``progress`` extra)."""

        async def one(item: Inputs | npt.NDArray[Any]) -> Array:
            result = await self.infer(model, item, parameters, binary=binary, timeout=timeout)
            return result.output

        bar = open_progress(progress, total_of(items), model)
        try:
            return await pipeline(items, one, concurrency=concurrency, progress=bar)
        finally:
            bar.close()

    def shared_memory(
        self, nbytes: int, *, prefix: str = DEFAULT_PREFIX, alignment: int = DEFAULT_ALIGNMENT
    ) -> AsyncSharedMemoryRegion:
        """``Client.shared_memory``, used with ``async with``; its ``infer`` is awaited."""
        return AsyncSharedMemoryRegion(self, nbytes, prefix=prefix, alignment=alignment)

    def batch(self, request_id: str | None = None) -> Batch[Coroutine[Any, Any, dict[str, Array]]]:
        """A new /v1 batch; ``await batch.run()`` sends it and returns its outputs by name."""
        return Batch(self._run_batch, request_id)

    async def _run_batch(
        self, plan: PreparedBatch, timeout: TimeoutTypes | NotGiven
    ) -> dict[str, Array]:
        call = Call("POST", "/v1/batch", _batch_decoder(plan), body=plan.body, timeout=timeout)
        result: dict[str, Array] = await self._request(call)
        return result

    async def operators(self) -> Registry:
        """The server's operator tables (fetched once, then cached)."""
        return await self._registry()

    async def statistics(self, model: str | None = None) -> ModelStatisticsResponse:
        """Inference statistics (Triton's statistics extension) of ``model``, or of every model:
        counts and summed durations since the server started, by phase."""
        return await self._request(self._statistics_call(model))

    async def model_config(self, model: str) -> ModelConfigResponse:
        """``model``'s configuration in Triton's form (ModelConfig): its inputs and outputs, and
        in ``parameters`` every data type, rank and request parameter it takes."""
        return await self._request(self._model_config_call(model))

    async def load_model(
        self,
        model: str,
        *,
        config: str | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load ``model`` (Triton's model repository extension). With ``files`` (by Triton's
        names: ``{"file:1/model.onnx": data}``) and its ``config`` (JSON text, or a mapping
        sent as JSON), a graph model, replacing one of that name; without, a built-in model
        unloaded before. A refused load raises ``BadRequestError`` (``rule`` says why) or
        ``PayloadTooLargeError`` and loads nothing (a model of that name stays as it was)."""
        await self._request(self._load_call(model, config, files))

    async def load_onnx(
        self,
        model: str,
        file: OnnxFile,
        *,
        config: str | Mapping[str, Any] | None = None,
    ) -> None:
        """Load an ONNX file (its bytes, or its path, read in a worker thread) as the graph
        model ``model``: ``load_model`` with the file as ``file:1/model.onnx`` and ``config``
        defaulting to ``{"backend": "onnxruntime"}``."""
        if isinstance(file, str | os.PathLike):
            data = await asyncio.to_thread(read_onnx_file, file)
        else:
            data = read_onnx_file(file)
        await self._request(self._load_onnx_call(model, data, config))

    async def load_graph(
        self,
        model: str,
        graph: BindingGraph | Mapping[str, Any],
        *,
        config: str | Mapping[str, Any] | None = None,
    ) -> None:
        """Load a graph in the /v1 binding model (``BindingGraph``, or its JSON document) as
        the graph model ``model``: its buffers and dispatches, with named model inputs and
        outputs, checked against the schema before sending; ``load_model`` with the file as
        ``file:1/model.json`` and ``config`` defaulting to ``{"backend": "tensorbits"}``."""
        await self._request(self._load_graph_call(model, graph, config))

    async def unload_model(self, model: str) -> None:
        """Unload ``model``: a graph model is removed (its inferences then raise
        ``NotFoundError`` until it is loaded again with its file); a built-in one is not ready
        until ``load_model(model)``."""
        await self._request(self._unload_call(model))

    async def repository_index(self, *, ready: bool = False) -> list[RepositoryIndexEntry]:
        """Every model the server has (Triton's repository index): name, version, ``state``
        (READY or UNAVAILABLE) and why it is unavailable; ``ready=True``: the READY ones only."""
        return await self._request(self._repository_index_call(ready))

    async def _registry(self) -> Registry:
        if self._catalog.registry is not None:
            return self._catalog.registry
        try:
            body = await self._request(self._catalog_call())
        except APIError as error:
            return self._catalog_failed(error)
        return self._catalog.load(body)

    # --- I/O ------------------------------------------------------------------------------------
    async def _request(self, call: Call[T]) -> T:
        max_retries = self._max_retries_for(call)
        retries_taken = 0
        while True:
            try:
                return await self._send(call)
            except APIError as error:
                if not self._should_retry(error, retries_taken, max_retries):
                    self._gave_up(error, retries_taken + 1)
                    raise
                await self._sleep(self._retry_delay(retries_taken, error))
                retries_taken += 1

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _send(self, call: Call[T]) -> T:
        # httpx's annotation says bytes; h11 sends any buffer, and memoryviews avoid a copy.
        request = self._http.build_request(
            call.method,
            self._url(call.path),
            content=None
            if call.body is None
            else cast(AsyncIterator[bytes], aiter_parts(call.body)),
            headers=self._headers(call.body),
            timeout=self._timeout_for(call),
        )
        try:
            response = await self._http.send(request, stream=True)
            try:
                if response.is_error:
                    await response.aread()
                    raise self._make_status_error(response)
                raw = self._raw_available(response)
                sink = self._sink(response, raw)
                if raw:
                    async for chunk in response.aiter_raw():
                        sink.feed(chunk)
                else:
                    sink.feed(await response.aread())
            finally:
                await response.aclose()
        except httpx.TransportError as exc:
            raise self._transport_error(exc, request) from exc
        except FramingError as exc:
            raise APIResponseValidationError(response, str(exc), body=None) from None
        return self._decode(call, response, sink)
