"""A gRPC answer's bytes, written in place: grpcio sends only a ``bytes`` object, so a large
answer is built straight into one instead of into a buffer that is then copied into one.

Python's C API allows exactly this: a bytes object made by ``PyBytes_FromStringAndSize(NULL,
size)`` has uninitialised contents that its maker may write, through ``PyBytes_AsString``, until
it hands the object on ("The data must not be modified in any way, unless the object was just
created using PyBytes_FromStringAndSize(NULL, size)"). ``fresh`` makes one and gives a writable
view of its bytes; the caller writes every byte, lets the view go and returns the object. A
64 MiB answer then costs one allocation and one pass of the kernel's writes, not two
allocations (each faulting its pages in) and a 64 MiB copy. Small answers are made the plain
way: below ``FRESH_MIN_BYTES`` the copy costs less than the two C calls.
"""

from __future__ import annotations

import ctypes

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


__all__ = ["FRESH_MIN_BYTES", "fresh"]
