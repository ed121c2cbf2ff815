"""Everything ``Client`` and ``AsyncClient`` share: configuration, request building, response
decoding, the retry policy and the status → exception mapping.

The two clients differ only in their I/O loop (``_client.py``): both turn a call into a ``Call``
here, send it, and hand the response back here to be judged and decoded.
"""

from __future__ import annotations

import base64
import email.utils
import json
import math
import os
import random
import re
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from tensorbits_client import _constants as constants
from tensorbits_client._catalog import (
    OPERATORS_PATH,
    Catalog,
    Registry,
    check_call,
    datatype_of,
    input_names,
)
from tensorbits_client._codec import (
    HEADER_LENGTH,
    Body,
    Framed,
    InferResult,
    decode_infer,
    encode_infer,
    header_length_hint,
    plain_parameters,
    wire_array,
)
from tensorbits_client._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    InternalServerError,
    LocalValidationError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RateLimitError,
    UnprocessableEntityError,
)
from tensorbits_client._families import Families
from tensorbits_client._streaming import BodySink
from tensorbits_client._types import (
    NOT_GIVEN,
    Array,
    Headers,
    Inputs,
    NotGiven,
    Parameters,
    TimeoutTypes,
    as_array,
    given,
)
from tensorbits_protocol.schema_errors import at_field
from tensorbits_protocol.v1 import BindingGraph
from tensorbits_protocol.v2 import (
    LoadRequest,
    ModelConfigResponse,
    ModelStatisticsResponse,
    RepositoryIndexEntry,
    RepositoryIndexRequest,
)

T = TypeVar("T")
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)
R = TypeVar("R")  # what an operator method returns: the array, or an awaitable of it
M = TypeVar("M", bound=BaseModel)

HTTPX_DEFAULT_TIMEOUT = httpx.Timeout(5.0)

#: Triton's load parameters: the configuration's key, and the one file a graph model has.
LOAD_CONFIG = "config"
ONNX_MODEL_FILE = "file:1/model.onnx"
#: The configuration ``load_onnx`` sends unless told otherwise: Triton's, for an ONNX file.
ONNX_CONFIG: Mapping[str, Any] = {"backend": "onnxruntime"}

#: The file and configuration ``load_graph`` sends: a graph in the /v1 binding model.
BINDING_MODEL_FILE = "file:1/model.json"
BINDING_CONFIG: Mapping[str, Any] = {"backend": "tensorbits"}

#: What ``load_onnx`` takes as the file: its bytes, or its path.
OnnxFile = bytes | str | os.PathLike[str]

#: What ``verify=`` takes: True (the system's CAs), False (no verification), a CA bundle's path,
#: or a ready ``ssl.SSLContext`` (client certificates, pinned CAs, ...).
VerifyTypes = bool | str | os.PathLike[str] | ssl.SSLContext

_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: OverloadedError,
}


def status_error_class(status_code: int) -> type[APIStatusError]:
    """The exception class for an error status: the one place that maps statuses to classes."""
    if status_code in _STATUS_ERRORS:
        return _STATUS_ERRORS[status_code]
    return InternalServerError if status_code >= 500 else APIStatusError


_URL_FORMS = "http://host:port, https://host:port, or host:port (http:// assumed)"
# A host as a URL spells it (IDNA names decoded, IPv6 without brackets): anything else, a space
# say, is a typo that would otherwise surface only as a DNS failure after the retries.
_HOST = re.compile(r"[\w.\-:]+")
# "scheme:" not followed by a port's digit: "http:/host" or "localhost:abc", not "host:8000".
_SCHEME_WITHOUT_SLASHES = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:(?![0-9])")
# h11's words for a response whose first bytes no HTTP/1 status line begins with: a byte below
# "!" ("illegal request line", h11's name for it), or a line of them. An HTTP/2-only server, a
# gRPC port most often, answers an HTTP/1.1 request so: with a SETTINGS frame, 00 00 .. 04.
_HTTP2_ANSWER = re.compile(r"illegal request line$|illegal status line: bytearray\(b'\\x00")
GRPC_PORT_HINT = (
    "the server answered with HTTP/2 frames, not HTTP/1.1: is this the gRPC port? This client "
    "speaks HTTP/1.1: use the server's HTTP port (TENSORBITS_PORT: 8000 by default, gRPC's 8001)"
)


