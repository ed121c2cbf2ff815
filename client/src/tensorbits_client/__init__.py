"""Typed Python client for the tensorbits service: NumPy arrays in, NumPy arrays out.

    from tensorbits_client import Client

    with Client("http://127.0.0.1:8000") as client:
        out = client.dml.bit_xor(a, b)

``Client`` and ``AsyncClient`` have the same methods; the exceptions are drawn as a tree in
``tensorbits_client._exceptions``. docs/client.md has the guide.
"""

# ruff: noqa: F403, F405  (the exceptions come by one star import, read off _exceptions.__all__)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tensorbits_client._version import __version__

# Each public name is imported from its module when first used (PEP 562): `import
# tensorbits_client` loads no httpx, NumPy or pydantic models (about 0.6 s of imports, most of
# it in httpx and NumPy; docs/benchmarks.md, CLI start-up). Type checkers and readers see the
# names as ordinary imports below.
if TYPE_CHECKING:
    from tensorbits_client import _exceptions as _exceptions
    from tensorbits_client import recipes as recipes
    from tensorbits_client import types as types
    from tensorbits_client._batch import Batch, Binding, Buffer
    from tensorbits_client._client import AsyncClient, Client
    from tensorbits_client._codec import InferResult
    from tensorbits_client._constants import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
    from tensorbits_client._exceptions import *  # every one, as its __all__ lists them
    from tensorbits_client._shared_memory import AsyncSharedMemoryRegion, SharedMemoryRegion
    from tensorbits_client._types import NOT_GIVEN, NotGiven
    from tensorbits_client.recipes import async_hamming_distances, hamming_distances
    from tensorbits_protocol.dtypes import DataType

# name -> the module it is defined in.
_LAZY: dict[str, str] = {
    "AsyncClient": "tensorbits_client._client",
    "AsyncSharedMemoryRegion": "tensorbits_client._shared_memory",
    "Batch": "tensorbits_client._batch",
    "Binding": "tensorbits_client._batch",
    "Buffer": "tensorbits_client._batch",
    "Client": "tensorbits_client._client",
    "DEFAULT_MAX_RETRIES": "tensorbits_client._constants",
    "DEFAULT_TIMEOUT": "tensorbits_client._constants",
    "DataType": "tensorbits_protocol.dtypes",
    "InferResult": "tensorbits_client._codec",
    "NOT_GIVEN": "tensorbits_client._types",
    "NotGiven": "tensorbits_client._types",
    "SharedMemoryRegion": "tensorbits_client._shared_memory",
    "async_hamming_distances": "tensorbits_client.recipes",
    "hamming_distances": "tensorbits_client.recipes",
}
# Submodules an eager import used to leave as attributes (`tensorbits_client.recipes` after a
# plain `import tensorbits_client`): still reachable that way.
_SUBMODULES = frozenset({"_exceptions", "recipes", "types"})

# With every exception of _exceptions.__all__ (a test holds the two lists equal).
__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "NOT_GIVEN",
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncClient",
    "AsyncSharedMemoryRegion",
    "AuthenticationError",
    "BadRequestError",
    "Batch",
    "Binding",
    "Buffer",
    "Client",
    "DataType",
    "InferResult",
    "InternalServerError",
    "LocalValidationError",
    "NotFoundError",
    "NotGiven",
    "OverloadedError",
    "PayloadTooLargeError",
    "RateLimitError",
    "SharedMemoryRegion",
    "TensorbitsClientError",
    "UnprocessableEntityError",
    "__version__",
    "async_hamming_distances",
    "hamming_distances",
]
# The exceptions are the names that end in "Error"; every one is defined in _exceptions.
_LAZY.update((name, "tensorbits_client._exceptions") for name in __all__ if name.endswith("Error"))


# Hidden from type checkers, which would otherwise accept any attribute (a misspelt name
# included) as Any: they see the imports above instead.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name in _LAZY:
            value = getattr(importlib.import_module(_LAZY[name]), name)
        elif name in _SUBMODULES:
            value = importlib.import_module(f"{__name__}.{name}")
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value  # once: later lookups find it without calling here
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__, *_SUBMODULES})
