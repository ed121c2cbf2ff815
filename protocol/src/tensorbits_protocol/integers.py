"""Integer fields on the wire, each bounded by what its format allows.

JSON integers have no size limit, and Python's neither: a 4,000-digit offset would reach the
planner's arithmetic, and a sum of two of them could no longer even be written into an error
message (Python refuses to format integers of more than 4,300 digits). So every integer field of
both APIs is bounded in its schema, before any arithmetic or formatting: DirectML's sizes,
offsets and byte counts are 64-bit unsigned, v2's shapes are int64. A field whose own rule is
narrower (DML Sizes are 32-bit) is checked again by that rule, with its own message; the schema
only guarantees that every value the planner sees fits in 64 bits.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field, StrictFloat, StrictInt

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1

Int64 = Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX)]
UInt64 = Annotated[StrictInt, Field(ge=0, le=UINT64_MAX)]
Wide64 = Annotated[StrictInt, Field(ge=INT64_MIN, le=UINT64_MAX)]
"""Any value a 64-bit field holds, signed or unsigned: for fields whose sign the planner judges
itself (a negative offset or stride gets the DML rule's own message, not the schema's)."""


def _not_an_integer(value: object) -> object:
    # pydantic's strict float still takes an int: an integer past 64 bits would become a float
    # silently, instead of being refused as every other out-of-range integer is.
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError("an integer must fit in 64 bits")
    return value


JsonFloat = Annotated[StrictFloat, BeforeValidator(_not_an_integer)]
"""A JSON number that is not an integer: beside ``Wide64`` in a union of parameter values."""

_SHOWN_DIGITS = 40


def shown(value: object) -> str:
    """``value`` as an error message writes it: an integer of more than 40 digits by its sign and
    length (worked out from its bit length, without converting it, which Python refuses past
    4,300 digits and which would let a client choose the length of the message)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 132:
        digits = int(value.bit_length() * 0.30103) + 1  # log10(2): within one of the true count
        return f"{'-' if value < 0 else ''}an integer of about {digits} digits"
    return str(value)[: _SHOWN_DIGITS * 2]
