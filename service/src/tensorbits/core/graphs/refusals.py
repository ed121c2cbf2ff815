"""How the graph reader and planner refuse: every refusal is a ``TensorbitsError`` with a field
(``model``, ``nodes[3]``, ``inputs[0]``, ``initializers[2]`` ...) and a rule; a bound of
``GraphLimits`` passed is a ``PayloadTooLarge`` whose rule is the bound's name."""

from __future__ import annotations

from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge

# Names and other strings from the file are cut to this many characters in messages: a refusal
# must not echo a megabyte of hostile text.
SHOWN_CHARS = 100


def shown(text: str | bytes) -> str:
    """``text`` as a message quotes it: cut, and (for bytes) decoded leniently."""
    if isinstance(text, bytes):
        text = text[:SHOWN_CHARS].decode("utf-8", "replace")
    return repr(text[:SHOWN_CHARS])


def _at(field: str, message: str) -> str:
    """``<field>: <message>``; a message that begins by naming its field already (a node's
    description, ``nodes[3] 'n' ('Relu'): ...``) is not prefixed with it again."""
    named = message.startswith(field) and message[len(field) : len(field) + 1] in (" ", ":")
    return message if named else f"{field}: {message}"


def invalid(field: str, rule: str, message: str) -> InvalidRequest:
    return InvalidRequest(_at(field, message), field=field, rule=rule)


def too_large(field: str, limit: str, message: str, bound: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{_at(field, message)} (limit {bound}, GraphLimits.{limit})", field=field, rule=limit
    )