def resolve_base_url(base_url: str | httpx.URL | None, verify: object = True) -> httpx.URL:
    """The argument, else ``$TENSORBITS_URL``, else ``http://127.0.0.1:8000``.

    Also takes ``host:port`` and ``host`` (tritonclient's form): ``http://`` is assumed, or
    ``https://`` when ``verify`` is other than the default True (a CA bundle, an SSLContext, or
    False), since those only mean something over TLS. A URL that cannot work (another scheme, a
    bad port, no host, garbage) is refused here, at construction, rather than after the retries.
    """
    name = "base_url"
    if base_url is None:
        env = os.environ.get(constants.BASE_URL_ENV)
        name = f"${constants.BASE_URL_ENV}" if env else name
        base_url = env or constants.DEFAULT_BASE_URL
    if not isinstance(base_url, str | httpx.URL):
        raise TypeError(
            f"{name} must be a str or httpx.URL ({_URL_FORMS}), "
            f"got {type(base_url).__name__} {base_url!r:.80}"
        )
    text = str(base_url).strip()

    def refuse(why: str) -> ValueError:
        return ValueError(f"{name} {text[:200]!r}: {why} (allowed: {_URL_FORMS})")

    if "://" not in text:
        if _SCHEME_WITHOUT_SLASHES.match(text):
            raise refuse("neither a URL with '://' nor host:port")
        text_with_scheme = f"{'http' if verify is True else 'https'}://{text}"
    else:
        text_with_scheme = text
    try:
        url = httpx.URL(text_with_scheme)
    except httpx.InvalidURL as exc:
        raise refuse(str(exc)) from None
    if url.scheme not in ("http", "https"):
        raise refuse(f"scheme {url.scheme!r} is not supported")
    if not url.host or not _HOST.fullmatch(url.host):
        raise refuse("no valid host" if not url.host else f"host {url.host!r} is not valid")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise refuse(f"port {url.port} is not in 1..65535")
    if url.query or url.fragment:
        # Request paths are appended to the URL: a query or fragment would end up in between.
        raise refuse("a query or fragment cannot precede the request paths")
    return url


def resolve_api_key(api_key: str | None) -> str | None:
    """The argument, else ``$TENSORBITS_API_KEY``; None (no key sent) when both are empty."""
    key = api_key if api_key is not None else os.environ.get(constants.API_KEY_ENV)
    return key or None


def ssl_verify(verify: VerifyTypes) -> bool | ssl.SSLContext:
    """``verify`` as httpx 0.28 takes it: a CA bundle's path becomes an ``SSLContext`` that
    trusts that bundle (httpx deprecates passing the path itself)."""
    if isinstance(verify, bool | ssl.SSLContext):
        return verify
    return ssl.create_default_context(cafile=os.fspath(verify))


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request to make (and to make again on a retry) and how to decode its response."""

    method: str
    path: str
    decode: Callable[[httpx.Response, Body], T]
    body: Framed | None = None
    timeout: TimeoutTypes | NotGiven = NOT_GIVEN
    max_retries: int | NotGiven = NOT_GIVEN


def _decode_json(response: httpx.Response, body: Body) -> object:
    return json.loads(body.buffer[body.start : body.end].tobytes())


def _decode_model(model: type[M]) -> Callable[[httpx.Response, Body], M]:
    """A decoder of a JSON body into ``model`` (a pydantic ValidationError is a ValueError:
    ``_decode`` reports it as APIResponseValidationError)."""

    def decode(response: httpx.Response, body: Body) -> M:
        return model.model_validate_json(body.buffer[body.start : body.end].tobytes())

    return decode


def _decode_empty(response: httpx.Response, body: Body) -> None:
    return None


_INDEX = TypeAdapter(list[RepositoryIndexEntry])


def _decode_index(response: httpx.Response, body: Body) -> list[RepositoryIndexEntry]:
    return _INDEX.validate_json(body.buffer[body.start : body.end].tobytes())


def _decode_infer(response: httpx.Response, body: Body) -> InferResult:
    return decode_infer(body, response.headers.get(HEADER_LENGTH))


def binding_graph_file(graph: BindingGraph | Mapping[str, Any]) -> bytes:
    """A binding graph's ``model.json``: the model, or a document read by its schema first (a
    ``LocalValidationError`` with the field path and rule the server's refusal would have)."""
    if not isinstance(graph, BindingGraph):
        try:
            graph = BindingGraph.model_validate(graph)
        except ValidationError as exc:
            error = at_field(exc.errors(include_url=False), BindingGraph, "model.json")
            raise LocalValidationError.from_protocol(error) from None
    return graph.model_dump_json(exclude_none=True).encode()


