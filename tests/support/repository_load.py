"""Triton's load over HTTP, the body ``tritonclient.http.load_model(name, config=..., files=...)``
sends, built here with the standard library (the base64 as text): the live tests send any
parameters with it, those the stock client would not build included."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

from tensorbits.runtime import Runtime


def load_parameters(config: str, files: Mapping[str, bytes]) -> dict[str, str]:
    """The load's parameters: the configuration's text, and each file in base64 by its name."""
    return {"config": config, **{n: base64.b64encode(d).decode() for n, d in files.items()}}


def http_load(
    base_url: str, name: str, parameters: Mapping[str, str]
) -> tuple[int, dict[str, Any]]:
    """``POST /v2/repository/models/{name}/load`` with ``parameters``: the status, and the error
    document of a refusal ({} when loaded)."""
    request = urllib.request.Request(
        f"{base_url}/v2/repository/models/{name}/load",
        data=json.dumps({"parameters": dict(parameters)}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def load_runtime(max_model_bytes: int) -> Runtime:
    """A stand-in of the runtime a load's reading consults, in process: its model-file bound
    (``TENSORBITS_MAX_MODEL_BYTES``) and nothing else."""
    limits = SimpleNamespace(max_model_bytes=max_model_bytes)
    return cast(
        Runtime, SimpleNamespace(plane=SimpleNamespace(graphs=SimpleNamespace(limits=limits)))
    )
