"""The server's limits, as the core takes them: values, not the server's configuration.

``CoreLimits`` holds the settings the core is held to (``config.Settings.core_limits`` makes it
from the environment); ``request_limits`` and ``batch.BatchLimits.of`` turn it, once a server,
into the bounds each API checks a request against.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorbits_protocol.infer import RequestLimits
from tensorbits_protocol.jsondata import JsonLimits, MemberLimit
from tensorbits_protocol.parameters import MAX_OBJECT_KEYS, MAX_PARAMETERS


@dataclass(frozen=True, slots=True)
class CoreLimits:
    """The limits of one server's requests (each the ``TENSORBITS_`` setting of its name)."""

    max_tensors: int
    max_tensor_elements: int
    max_json_elements: int
    max_json_depth: int
    max_buffers: int
    max_dispatches: int
    max_batch_header_bytes: int
    max_body_bytes: int


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


def tensors_member(max_tensors: int) -> MemberLimit:
    """TENSORBITS_MAX_TENSORS as a request's bound: its inputs and outputs together, refused in
    one way on both protocols (HTTP counts them in the JSON, gRPC on the wire)."""
    return MemberLimit(
        ("inputs", "outputs"), max_tensors, "TENSORBITS_MAX_TENSORS", "max_tensors",
        "inputs and outputs",
    )  # fmt: skip


def request_limits(limits: CoreLimits) -> RequestLimits:
    """The request limits one inference is held to, built once a runtime."""
    envelope = ENVELOPE_VALUES + ENVELOPE_VALUES_PER_TENSOR * limits.max_tensors
    return RequestLimits(
        max_tensors=limits.max_tensors,
        max_tensor_elements=limits.max_tensor_elements,
        max_json_elements=limits.max_json_elements,
        json=JsonLimits(
            limits.max_json_depth,
            limits.max_json_elements + envelope,
            members=(tensors_member(limits.max_tensors),),
            max_keys=OBJECT_KEYS + OBJECT_KEYS * limits.max_tensors,
            max_object_keys=OBJECT_KEYS,
            keys_words=KEYS_WORDS,
        ),
    )


__all__ = ["CoreLimits", "request_limits", "tensors_member"]
