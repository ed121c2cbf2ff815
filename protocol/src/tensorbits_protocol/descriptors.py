"""The rules of a tensor's descriptor (data type, shape) and of parameter values, as data, and
the checks that read them: what every front end holds a request to before it reads a byte of
any tensor, whatever form the request came in.

The REST models (``v2.RequestInput``, ``v2.RequestInputParameters`` ...) state these rules for
the JSON document, and pydantic checks them there. A front end whose request is not that
document (gRPC's ``ModelInferRequest``, already parsed by protobuf) checks the same rules here,
without building the document or a model. Both read one set of bounds: the table takes its
constants from ``v2`` (``Datatype``, ``MAX_WIRE_RANK``, ``MAX_REGION_NAME``) and ``integers``,
and tests/protocol/test_descriptor_rules.py holds the table and the models to the same answers,
value by value. A refusal says what pydantic says over HTTP for the same mistake, in the same
words, field and rule (``schema_errors``), so that a caller gets one answer whatever protocol it
speaks. A shape of too many dimensions is the exception: said in this table's words on both
(``RANK_WORDS``, which ``schema_errors`` uses in place of pydantic's), as the gRPC wire walk
refuses it in them before any check here could.

* a data type: one of ``DATATYPES`` (rule ``literal_error``);
* a shape: a list (``list_type``) of at most ``MAX_WIRE_RANK`` dimensions (``max_rank``), each
  an integer (``int_type``) within ``DIMENSION``'s bounds (``greater_than_equal``,
  ``less_than_equal``);
* a parameter: a key ``PARAMETER_VALUES`` lists at its level takes a value of its rule (a
  boolean, a bounded integer, a bounded string; ``None``, JSON's null, is as if not given, the
  models' default); any other key takes any string, number or boolean, an integer within 64
  bits (``ANY_VALUE``, rule ``parameter_value_type``): which keys are honoured, ignored or
  refused is the parameter policy's (``parameters.POLICY``, checked by
  ``check_parameter_keys``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple, get_args

from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.integers import INT64_MAX, INT64_MIN, UINT64_MAX, shown
from tensorbits_protocol.operators import did_you_mean
from tensorbits_protocol.parameters import Level, check_entries, check_tensor_parameters
from tensorbits_protocol.v2 import MAX_REGION_NAME, MAX_WIRE_RANK, Datatype

_SHOWN_CHARS = 80


def described(value: object) -> str:
    """``value`` in an error message, in bounded words whatever its size: a JSON spelling for
    scalars (a string cut at 80 characters, an integer past 40 digits by its length), a
    container by its size (never its contents, which may be the whole body)."""
    if isinstance(value, str):
        if len(value) <= _SHOWN_CHARS:
            return repr(value)
        return f"{value[:_SHOWN_CHARS]!r}... (a string of {len(value)} characters)"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, int | float):
        return shown(value)
    if isinstance(value, Mapping):
        return "an object" if value else "an empty object"
    if isinstance(value, list | tuple):
        return f"an array of {len(value)} item{'' if len(value) == 1 else 's'}"
    return f"a {type(value).__name__}"


# --- the table ----------------------------------------------------------------------------------


class Kind(StrEnum):
    """What a value must be (each the strict pydantic type the REST models use)."""

    FLAG = "flag"  # a boolean (StrictBool)
    INTEGER = "integer"  # an integer, not a boolean, within [low, high] (StrictInt, ge, le)
    TEXT = "text"  # a string of at most max_chars characters (StrictStr, max_length)
    SCALAR = "scalar"  # a string, a number or a boolean (v2.WireParameterValue)


@dataclass(frozen=True, slots=True)
class ValueRule:
    """One value's rule: its kind and, for integers, the bounds (a SCALAR's integers too); for
    strings, the most characters."""

    kind: Kind
    low: int | None = None
    high: int | None = None
    max_chars: int | None = None


FLAG = ValueRule(Kind.FLAG)
BYTE_COUNT = ValueRule(Kind.INTEGER, 0, INT64_MAX)
"""A size or offset in bytes: v2.ByteCount (Triton's are int64)."""
UINT64 = ValueRule(Kind.INTEGER, 0, UINT64_MAX)
REGION_NAME = ValueRule(Kind.TEXT, max_chars=MAX_REGION_NAME)
ANY_VALUE = ValueRule(Kind.SCALAR, INT64_MIN, UINT64_MAX)
"""A parameter no row names: v2.WireParameterValue (an integer signed or unsigned, in 64 bits)."""
DIMENSION = ValueRule(Kind.INTEGER, 0, INT64_MAX)
"""One dimension of a shape: v2.Dimension (Triton's dims are int64)."""

DATATYPES: Mapping[str, DataType] = MappingProxyType(
    {name: DataType(name) for name in get_args(Datatype)}
)
"""The data types a tensor may name: v2.Datatype's values, in its order."""

_SHARED_MEMORY = {
    "shared_memory_region": REGION_NAME,
    "shared_memory_byte_size": BYTE_COUNT,
    "shared_memory_offset": BYTE_COUNT,
}
PARAMETER_VALUES: Mapping[Level, Mapping[str, ValueRule]] = MappingProxyType(
    {
        Level.REQUEST: MappingProxyType({"binary_data_output": FLAG}),
        Level.INPUT: MappingProxyType({**_SHARED_MEMORY, "binary_data_size": UINT64}),
        Level.OUTPUT: MappingProxyType({**_SHARED_MEMORY, "binary_data": FLAG}),
    }
)
"""The parameters whose values have a rule of their own, at each level, in the order the REST
models declare them (the order pydantic checks them in, so the first refusal is the same); any
other key's value is ``ANY_VALUE``."""

RANK_RULE = "max_rank"
RANK_WORDS = (
    f"has more than {MAX_WIRE_RANK} dimensions (MAX_WIRE_RANK; operators take rank 8 at most)"
)
"""A shape past MAX_WIRE_RANK, said after its field: the gRPC wire walk's words (grpc/wire.py
refuses such a shape before it is parsed), which name the bound where pydantic's name its
internals ("List should have at most 32 items after validation")."""


# --- the checks ---------------------------------------------------------------------------------


class Where(NamedTuple):
    """Where a descriptor or a parameter map sits, for the words of a refusal: the document as
    its refusals start (``ModelInferRequest``, ``request body``), the list holding its tensor
    (``inputs``, ``outputs``; "" for the request's own parameters), its position there and its
    name."""

    what: str
    items: str = ""
    position: int = 0
    name: str = ""

    def path(self, member: str) -> str:
        return f"{self.items}[{self.position}].{member}" if self.items else member

    def refuse(self, member: str, rule: str, words: str) -> InvalidRequest:
        """The 400 for ``member`` (a path inside the tensor, or the request): the document, the
        tensor by name, the field, the words, as ``schema_errors.refusal`` writes them."""
        owner = f"{self.items[:-1]} '{self.name[:100]}': " if self.items else ""
        field = self.path(member)
        return InvalidRequest(f"{self.what}: {owner}{field}: {words}", field=field, rule=rule)


def complaint(rule: ValueRule, value: object) -> tuple[str, str] | None:
    """What is wrong with ``value`` under ``rule``, as (rule name, words), or None if nothing:
    pydantic's error type and message for the same value (with what was received)."""
    kind = rule.kind
    if kind is Kind.FLAG:
        if isinstance(value, bool):
            return None
        found = "bool_type", "Input should be a valid boolean"
    elif kind is Kind.INTEGER:
        if not isinstance(value, int) or isinstance(value, bool):
            found = "int_type", "Input should be a valid integer"
        elif rule.low is not None and value < rule.low:
            found = "greater_than_equal", f"Input should be greater than or equal to {rule.low}"
        elif rule.high is not None and value > rule.high:
            found = "less_than_equal", f"Input should be less than or equal to {rule.high}"
        else:
            return None
    elif kind is Kind.TEXT:
        if not isinstance(value, str):
            found = "string_type", "Input should be a valid string"
        elif rule.max_chars is not None and len(value) > rule.max_chars:
            plural = "" if rule.max_chars == 1 else "s"
            found = (
                "string_too_long",
                f"String should have at most {rule.max_chars} character{plural}",
            )
        else:
            return None
    else:
        if isinstance(value, bool | float | str):
            return None
        if not isinstance(value, int):
            found = "parameter_value_type", "Input should be a string, number or boolean"
        elif (rule.low is None or value >= rule.low) and (rule.high is None or value <= rule.high):
            return None
        else:
            found = (
                "parameter_value_type",
                f"Input should be a number; an integer must lie in {rule.low}..{rule.high}",
            )
    return found[0], f"{found[1]} (got {described(value)})"


def check_datatype(value: object, where: Where) -> DataType:
    """The data type ``value`` names; a 400 naming the types there are, and the closest."""
    found = DATATYPES.get(value) if isinstance(value, str) else None
    if found is not None:
        return found
    names = [f"'{name}'" for name in DATATYPES]
    words = f"Input should be {', '.join(names[:-1])} or {names[-1]} (got {described(value)}"
    if isinstance(value, str):
        words += did_you_mean(value, DATATYPES)
    raise where.refuse("datatype", "literal_error", words + ")")


def check_shape(value: object, where: Where) -> tuple[int, ...]:
    """``value`` as a shape: a list of at most ``MAX_WIRE_RANK`` dimensions, each within
    ``DIMENSION``; or a tuple, a decoder's copy of its own repeated field (protobuf's)."""
    if not isinstance(value, list | tuple):
        raise where.refuse(
            "shape", "list_type", f"Input should be a valid list (got {described(value)})"
        )
    if len(value) > MAX_WIRE_RANK:
        field = where.path("shape")
        raise InvalidRequest(f"{where.what}: {field} {RANK_WORDS}", field=field, rule=RANK_RULE)
    for index, dim in enumerate(value):
        # The common case in one test: a plain int in range (a bool is an int, and no dimension).
        if type(dim) is not int or not 0 <= dim <= INT64_MAX:
            found = complaint(DIMENSION, dim)
            if found is not None:
                raise where.refuse(f"shape[{index}]", *found)
    return tuple(value)


def check_parameter_values(level: Level, values: Mapping[str, object], where: Where) -> None:
    """Each value of a parameter map (``where``'s: the request's or a tensor's) by its key's
    rule at ``level``: the keys the table names first, in its order, then the others in the
    map's, as pydantic checks the models' fields and then their extra keys."""
    rules = PARAMETER_VALUES[level]
    for key, rule in rules.items():
        value = values.get(key)
        if value is not None:
            found = complaint(rule, value)
            if found is not None:
                raise where.refuse(f"parameters.{key}", *found)
    for key, value in values.items():
        if key not in rules:
            found = complaint(ANY_VALUE, value)
            if found is not None:
                raise where.refuse(f"parameters.{key}", *found)


def check_parameter_keys(
    level: Level, index: int, name: str, count: int, extra: Iterable[str]
) -> None:
    """A tensor's parameter map by the parameter policy: at most ``MAX_PARAMETERS`` entries
    (``count``), and each key the table does not name (``extra``, in the order given) known at
    ``level`` and not refused (``parameters.check_tensor_parameters``)."""
    check_entries(f"{level}s[{index}].parameters", count)
    check_tensor_parameters(level, index, name, extra)


__all__ = [
    "ANY_VALUE",
    "BYTE_COUNT",
    "DATATYPES",
    "DIMENSION",
    "FLAG",
    "PARAMETER_VALUES",
    "RANK_RULE",
    "RANK_WORDS",
    "REGION_NAME",
    "UINT64",
    "Kind",
    "ValueRule",
    "Where",
    "check_datatype",
    "check_parameter_keys",
    "check_parameter_values",
    "check_shape",
    "complaint",
    "described",
]
