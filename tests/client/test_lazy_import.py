"""``import tensorbits_client`` loads no httpx, NumPy or pydantic models (start-up time:
bench/in_process.py --parts startup); each public name is imported when first used, and every one still works."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tensorbits_client
from tensorbits_client import _exceptions


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_import_loads_no_http_arrays_or_models() -> None:
    heavy = ("httpx", "numpy", "pydantic", "tensorbits_protocol", "tensorbits_client._client")
    code = (
        "import sys, tensorbits_client\n"
        f"print([m for m in {heavy!r} if m in sys.modules], tensorbits_client.__version__)"
    )
    assert _run(code) == f"[] {tensorbits_client.__version__}"


def test_first_use_of_a_name_imports_its_module() -> None:
    code = (
        "import sys, tensorbits_client\n"
        "tensorbits_client.Client\n"
        "print('tensorbits_client._client' in sys.modules, 'httpx' in sys.modules)"
    )
    assert _run(code) == "True True"


def test_every_public_name_resolves_to_its_definition() -> None:
    from tensorbits_client._client import AsyncClient, Client
    from tensorbits_protocol.dtypes import DataType

    assert tensorbits_client.Client is Client
    assert tensorbits_client.AsyncClient is AsyncClient
    assert tensorbits_client.DataType is DataType
    for name in tensorbits_client.__all__:
        assert getattr(tensorbits_client, name) is not None, name


def test_all_lists_every_exception() -> None:
    exceptions = [name for name in tensorbits_client.__all__ if name.endswith("Error")]
    assert sorted(exceptions) == sorted(_exceptions.__all__)
    for name in _exceptions.__all__:
        assert getattr(tensorbits_client, name) is getattr(_exceptions, name)


def test_star_import_and_submodules_work_as_before() -> None:
    code = (
        "from tensorbits_client import *\n"
        "import tensorbits_client\n"
        "print(Client.__name__, NotFoundError.__name__, hamming_distances.__name__,"
        " tensorbits_client.recipes.__name__, tensorbits_client.types.__name__,"
        " tensorbits_client._exceptions.__name__)"
    )
    assert _run(code).split() == [
        "Client",
        "NotFoundError",
        "hamming_distances",
        "tensorbits_client.recipes",
        "tensorbits_client.types",
        "tensorbits_client._exceptions",
    ]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Clinet'"):
        tensorbits_client.Clinet  # type: ignore[attr-defined]  # noqa: B018
    assert "Client" in dir(tensorbits_client)
    assert "recipes" in dir(tensorbits_client)
