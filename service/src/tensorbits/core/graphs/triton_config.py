"""A graph model's configuration as a Triton user writes it: Triton's ``ModelConfig``
(``model_config_pb2``, the whole of ``model_config.proto``), as protobuf JSON over the load API
or ``config.json``, as its text format in ``config.pbtxt`` (``triton_pbtxt`` makes that the same
JSON document). The JSON text is bounded before it is parsed (``MAX_CONFIG_BYTES``, then the
depth and count of its values), its keys checked against the schema at every depth (a key the
schema lacks is refused naming its path, with the closest), then parsed by protobuf's
``json_format``: a field by its proto name or its JSON name (``data_type``, ``dataType``), a
64-bit integer as a number or a string, an enum by name or number.

What each field does here is ``config_fields``' table: an honoured field is checked (the
runtime that reads the file, ``FORMATS``: ``{"backend": "onnxruntime"}`` or ``{"platform":
"onnxruntime_onnx"}`` for an ONNX file, ``{"backend": "tensorbits"}`` or ``{"platform":
"tensorbits_graph"}`` for a graph in the /v1 binding model; ``name``; ``max_batch_size``;
``version_policy``; ``default_model_filename``; ``input``/``output`` entries that must agree with
the file, ``check_config``), an ignored one is dropped, a refused one that says anything is
refused with why (``unsupported_config``).

``model_config`` is the configuration the server answers with: the file's inputs and outputs
as Triton's ModelConfig (without the batch dimension when ``max_batch_size`` is above 0), with
its format's platform and backend and the version served."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from tensorbits.core.graphs.config_fields import (
    MODEL_FIELDS,
    TENSOR_FIELDS,
    FieldRule,
    Treatment,
    fields,
)
from tensorbits.core.graphs.model_config_pb2 import ModelConfig
from tensorbits.core.graphs.refusals import invalid, shown
from tensorbits.core.graphs.spec import Dim, ValueDecl
from tensorbits_protocol.errors import PayloadTooLarge
from tensorbits_protocol.jsondata import JsonLimits, parse_json
from tensorbits_protocol.operators import did_you_mean


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
# The configuration Triton completes an ONNX model's from when its folder holds none: the file
# says the rest (inputs, outputs, their types and dims).
COMPLETED_ONNX_CONFIG = '{"platform": "onnxruntime_onnx", "backend": "onnxruntime"}'
ACCEPTED_KEYS = frozenset(fields(Treatment.HONOURED))
# Taken whatever they hold, and dropped from the document: why each changes no result.
IGNORED_KEYS: Mapping[str, str] = MappingProxyType(
    {
        name: rule.reason
        for name, rule in MODEL_FIELDS.items()
        if rule.treatment is Treatment.IGNORED
    }
)
TENSOR_KEYS = frozenset(("name", "data_type", "dims"))
_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def keys_taken() -> str:
    """The keys a configuration may have, as a refusal lists them."""
    return f"it takes: {', '.join(sorted(ACCEPTED_KEYS))}; it ignores: {', '.join(IGNORED_KEYS)}"


def read_config(text: str | bytes, model: str) -> dict[str, Any]:
    """The configuration's JSON text as a document, bounded before it is parsed, parsed into
    ``ModelConfig``, each field treated as ``config_fields`` says, its name, backend, platform,
    batch size and file name checked (``check_config`` checks it against the file). The
    document holds the honoured fields (proto names, 64-bit integers as numbers)."""
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
    _check_keys(document, ModelConfig.DESCRIPTOR, "config")
    message = ModelConfig()
    try:
        json_format.ParseDict(document, message)
    except json_format.ParseError as exc:
        words = str(exc)
        raise invalid(
            "config", "config", f"not protobuf JSON of ModelConfig: {words[:300]}"
        ) from None
    _apply_rules(message, MODEL_FIELDS, "config")
    for kind in ("input", "output"):
        for index, entry in enumerate(getattr(message, kind)):
            _apply_rules(entry, TENSOR_FIELDS[kind], f"config.{kind}[{index}]")
    document = as_document(message)
    name = document.get("name")
    if name is not None and name != model:
        raise invalid("config.name", "model_mismatch", f"{shown(str(name))} is not {shown(model)}")
    form = graph_format(document)
    if document.get("max_batch_size", 0) < 0:
        raise invalid(
            "config.max_batch_size",
            "max_batch_size",
            f"{document['max_batch_size']}; 0 (no batch dimension: dims is the whole shape) or "
            "more (the first dimension is the batch, at most this)",
        )
    filename = document.pop("default_model_filename", form.file)
    if filename != form.file:
        raise invalid(
            "config.default_model_filename",
            "unsupported_config",
            f"{shown(str(filename))}; {form.what} is read from <version>/{form.file}, the only "
            "name read",
        )
    return document


def as_document(message: Message) -> dict[str, Any]:
    """``message`` as its protobuf JSON with proto field names, 64-bit integers as numbers (as a
    Triton user writes them, and as Triton's HTTP answers them)."""
    document = json_format.MessageToDict(message, preserving_proto_field_name=True)
    _integers(message, document)
    return document


def _check_keys(document: Mapping[str, Any], descriptor: Descriptor, path: str) -> None:
    """Every key of ``document``, at every depth, a field of ``descriptor``'s message by its
    proto or JSON name; refused naming its path and the closest field."""
    by_name = {**descriptor.fields_by_name, **{f.json_name: f for f in descriptor.fields}}
    for key, value in document.items():
        field = by_name.get(key) if isinstance(key, str) else None
        if field is None:
            names = [f.name for f in descriptor.fields]
            taken = (
                f"not a setting this server takes for a graph model ({keys_taken()})"
                if descriptor is ModelConfig.DESCRIPTOR
                else f"{descriptor.name} has no such field (its fields: {', '.join(names)})"
            )
            raise invalid(
                f"{path}.{str(key)[:100]}",
                "unsupported_config",
                f"{taken}{did_you_mean(str(key), names)}",
            )
        sub = field.message_type
        if sub is None:
            continue
        where = f"{path}.{field.name}"
        if sub.GetOptions().map_entry:
            values = sub.fields_by_name["value"].message_type
            if values is not None and isinstance(value, dict):
                for entry_key, entry in value.items():
                    if isinstance(entry, dict):
                        _check_keys(entry, values, f"{where}.{str(entry_key)[:100]}")
        elif isinstance(value, list):
            for index, entry in enumerate(value):
                if isinstance(entry, dict):
                    _check_keys(entry, sub, f"{where}[{index}]")
        elif isinstance(value, dict) and sub.full_name not in _OPAQUE:
            _check_keys(value, sub, where)


# Messages whose JSON form is not an object of fields (protobuf's well-known types).
_OPAQUE = frozenset({"google.protobuf.Any", "google.protobuf.Struct", "google.protobuf.Value"})


def _says_something(message: Message, field: FieldDescriptor, value: Any) -> bool:
    if field.message_type is not None and not field.is_repeated:
        return bool(value.ByteSize())
    return True  # ListFields gives a scalar, a list or a map only when it is not its default


def _apply_rules(message: Message, table: Mapping[str, FieldRule], path: str) -> None:
    """Each set field of ``message`` as ``table`` says: a refused one that says something is
    refused with why, an ignored one cleared."""
    for field, value in message.ListFields():
        rule = table.get(field.name, FieldRule(Treatment.REFUSED, "not in this server's table"))
        if rule.treatment is Treatment.IGNORED:
            message.ClearField(field.name)
        elif rule.treatment is Treatment.REFUSED and _says_something(message, field, value):
            raise invalid(
                f"{path}.{field.name}",
                "unsupported_config",
                f"refused for a graph model here: {rule.reason}",
            )
        elif rule.treatment is Treatment.REFUSED:
            message.ClearField(field.name)


def _integers(message: Message, document: dict[str, Any]) -> None:
    """Each 64-bit integer field of ``message``, which ``document`` (its ``MessageToDict``) holds
    as a string, made a number again, in place, at every depth."""
    for field, value in message.ListFields():
        if field.type in _INT64:
            given = document[field.name]
            document[field.name] = [int(v) for v in given] if field.is_repeated else int(given)
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            values = field.message_type.fields_by_name["value"]
            if values.message_type is not None:
                for key, entry in value.items():
                    _integers(entry, document[field.name][str(key)])
        elif field.message_type is not None:
            entries = document[field.name]
            for sub, entry in zip(
                value if field.is_repeated else [value],
                entries if field.is_repeated else [entries],
                strict=True,
            ):
                _integers(sub, entry)


# Triton's default version policy, as its configuration answer writes it where none was given.
DEFAULT_VERSION_POLICY: dict[str, Any] = {"latest": {"num_versions": 1}}


def served_version(document: Mapping[str, Any], versions: Sequence[int]) -> int:
    """The version ``document``'s ``version_policy`` serves among ``versions`` (those present,
    at least one): latest (the highest; by default), specific, all; refused where it selects
    none, or several (one version of a graph model is served)."""
    present = sorted(versions)
    policy = document.get("version_policy", {})
    if "specific" in policy:
        chosen = sorted(set(policy["specific"].get("versions", [])) & set(present))
        wanted = f"specific {policy['specific'].get('versions', [])}"
    elif "all" in policy:
        chosen, wanted = present, "all"
    else:
        count = policy.get("latest", {}).get("num_versions", 1)
        chosen, wanted = present[-max(count, 1) :], f"latest {count}"
    if len(chosen) == 1:
        return int(chosen[0])
    raise invalid(
        "config.version_policy",
        "version_policy",
        f"{wanted} selects {chosen or 'none'} of the versions present "
        f"({present}): one version of a graph model is served",
    )


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
    same name: its data type, its rank, each fixed dimension (-1 agrees with any). With
    ``max_batch_size`` above 0, every input and output the file declares has a variable first
    dimension (the batch), and an entry's dims are the rest of its shape."""
    batched = document.get("max_batch_size", 0) > 0
    for kind, declared in (("input", spec.inputs), ("output", spec.outputs)):
        if batched:
            for decl in declared:
                _check_batch_dimension(decl, kind)
        entries = document.get(kind, [])
        if not isinstance(entries, list):
            raise invalid(f"config.{kind}", "config", "a list of tensors")
        by_name = {decl.name: _unbatched(decl) if batched else decl for decl in declared}
        seen: set[str] = set()
        for index, entry in enumerate(entries):
            field = f"config.{kind}[{index}]"
            _check_entry(field, entry, by_name, seen, kind)


def _check_batch_dimension(decl: ValueDecl, kind: str) -> None:
    if decl.dims is None:
        return  # an output whose shape the file leaves out: its first dimension is the batch
    if not decl.dims or isinstance(decl.dims[0], int):
        raise invalid(
            "config.max_batch_size",
            "max_batch_size",
            f"above 0, the first dimension of every input and output is the batch; the file "
            f"declares {kind} {shown(decl.name)} as {_shown_dims(decl.dims)}: give it a variable "
            "first dimension, or max_batch_size 0 (dims the whole shape)",
        )


def _unbatched(decl: ValueDecl) -> ValueDecl:
    """``decl`` without its first dimension (the batch): what a batched entry's dims describe."""
    if decl.dims is None:
        return decl
    return ValueDecl(decl.name, decl.datatype, tuple(decl.dims[1:]))


def _check_entry(
    field: str, entry: Any, by_name: Mapping[str, ValueDecl], seen: set[str], kind: str
) -> None:
    if not isinstance(entry, dict):
        raise invalid(field, "config", "a tensor is an object with name, data_type and dims")
    for key in entry:
        if key not in TENSOR_KEYS:
            raise invalid(
                f"{field}.{key[:100]}",
                "unsupported_config",
                f"a tensor takes name, data_type, dims{did_you_mean(key, sorted(TENSOR_KEYS))}",
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


def _config_tensor(decl: ValueDecl, batched: bool) -> dict[str, Any]:
    dims = [-1] if decl.dims is None else [d if isinstance(d, int) else -1 for d in decl.dims]
    if batched and decl.dims is not None:
        dims = dims[1:]  # the batch dimension: max_batch_size says it
    return {"name": decl.name, "data_type": TYPE_PREFIX + decl.datatype.value, "dims": dims}


def model_config(
    name: str,
    spec: Declared,
    form: GraphFormat = ONNX,
    document: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The protobuf JSON of Triton's ModelConfig for the graph model (what the configuration
    routes answer): the honoured fields of its configuration (``document``), completed from the
    file as Triton completes one (its inputs and outputs, its format's platform and backend),
    and its version policy as written (Triton's default, the latest one, where none is): the
    version served is the answers' and the statistics', not the configuration's, so that the
    configuration loads back as it is (a load carries its file as version 1: a policy naming
    the version served would select nothing there)."""
    batch = int((document or {}).get("max_batch_size", 0))
    policy = (document or {}).get("version_policy") or DEFAULT_VERSION_POLICY
    return {
        "name": name,
        "platform": form.platform,
        "backend": form.backend,
        "max_batch_size": batch,
        "version_policy": policy,
        "input": [_config_tensor(d, batch > 0) for d in spec.inputs],
        "output": [_config_tensor(d, batch > 0) for d in spec.outputs],
        "parameters": {},
    }


__all__ = [
    "ACCEPTED_KEYS",
    "BINDING",
    "COMPLETED_ONNX_CONFIG",
    "FORMATS",
    "IGNORED_KEYS",
    "ONNX",
    "TENSOR_KEYS",
    "GraphFormat",
    "ModelConfig",
    "as_document",
    "check_config",
    "graph_format",
    "keys_taken",
    "model_config",
    "read_config",
    "served_version",
]