def _model_path(model: str) -> str:
    return f"/v2/models/{quote(model, safe='')}"


def _repository_path(model: str) -> str:
    return f"/v2/repository/models/{quote(model, safe='')}"


def load_parameters(
    config: str | Mapping[str, Any] | None, files: Mapping[str, bytes] | None
) -> dict[str, str]:
    """Triton's load parameters: ``config`` as JSON text (a mapping is serialized), each file's
    bytes in base64 under its name (``file:<version>/<file name>``)."""
    parameters: dict[str, str] = {}
    if config is not None:
        parameters[LOAD_CONFIG] = config if isinstance(config, str) else json.dumps(dict(config))
    for name, data in (files or {}).items():
        if name == LOAD_CONFIG:
            # It would overwrite the configuration: a file's name is "file:<path>".
            raise ValueError(f"files: {name!r} is not a file's name (e.g. {ONNX_MODEL_FILE!r})")
        parameters[name] = base64.b64encode(data).decode("ascii")
    return parameters


def read_onnx_file(file: OnnxFile) -> bytes:
    """An ONNX file's bytes: ``file`` itself, or what its path holds."""
    if isinstance(file, bytes | bytearray | memoryview):
        return bytes(file)
    return Path(file).read_bytes()


def _content_length(response: httpx.Response) -> int | None:
    raw = response.headers.get("content-length")
    if raw is None or not (raw.isascii() and raw.strip().isdigit()):
        return None  # absent or odd: the body is read without a preallocated buffer
    return int(raw)


def _decoded_error_body(response: httpx.Response) -> object | None:
    """The error body as JSON if it parses, else its text, else None when empty."""
    raw = response.content
    if not raw:
        return None
    try:
        document: object = json.loads(raw)
    except ValueError:
        pass
    else:
        return document
    try:
        return response.text
    except Exception:  # an unknown charset label: keep the bytes
        return raw


def _error_message(status_code: int, reason: str, body: object | None) -> str:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):  # {"error": {"message": ...}} from other servers
            error = error.get("message")
        detail = body.get("detail")  # FastAPI's default error shape
        for candidate in (error, detail):
            if isinstance(candidate, str) and candidate:
                return candidate
    status = f"HTTP {status_code} {reason}".rstrip()
    if isinstance(body, str) and body.strip():
        return f"{status}: {body.strip()[:500]}"
    return status


def _errno_in(exc: BaseException) -> int | None:
    """The errno of the innermost OSError among the causes of ``exc`` (a few levels deep)."""
    found: int | None = None
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            break
        if isinstance(current, OSError) and isinstance(current.errno, int):
            found = current.errno
        current = current.__cause__ or current.__context__
    return found


def _str_field(body: object | None, key: str) -> str | None:
    value = body.get(key) if isinstance(body, Mapping) else None
    return value if isinstance(value, str) else None


