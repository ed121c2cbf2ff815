"""A graph model's configuration as a Triton user writes it, checked against the file: the
runtime that reads the file (``FORMATS``: ``{"backend": "onnxruntime"}`` or ``{"platform":
"onnxruntime_onnx"}`` for an ONNX file, ``{"backend": "tensorbits"}`` or ``{"platform":
"tensorbits_graph"}`` for a graph in the /v1 binding model), optionally
with ``name``, ``max_batch_size`` (0: no implicit batch dimension) and ``input``/``output``
entries (``name``, ``data_type`` such as ``"TYPE_UINT8"``, ``dims``, -1 a variable dimension),
which must agree with the file. Keys Triton users commonly write that change no result of a
graph model are taken and not acted on (``IGNORED_KEYS``, each with why); any other key is
refused. This is Triton's protobuf JSON of ModelConfig; ``triton_pbtxt`` makes ``config.pbtxt``
(its text format) this same document, checked here as the JSON form is.

``model_config`` is the configuration the server answers with: the file's inputs and outputs
as Triton's ModelConfig, with its format's platform and backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from tensorbits.core.graphs.refusals import invalid, shown
from tensorbits.core.graphs.spec import Dim, ValueDecl
from tensorbits_protocol.errors import PayloadTooLarge
from tensorbits_protocol.jsondata import JsonLimits, parse_json


@dataclass(frozen=True, slots=True)
class GraphFormat:
    """A kind of graph model file, as a configuration names its runtime (Triton's backend or
    platform), and the file's name: in a version folder (``1/model.onnx``) and in a load
    request's parameters (``file:1/model.onnx``)."""

    backend: str
    platform: str
    file: str
    what: str  # the file, as messages name it


ONNX = GraphFormat("onnxruntime", "onnxruntime_onnx", "model.onnx", "an ONNX file")
BINDING = GraphFormat(
    "tensorbits", "tensorbits_graph", "model.json", "a graph in the /v1 binding model"
)
FORMATS = (ONNX, BINDING)
TYPE_PREFIX = "TYPE_"
MAX_CONFIG_BYTES = 64 << 10
CONFIG_JSON_LIMITS = JsonLimits(max_depth=8, max_values=4096, max_bytes=MAX_CONFIG_BYTES)
ACCEPTED_KEYS = frozenset({"name", "backend", "platform", "max_batch_size", "input", "output"})
# Taken whatever they hold, and dropped from the document: why each changes no result.
IGNORED_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "instance_group": "how many copies of the model run, and on which device: this server "
        "runs every graph model on its own backend and threads, and a copy computes what any "
        "other does",
    }
)
TENSOR_KEYS = frozenset({"name", "data_type", "dims"})


def keys_taken() -> str:
    """The keys a configuration may have, as a refusal lists them."""
    return f"it takes: {', '.join(sorted(ACCEPTED_KEYS))}; it ignores: {', '.join(IGNORED_KEYS)}"


def read_config(text: str | bytes, model: str) -> dict[str, Any]:
    """The configuration's JSON text as a document, bounded before it is parsed, with its keys,
    backend and platform checked (``check_config`` checks it against the file); the keys of
    ``IGNORED_KEYS`` are left out of it."""
    # surrogatepass: a lone surrogate (JSON's "\ud800" in a load request) is refused as the
    # bytes that are not UTF-8 that it makes, not raised here
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if len(raw) > MAX_CONFIG_BYTES:
        raise PayloadTooLarge(
            f"config: {len(raw)} bytes, more than the {MAX_CONFIG_BYTES} a configuration may have",
            field="config",
            rule="max_config_bytes",
        )
    document = parse_json(raw, CONFIG_JSON_LIMITS, "config")
    if not isinstance(document, dict):
        raise invalid("config", "config", "a model configuration is a JSON object")
    for key in document:
        if key not in ACCEPTED_KEYS and key not in IGNORED_KEYS:
            raise invalid(
                f"config.{key[:100]}",
                "unsupported_config",
                f"not a setting this server takes for a graph model ({keys_taken()})",
            )
    document = {key: value for key, value in document.items() if key not in IGNORED_KEYS}
    name = document.get("name")
    if name is not None and name != model:
        raise invalid("config.name", "model_mismatch", f"{shown(str(name))} is not {shown(model)}")
    graph_format(document)
    batch = document.get("max_batch_size", 0)
    if batch != 0 or isinstance(batch, bool):
        raise invalid(
            "config.max_batch_size",
            "max_batch_size",
            f"{shown(str(batch))}; only 0 (no implicit batch dimension: dims is the whole shape)",
        )
    return document


def _runtimes() -> str:
    return " or ".join(
        f'"backend": "{f.backend}" / "platform": "{f.platform}" ({f.what})' for f in FORMATS
    )


