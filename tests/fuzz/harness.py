"""What the atheris fuzz targets share: switching atheris' instrumentation on for a target's
imports, a reader of the fuzz input, and the libFuzzer entry point.

Each target still wraps its own imports (``with instrumented(__name__, ...):``): atheris
instruments the modules imported inside that block, so the block has to stand in the target,
before it imports what it fuzzes. This module imports nothing it would instrument. It is found
beside the targets: a target run by hand has ``tests/fuzz`` as ``sys.path[0]``, and pytest puts
the folder on ``sys.path`` for ``test_bounded.py``, which loads the targets from their files.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

try:
    import atheris  # type: ignore[import-untyped, unused-ignore]
except ImportError:  # the plain pytest test calls TestOneInput without atheris
    atheris = None

# The targets' server settings (``Settings(**SMALL_LIMITS)``): the NumPy backend on one thread,
# limits small enough that small inputs reach every one of them.
SMALL_LIMITS: dict[str, Any] = {
    "backend": "numpy",
    "cpu_threads": 1,
    "max_body_bytes": 1 << 16,
    "max_inflight_bytes": 1 << 20,
    "max_tensor_elements": 4096,
    "max_tensors": 8,
    "max_json_depth": 16,
    "max_json_elements": 1024,
}


def instrumented(module_name: str, *packages: str) -> AbstractContextManager[Any]:
    """Coverage instrumentation of ``packages`` for the imports inside the block, when the
    target runs as the fuzzer (``module_name`` is ``"__main__"``) and atheris is installed;
    nothing otherwise (pytest calls ``TestOneInput`` directly)."""
    if atheris is not None and module_name == "__main__":
        context: AbstractContextManager[Any] = atheris.instrument_imports(include=list(packages))
        return context
    return contextlib.nullcontext()


def fuzz(test_one_input: Callable[[bytes], None], argv: Sequence[str] | None = None) -> None:
    """Run libFuzzer on ``test_one_input`` with the command line's options (``argv``)."""
    assert atheris is not None, "atheris is not installed"
    atheris.Setup(list(sys.argv if argv is None else argv), test_one_input)
    atheris.Fuzz()


class Reader:
    """Reads the fuzz input front to back; past its end every byte is zero."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        value = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return value

    def u16(self) -> int:
        """Two bytes, little-endian."""
        return self.byte() | self.byte() << 8

    def raw(self, n: int) -> bytes:
        """The next ``n`` bytes, fewer at the end of the input."""
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def rest(self) -> bytes:
        return self.data[self.pos :]
