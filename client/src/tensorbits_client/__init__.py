"""Typed Python client for the tensorbits service: NumPy arrays in, NumPy arrays out.

    from tensorbits_client import Client

    with Client("http://127.0.0.1:8000") as client:
        out = client.dml.bit_xor(a, b)

``Client`` and ``AsyncClient`` have the same methods; the exceptions are drawn as a tree in
``tensorbits_client._exceptions``. docs/client.md has the guide.
"""

from tensorbits_client import _exceptions
from tensorbits_client._batch import Batch, Binding, Buffer
from tensorbits_client._client import AsyncClient, Client
from tensorbits_client._codec import InferResult
from tensorbits_client._constants import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from tensorbits_client._exceptions import *  # noqa: F403  (every exception, by _exceptions.__all__)
from tensorbits_client._types import NOT_GIVEN, NotGiven
from tensorbits_client._version import __version__
from tensorbits_client.recipes import async_hamming_distances, hamming_distances
from tensorbits_protocol.dtypes import DataType

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "NOT_GIVEN",
    "AsyncClient",
    "Batch",
    "Binding",
    "Buffer",
    "Client",
    "DataType",
    "InferResult",
    "NotGiven",
    "__version__",
    "async_hamming_distances",
    "hamming_distances",
]
__all__ += _exceptions.__all__