def graph_format(document: Mapping[str, Any]) -> GraphFormat:
    """The format the configuration's backend or platform names (both, when given, one)."""
    found: list[GraphFormat] = []
    for key in ("backend", "platform"):
        value = document.get(key)
        if value is None:
            continue
        chosen = next((f for f in FORMATS if getattr(f, key) == value), None)
        if chosen is None:
            raise invalid(
                f"config.{key}",
                "unsupported_backend",
                f"{shown(str(value))}; only {' or '.join(repr(getattr(f, key)) for f in FORMATS)}",
            )
        found.append(chosen)
    if not found:
        raise invalid(
            "config.backend", "unsupported_backend", f"name the file's runtime: {_runtimes()}"
        )
    if len(found) == 2 and found[0] != found[1]:
        raise invalid(
            "config.platform",
            "unsupported_backend",
            f"{shown(found[1].platform)} is {found[1].what}'s platform; the backend "
            f"{shown(found[0].backend)} reads {found[0].what}",
        )
    return found[0]


class Declared(Protocol):
    """What declares a model's tensors: a graph's spec or program."""

    @property
    def inputs(self) -> tuple[ValueDecl, ...]: ...
    @property
    def outputs(self) -> tuple[ValueDecl, ...]: ...


def check_config(document: Mapping[str, Any], spec: Declared) -> None:
    """Each ``input``/``output`` entry of ``document`` agrees with the file's declaration of the
    same name: its data type, its rank, each fixed dimension (-1 agrees with any)."""
    for kind, declared in (("input", spec.inputs), ("output", spec.outputs)):
        entries = document.get(kind, [])
        if not isinstance(entries, list):
            raise invalid(f"config.{kind}", "config", "a list of tensors")
        by_name = {decl.name: decl for decl in declared}
        seen: set[str] = set()
        for index, entry in enumerate(entries):
            field = f"config.{kind}[{index}]"
            _check_entry(field, entry, by_name, seen, kind)


def _check_entry(
    field: str, entry: Any, by_name: Mapping[str, ValueDecl], seen: set[str], kind: str
) -> None:
    if not isinstance(entry, dict):
        raise invalid(field, "config", "a tensor is an object with name, data_type and dims")
    for key in entry:
        if key not in TENSOR_KEYS:
            raise invalid(
                f"{field}.{key[:100]}", "unsupported_config", "a tensor takes name, data_type, dims"
            )
    name = entry.get("name")
    if not isinstance(name, str) or name not in by_name:
        raise invalid(
            f"{field}.name",
            f"unknown_{kind}",
            f"{shown(str(name))} is no {kind} of the file (its {kind}s: "
            f"{', '.join(shown(n) for n in by_name)})",
        )
    if name in seen:
        raise invalid(f"{field}.name", f"duplicate_{kind}", f"{shown(name)} is given twice")
    seen.add(name)
    decl = by_name[name]
    wanted = TYPE_PREFIX + decl.datatype.value
    data_type = entry.get("data_type")
    if data_type is not None and data_type != wanted:
        raise invalid(
            f"{field}.data_type",
            "datatype",
            f"{shown(str(data_type))}; the file declares {kind} {shown(name)} as {wanted}",
        )
    dims = entry.get("dims")
    if dims is not None:
        _check_dims(f"{field}.dims", dims, decl, kind)


def _check_dims(field: str, dims: Any, decl: ValueDecl, kind: str) -> None:
    if not isinstance(dims, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in dims
    ):
        raise invalid(field, "config", "a list of integers, -1 a variable dimension")
    if decl.dims is None:
        return  # the file gives no shape: any dims agree
    if len(dims) != len(decl.dims):
        raise invalid(
            field,
            "shape",
            f"{list(dims)} has rank {len(dims)}; the file declares {kind} {shown(decl.name)} "
            f"with rank {len(decl.dims)} ({_shown_dims(decl.dims)})",
        )
    for axis, (given, declared) in enumerate(zip(dims, decl.dims, strict=True)):
        if given == -1 or given == declared:
            continue
        raise invalid(
            field,
            "shape",
            f"dimension {axis} is {given}; the file declares {kind} {shown(decl.name)} as "
            f"{_shown_dims(decl.dims)} (-1: variable)",
        )


def _shown_dims(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else "-1" for d in dims) + "]"


def _config_tensor(decl: ValueDecl) -> dict[str, Any]:
    dims = [-1] if decl.dims is None else [d if isinstance(d, int) else -1 for d in decl.dims]
    return {"name": decl.name, "data_type": TYPE_PREFIX + decl.datatype.value, "dims": dims}


def model_config(
    name: str, spec: Declared, version: str, form: GraphFormat = ONNX
) -> dict[str, Any]:
    """The protobuf JSON of Triton's ModelConfig for the graph model (what the configuration
    routes answer)."""
    return {
        "name": name,
        "platform": form.platform,
        "backend": form.backend,
        "max_batch_size": 0,
        "version_policy": {"specific": {"versions": [int(version)]}},
        "input": [_config_tensor(d) for d in spec.inputs],
        "output": [_config_tensor(d) for d in spec.outputs],
        "parameters": {},
    }


__all__ = [
    "ACCEPTED_KEYS",
    "BINDING",
    "FORMATS",
    "IGNORED_KEYS",
    "ONNX",
    "TENSOR_KEYS",
    "GraphFormat",
    "check_config",
    "graph_format",
    "keys_taken",
    "model_config",
    "read_config",
]
