"""Which ``parameters`` a v2 inference request may carry, at each level, and what becomes of each.

One table (``POLICY``) for the request's own ``parameters``, each input's and each requested
output's, read alike by the HTTP/REST decoder (``infer.InferRequest.from_rest``), the gRPC one
(the server's ``grpc/decode.py``), the server's operator checks and the client's local ones
(``validation.resolve_parameters``). Every key has one of three dispositions:

* honoured: it does what the protocol says;
* ignored: accepted, and nothing is done with it, for the reason the table states (a client that
  sends it everywhere must keep working);
* refused as unsupported (``unsupported_parameter``): doing nothing would answer another question
  than the one asked.

A key may be honoured on one protocol and ignored on the other: gRPC carries bytes in its own
fields, so the binary tensor data extension's keys mean nothing there. The operator's own
parameters (``feature_level``, ``direction`` ...) are request parameters too, honoured, and are
listed by the operator (``OperatorSpec.parameters``), not here. Keys starting with
``RESERVED_PREFIX`` are ignored at every level; any other key is refused as unknown
(``unknown_parameter``), so that a misspelling is never silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.operators import did_you_mean

MAX_PARAMETERS = 64
"""Entries of one parameter map (a request's, an input's, an output's), on either protocol: the
protocol's own keys and an operator's are a handful; this bounds what a decoder builds."""


MAX_OBJECT_KEYS = MAX_PARAMETERS + 8
"""Keys of any one JSON object of a request document (v2 or /v1): a parameter map, or an object's
own members (a tensor's name, shape, datatype, data, parameters; a KServe body's model_name ...)
with room to spare. Counted on the document's bytes, before it is parsed (jsondata)."""


def too_many(field: str) -> PayloadTooLarge:
    """The refusal of a parameter map at ``field`` with more than ``MAX_PARAMETERS`` entries."""
    return PayloadTooLarge(
        f"{field} has more than {MAX_PARAMETERS} entries (the server's limit per parameter map)",
        field=field,
        rule="max_parameters",
    )


def check_entries(field: str, count: int) -> None:
    """Refuse a parameter map at ``field`` of ``count`` entries past ``MAX_PARAMETERS``."""
    if count > MAX_PARAMETERS:
        raise too_many(field)


class Level(StrEnum):
    """Where a ``parameters`` object sits in a request."""

    REQUEST = "request"
    INPUT = "input"
    OUTPUT = "output"


class Protocol(StrEnum):
    """The wire form a request came in."""

    HTTP = "http"
    GRPC = "grpc"


class Disposition(StrEnum):
    """What the server does with a parameter it is given."""

    HONOURED = "honoured"
    IGNORED = "ignored"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class ParameterRule:
    """One key's disposition over HTTP and over gRPC; ``what`` names the feature it belongs to,
    ``why`` says what it does here, or why it is ignored or refused. A key refused on one
    protocol is refused on both: the client's local checks and the request-level ones, which
    do not know the protocol, then give the server's answer."""

    http: Disposition
    grpc: Disposition
    what: str
    why: str

    def __post_init__(self) -> None:
        if (self.http is Disposition.REFUSED) != (self.grpc is Disposition.REFUSED):
            raise ValueError(f"{self.what}: refused on one protocol only")

    def on(self, protocol: Protocol) -> Disposition:
        return self.http if protocol is Protocol.HTTP else self.grpc

    @property
    def refused(self) -> bool:
        return self.http is Disposition.REFUSED


HONOURED, IGNORED, REFUSED = Disposition.HONOURED, Disposition.IGNORED, Disposition.REFUSED

# Triton reserves every parameter key that starts with this, at every level, for its own
# features, and its clients set such keys unasked: the C++ client library (so perf_analyzer and
# every C++ gRPC client) sends triton_enable_empty_final_response on each gRPC request, and newer
# clients may add others. Refusing them would refuse those clients outright. Ignoring them is safe
# for the ones Triton documents (each asks for a feature this server lacks, none changes what the
# answer means; one that did would get a refused row of its own in POLICY). Triton's own server
# refuses the reserved keys it does not know; this one accepts them, so a newer client still works.
RESERVED_PREFIX = "triton_"
RESERVED = ParameterRule(
    IGNORED,
    IGNORED,
    "a key Triton reserves",
    f"Triton reserves every key starting {RESERVED_PREFIX} for its own features, and its clients "
    "send them unasked",
)

_SEQUENCE = ParameterRule(
    IGNORED,
    IGNORED,
    "Triton's sequence batching",
    "it routes a stateful model's requests to one instance, in order; every operator here is "
    "stateless, each request complete in itself",
)
_SHARED_MEMORY = ParameterRule(
    HONOURED,
    HONOURED,
    "the shared-memory extension",
    "the tensor's bytes are in a registered region (a 400 while the extension is off)",
)
_BINARY_ON_GRPC = (
    "gRPC: outputs always go back in raw_output_contents (Triton's gRPC server does the same), "
    "so there is nothing to choose"
)

POLICY: Mapping[Level, Mapping[str, ParameterRule]] = MappingProxyType(
    {
        Level.REQUEST: MappingProxyType(
            {
                "binary_data_output": ParameterRule(
                    HONOURED,
                    IGNORED,
                    "the binary tensor data extension",
                    "HTTP: every output as binary data unless its own binary_data says "
                    f"otherwise; {_BINARY_ON_GRPC}",
                ),
                "sequence_id": _SEQUENCE,
                "sequence_start": _SEQUENCE,
                "sequence_end": _SEQUENCE,
                "priority": ParameterRule(
                    IGNORED,
                    IGNORED,
                    "Triton's scheduling priority",
                    "it orders a scheduler's queue; there is none here: a request is admitted "
                    "or refused at once",
                ),
                "timeout": ParameterRule(
                    IGNORED,
                    IGNORED,
                    "Triton's queue timeout",
                    "it bounds a request's wait in a scheduler's queue; there is none here",
                ),
                "headers": ParameterRule(
                    IGNORED,
                    IGNORED,
                    "Triton's forwarded HTTP headers",
                    "Triton's HTTP front end hands chosen HTTP headers to the model; no operator "
                    "reads any",
                ),
                "triton_enable_empty_final_response": ParameterRule(
                    IGNORED,
                    IGNORED,
                    "Triton's empty final response",
                    "it asks a decoupled model's stream (ModelStreamInfer) for an empty "
                    "response after a request's last; no model here is decoupled: each request "
                    "has one response, and on a stream it carries triton_final_response: true "
                    "itself, as Triton's does for such a model (an empty one after it would "
                    "count as a second answer). Triton's C++ client sets it on every gRPC "
                    "request",
                ),
            }
        ),
        Level.INPUT: MappingProxyType(
            {
                "binary_data_size": ParameterRule(
                    HONOURED,
                    IGNORED,
                    "the binary tensor data extension",
                    "HTTP: the input's bytes follow the JSON header, this many; gRPC: its entry "
                    "of raw_input_contents carries them, with its own length (checked against "
                    "the shape). KServe's SDK sends the size beside them",
                ),
                "shared_memory_region": _SHARED_MEMORY,
                "shared_memory_byte_size": _SHARED_MEMORY,
                "shared_memory_offset": _SHARED_MEMORY,
            }
        ),
        Level.OUTPUT: MappingProxyType(
            {
                "binary_data": ParameterRule(
                    HONOURED,
                    IGNORED,
                    "the binary tensor data extension",
                    "HTTP: this output as binary data (true) or JSON data (false), whatever "
                    f"binary_data_output says; {_BINARY_ON_GRPC}",
                ),
                "shared_memory_region": _SHARED_MEMORY,
                "shared_memory_byte_size": _SHARED_MEMORY,
                "shared_memory_offset": _SHARED_MEMORY,
                "classification": ParameterRule(
                    REFUSED,
                    REFUSED,
                    "the classification extension",
                    "it changes what the output means, to its top classes as strings: "
                    "ignoring it would answer another question",
                ),
            }
        ),
    }
)


def rule(level: Level, key: str) -> ParameterRule | None:
    """The rule for ``key`` at ``level``: the table's, the reserved prefix's, or None (unknown;
    at the request level, an operator parameter is looked up in the operator first)."""
    found = POLICY[level].get(key)
    if found is None and key.startswith(RESERVED_PREFIX):
        return RESERVED
    return found


def accepted(level: Level) -> tuple[str, ...]:
    """The table's keys at ``level`` that are not refused, in the table's order."""
    return tuple(key for key, found in POLICY[level].items() if not found.refused)


def allowed(level: Level) -> str:
    """The keys a caller may send at ``level``, for a message; the reserved ones by prefix."""
    keys = [key for key in accepted(level) if not key.startswith(RESERVED_PREFIX)]
    return ", ".join([*keys, f"{RESERVED_PREFIX}*"])


def check_parameter(
    level: Level,
    field: str,
    key: str,
    owner: str = "",
    operator: tuple[str, Sequence[str]] | None = None,
) -> None:
    """Refuse ``key``, found at ``field``, if nothing at ``level`` takes it or the table refuses
    it; ``owner`` starts the message (``"input 'A': "``). ``operator``, at the request level: the
    operator's name and its own parameters (which the caller looked ``key`` up in first), listed
    first among those allowed."""
    found = rule(level, key)
    if found is None:
        choices = list(accepted(level))
        words, of = allowed(level), ""
        if operator is not None:
            name, own = operator
            choices[:0] = own
            words, of = f"{', '.join(own) or 'none'}; the protocol's: {words}", f" for {name}"
        raise InvalidRequest(
            f"{owner}{field}: unknown parameter{of} (allowed: {words}){did_you_mean(key, choices)}",
            field=field,
            rule="unknown_parameter",
        )
    if found.refused:
        raise InvalidRequest(
            f"{owner}{field}: {found.what} is not supported ({found.why})",
            field=field,
            rule="unsupported_parameter",
        )


def check_tensor_parameters(level: Level, index: int, name: str, keys: Iterable[str]) -> None:
    """Each of ``keys`` (the parameters of the ``index``-th input or requested output, named
    ``name``, beyond those its model declares) known at ``level`` and not refused."""
    for key in keys:
        check_parameter(
            level, f"{level}s[{index}].parameters.{key[:100]}", key, f"{level} '{name[:100]}': "
        )


__all__ = [
    "POLICY",
    "RESERVED",
    "RESERVED_PREFIX",
    "Disposition",
    "Level",
    "ParameterRule",
    "Protocol",
    "accepted",
    "allowed",
    "check_parameter",
    "check_tensor_parameters",
    "rule",
]