class BaseClient(Families[R], Generic[HttpT, R]):
    """Configuration and pure logic; subclasses add the I/O for one concurrency model: the
    ``_http_class`` of their pool, and the ``_runner`` the operator families call."""

    _http: HttpT
    _http_class: type[HttpT]

    def __init__(
        self,
        base_url: str | httpx.URL | None = None,
        *,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int = constants.DEFAULT_MAX_RETRIES,
        default_headers: Headers | None = None,
        local_validation: bool = True,
        http_client: HttpT | None = None,
        api_key: str | None = None,
        verify: VerifyTypes = True,
        _catalog: Catalog | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be at least 0, got {max_retries}")
        self.base_url = resolve_base_url(base_url, verify)
        self._url_prefix = str(self.base_url).rstrip("/")
        if isinstance(timeout, NotGiven):
            # An injected httpx client's own timeout counts as the caller's choice, unless it is
            # httpx's 5 s default, which a 64 MiB call can outlast.
            injected = http_client.timeout if http_client is not None else HTTPX_DEFAULT_TIMEOUT
            timeout = constants.DEFAULT_TIMEOUT if injected == HTTPX_DEFAULT_TIMEOUT else injected
        self.timeout: TimeoutTypes = timeout
        self.max_retries = max_retries
        self.default_headers: dict[str, str] = dict(default_headers or {})
        self.local_validation = local_validation
        # Kept private and out of any repr; sent on every request (see _headers).
        self._api_key = resolve_api_key(api_key)
        self._auth_headers = (
            {"Authorization": f"Bearer {self._api_key}"} if self._api_key is not None else {}
        )
        self._verify = verify  # for the client's own pool and map()'s async twin
        # with_options copies share the tables when they talk to the same server.
        self._catalog = _catalog or Catalog()
        self._owns_http = http_client is None
        self._http = http_client or self._http_class(
            timeout=self.timeout,
            limits=constants.DEFAULT_CONNECTION_LIMITS,
            verify=ssl_verify(verify),
        )
        self._add_families()

    def with_options(
        self,
        *,
        base_url: str | httpx.URL | None = None,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
        max_retries: int | NotGiven = NOT_GIVEN,
        default_headers: Headers | None = None,
        local_validation: bool | NotGiven = NOT_GIVEN,
        api_key: str | NotGiven | None = NOT_GIVEN,
    ) -> Self:
        """A copy with some options changed (``default_headers`` are added to the current ones),
        sharing this client's connection pool, which stays this client's to close.
        ``api_key=None`` means ``$TENSORBITS_API_KEY`` again, as in the constructor."""
        same_server = (
            base_url is None
            or str(resolve_base_url(base_url, self._verify)).rstrip("/") == self._url_prefix
        )
        return type(self)(
            self.base_url if base_url is None else base_url,
            timeout=given(timeout, self.timeout),
            max_retries=given(max_retries, self.max_retries),
            default_headers={**self.default_headers, **(default_headers or {})},
            local_validation=given(local_validation, self.local_validation),
            http_client=self._http,
            api_key=given(api_key, self._api_key),
            verify=self._verify,
            _catalog=self._catalog if same_server else None,
        )

    def __repr__(self) -> str:
        # Says whether a key is set, never which.
        key = "set" if self._api_key is not None else "none"
        return f"<{type(self).__name__} base_url={str(self.base_url)!r} api_key={key}>"

    # --- request building -----------------------------------------------------------------------
    def _url(self, path: str) -> str:
        # A string join: httpx parses the URL of every request anyway, once is enough.
        return self._url_prefix + path

    def _headers(self, body: Framed | None) -> dict[str, str]:
        headers = {
            # Tensors do not compress; a server that honours gzip would only burn CPU.
            "Accept-Encoding": "identity",
            **self._auth_headers,
            **self.default_headers,  # an explicit Authorization header wins over api_key
        }
        if body is not None:
            headers.update(body.headers)
            headers["Content-Length"] = str(body.content_length)
        return headers

    def _timeout_for(self, call: Call[Any]) -> TimeoutTypes:
        return given(call.timeout, self.timeout)

    def _max_retries_for(self, call: Call[Any]) -> int:
        return given(call.max_retries, self.max_retries)

    def _needs_registry(self, inputs: Inputs) -> bool:
        # Inputs given in order need the operator's input names, checks or not.
        return self.local_validation or not isinstance(inputs, Mapping)

    def _infer_call(
        self,
        registry: Registry | None,
        model: str,
        inputs: Inputs,
        parameters: Parameters | None,
        *,
        binary: bool,
        request_id: str | None,
        timeout: TimeoutTypes | NotGiven,
        max_retries: int | NotGiven = NOT_GIVEN,
    ) -> Call[InferResult]:
        named = self._named_inputs(registry, model, inputs)
        params = plain_parameters(parameters)
        # An array with no wire data type fails here, checks or not: it cannot be sent.
        specs = {name: datatype_of(name, array) for name, array in named}
        if self.local_validation and registry is not None:
            check_call(registry, model, specs, params)
        body = encode_infer(named, params, binary=binary, request_id=request_id)
        return Call(
            "POST",
            # Quoted: a name is one path segment, whatever it holds ("/", "?", "..").
            f"{_model_path(model)}/infer",
            _decode_infer,
            body=body,
            timeout=timeout,
            max_retries=max_retries,
        )

    @staticmethod
    def _named_inputs(
        registry: Registry | None, model: str, inputs: Inputs
    ) -> list[tuple[str, Array]]:
        if isinstance(inputs, Mapping):
            items = list(inputs.items())
        else:
            values = list(inputs)
            assert registry is not None  # _needs_registry fetched it
            items = list(zip(input_names(registry, model, len(values)), values, strict=True))
        return [(name, wire_array(as_array(value))) for name, value in items]

    def _statistics_call(self, model: str | None) -> Call[ModelStatisticsResponse]:
        """GET /v2/models/stats, or /v2/models/{model}/stats (Triton's statistics extension)."""
        path = "/v2/models/stats" if model is None else f"{_model_path(model)}/stats"
        return Call("GET", path, _decode_model(ModelStatisticsResponse))

    def _model_config_call(self, model: str) -> Call[ModelConfigResponse]:
        """GET /v2/models/{model}/config (Triton's model configuration extension)."""
        return Call("GET", f"{_model_path(model)}/config", _decode_model(ModelConfigResponse))

    def _load_call(
        self,
        model: str,
        config: str | Mapping[str, Any] | None,
        files: Mapping[str, bytes] | None,
    ) -> Call[None]:
        """POST /v2/repository/models/{model}/load (Triton's model repository extension). Retried
        as any call: loading the same configuration and files again changes nothing."""
        parameters = load_parameters(config, files)
        document = LoadRequest(parameters=parameters or None).model_dump_json(exclude_none=True)
        return Call(
            "POST",
            f"{_repository_path(model)}/load",
            _decode_empty,
            body=Framed.json(document.encode()),
        )

    def _load_onnx_call(
        self, model: str, data: bytes, config: str | Mapping[str, Any] | None
    ) -> Call[None]:
        """``_load_call`` for one ONNX file, as Triton names it, with Triton's configuration for
        an ONNX file unless ``config`` says otherwise."""
        return self._load_call(
            model, ONNX_CONFIG if config is None else config, {ONNX_MODEL_FILE: data}
        )

    def _load_graph_call(
        self,
        model: str,
        graph: BindingGraph | Mapping[str, Any],
        config: str | Mapping[str, Any] | None,
    ) -> Call[None]:
        """``_load_call`` for a graph in the /v1 binding model, checked against its schema here
        (a ``LocalValidationError`` naming the field, as the server would answer 400)."""
        data = binding_graph_file(graph)
        return self._load_call(
            model, BINDING_CONFIG if config is None else config, {BINDING_MODEL_FILE: data}
        )

    def _unload_call(self, model: str) -> Call[None]:
        """POST /v2/repository/models/{model}/unload."""
        return Call(
            "POST",
            f"{_repository_path(model)}/unload",
            _decode_empty,
            max_retries=0,  # a lost answer would make the retry a 404: the graph model is gone
        )

    def _repository_index_call(self, ready: bool) -> Call[list[RepositoryIndexEntry]]:
        """POST /v2/repository/index."""
        document = RepositoryIndexRequest(ready=ready or None).model_dump_json(exclude_none=True)
        return Call(
            "POST", "/v2/repository/index", _decode_index, body=Framed.json(document.encode())
        )

    def _catalog_call(self) -> Call[object]:
        return Call("GET", OPERATORS_PATH, _decode_json)

    def _catalog_failed(self, error: APIError) -> Registry:
        """A server without /v1/operators gets the bundled tables; anything else is raised."""
        if isinstance(error, NotFoundError):
            return self._catalog.use_bundled()
        raise error

    # --- responses ------------------------------------------------------------------------------
    @staticmethod
    def _sink(response: httpx.Response, raw: bool) -> BodySink:
        # Content-Length counts the raw bytes: it sizes the buffer only when those are the body.
        length = _content_length(response) if raw else None
        return BodySink(length, header_length_hint(response.headers.get(HEADER_LENGTH)))

    @staticmethod
    def _raw_available(response: httpx.Response) -> bool:
        """Whether the raw bytes can be streamed into the sink. Not when a Content-Encoding
        makes them something else than the body (httpx decodes it then), nor when the transport
        answered with the body already in memory (``httpx.MockTransport`` does)."""
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        return encoding in ("", "identity") and not response.is_stream_consumed

    def _decode(self, call: Call[T], response: httpx.Response, sink: BodySink) -> T:
        try:
            return call.decode(response, sink.finish())
        except ValueError as exc:  # FramingError, or a view that does not fit the bytes
            raise APIResponseValidationError(response, str(exc), body=None) from None

    def _make_status_error(self, response: httpx.Response) -> APIStatusError:
        """The exception for an error response (its body already read)."""
        body = _decoded_error_body(response)
        message = _error_message(response.status_code, response.reason_phrase, body)
        return status_error_class(response.status_code)(
            message,
            response=response,
            body=body,
            code=_str_field(body, "code"),
            field=_str_field(body, "field"),
            rule=_str_field(body, "rule"),
        )

    @staticmethod
    def _transport_error(exc: httpx.TransportError, request: httpx.Request) -> APIConnectionError:
        if isinstance(exc, httpx.TimeoutException):
            return APITimeoutError(request, f"Request timed out: {type(exc).__name__}")
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.RemoteProtocolError) and _HTTP2_ANSWER.match(detail):
            # h11's words name a request line, misleading here: the hint says what it saw.
            return APIConnectionError(request, f"Connection error: {GRPC_PORT_HINT}")
        errno = _errno_in(exc)
        if errno is not None and os.strerror(errno) not in detail:
            # asyncio's connect says "All connection attempts failed" (its cause "Connect call
            # failed"): the errno underneath says why, in the words the sync client shows.
            detail = f"{detail}: [Errno {errno}] {os.strerror(errno)}"
        return APIConnectionError(request, f"Connection error: {detail}")

    # --- retry policy ---------------------------------------------------------------------------
    @staticmethod
    def _gave_up(error: APIError, attempts: int) -> None:
        """Called when ``error`` is raised after ``attempts`` tries: a connection error or timeout
        says how many (its message named the URL already)."""
        if isinstance(error, APIConnectionError):
            error._set_attempts(attempts)

    def _should_retry(self, error: APIError, retries_taken: int, max_retries: int) -> bool:
        """Connection errors and timeouts, and RETRY_STATUSES, while retries are left."""
        if retries_taken >= max_retries:
            return False
        if isinstance(error, APIConnectionError):
            return True
        return isinstance(error, APIStatusError) and error.status_code in constants.RETRY_STATUSES

    def _retry_delay(self, retries_taken: int, error: APIError) -> float:
        """Seconds to wait before retry number ``retries_taken + 1``."""
        if isinstance(error, APIStatusError):
            retry_after = self._parse_retry_after(error.response.headers.get("retry-after"))
            if retry_after is not None:
                return min(retry_after, constants.MAX_RETRY_AFTER)
        backoff = min(constants.INITIAL_RETRY_DELAY * 2.0**retries_taken, constants.MAX_RETRY_DELAY)
        return backoff * (1.0 - constants.JITTER * random.random())

    @staticmethod
    def _parse_retry_after(value: str | None, now: float | None = None) -> float | None:
        """``Retry-After`` as seconds from now: a number of seconds or an HTTP-date."""
        if value is None or not value.strip():
            return None
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError):
                return None
            if when.tzinfo is None:  # RFC 9110 dates are GMT
                return None
            seconds = when.timestamp() - (time.time() if now is None else now)
        if not math.isfinite(seconds):
            return None
        return max(seconds, 0.0)
