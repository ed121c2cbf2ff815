"""A gRPC answer's bytes, written in place: grpcio sends only a ``bytes`` object, so a large
answer is built straight into one instead of into a buffer that is then copied into one.

Python's C API allows exactly this: a bytes object made by ``PyBytes_FromStringAndSize(NULL,
size)`` has uninitialised contents that its maker may write, through ``PyBytes_AsString``, until
it hands the object on ("The data must not be modified in any way, unless the object was just
created using PyBytes_FromStringAndSize(NULL, size)"). ``fresh`` makes one and gives a writable
view of its bytes; the caller writes every byte, lets the view go and returns the object. A
64 MiB answer then costs one allocation and one pass of the kernel's writes, not two
allocations (each faulting its pages in) and a 64 MiB copy. Small answers are made the plain
way: below ``FRESH_MIN_BYTES`` the copy costs less than the two C calls. An answer of several
tensors (a graph model's) is laid out whole first (``laid_out``: the protobuf-built parts
copied in, a hole left for each tensor's bytes), then its tensors written into their holes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

# Below this an answer is a bytearray copied into bytes (a copy of a few KiB is a fraction of a
# microsecond; the ctypes calls cost about one).
FRESH_MIN_BYTES = 64 << 10

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
_new_bytes.restype = ctypes.py_object
_contents = ctypes.pythonapi.PyBytes_AsString
_contents.argtypes = (ctypes.py_object,)
_contents.restype = ctypes.c_void_p


def fresh(size: int) -> tuple[bytes, memoryview]:
    """A new ``bytes`` of ``size`` uninitialised bytes and a writable view of them. Every byte
    must be written through the view before the object is handed on; nothing else may hold
    the object meanwhile."""
    made: bytes = _new_bytes(None, size)
    address = _contents(made)
    assert address is not None
    return made, memoryview((ctypes.c_char * size).from_address(address)).cast("B")


class Answer:
    """An answer laid out from its parts, in order (``laid_out``): each ``bytes`` part copied in,
    each ``int`` part a hole of that many bytes, one writable view each (``holes``), which the
    caller fills (a kernel writing an output in place) before taking the answer (``finish``).
    Large answers are one ``fresh`` object, small ones a bytearray copied out at the end."""

    __slots__ = ("_body", "_made", "holes")

    def __init__(self, parts: Sequence[bytes | int]) -> None:
        size = sum(part if isinstance(part, int) else len(part) for part in parts)
        self._made: bytes | None = None
        self._body: bytearray | memoryview
        if size >= FRESH_MIN_BYTES:
            self._made, self._body = fresh(size)
        else:
            self._body = bytearray(size)
        body = memoryview(self._body)
        self.holes: list[memoryview] = []
        at = 0
        for part in parts:
            if isinstance(part, int):
                self.holes.append(body[at : at + part])
                at += part
            else:
                body[at : at + len(part)] = part
                at += len(part)

    def finish(self) -> bytes:
        """The answer, once every hole is written (its views are dropped here; any array made
        over one must not be written after)."""
        self.holes = []
        if self._made is None:
            return bytes(self._body)
        return self._made


def laid_out(parts: Sequence[bytes | int]) -> Answer:
    """An answer of ``parts`` (``Answer``): the bytes ahead of and between its tensors' bytes,
    and each tensor's size, to be written in place."""
    return Answer(parts)


__all__ = ["FRESH_MIN_BYTES", "Answer", "fresh", "laid_out"]
