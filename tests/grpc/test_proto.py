"""The gRPC messages are the published ones: every field of every message in inference.proto has
the name, number, type and cardinality of the same field in tritonclient's own copy of Triton's
protocol; the generated code is what ``make proto`` makes of the .proto today; and every RPC of
the service has a handler, under the published method name, with the published message types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
)
from tritonclient.grpc import model_config_pb2, service_pb2

from tensorbits.grpc import inference_pb2 as ours
from tensorbits.grpc.pools import RPC_RULES
from tensorbits.grpc.service import RPCS, SERVICE_NAME, InferenceService

ROOT = Path(__file__).resolve().parents[2]
OUR_SERVICE = ours.DESCRIPTOR.services_by_name["GRPCInferenceService"]
THEIR_SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def _published(name: str) -> Descriptor:
    """The published message of that name: Triton's service protocol or its model config."""
    for module in (service_pb2, model_config_pb2):
        if name in module.DESCRIPTOR.message_types_by_name:
            message: Descriptor = module.DESCRIPTOR.message_types_by_name[name]
            return message
    raise AssertionError(f"{name} is not a published message")


def _messages(descriptor: Descriptor, prefix: str = "") -> list[tuple[str, Descriptor]]:
    found = [(prefix + descriptor.name, descriptor)]
    for nested in descriptor.nested_types:
        if not nested.GetOptions().map_entry:
            found += _messages(nested, prefix + descriptor.name + ".")
    return found


OUR_MESSAGES = [
    pair
    for message in ours.DESCRIPTOR.message_types_by_name.values()
    for pair in _messages(message)
]


def _nested(published: Descriptor, path: str) -> Descriptor:
    descriptor = _published(path.split(".")[0])
    for part in path.split(".")[1:]:
        descriptor = descriptor.nested_types_by_name[part]
    return descriptor


def _shape(field: FieldDescriptor) -> tuple[object, ...]:
    """What of a field travels or decides the wire: number, type, cardinality, and for message
    and enum fields the name of their type (not its package)."""
    kind: object = field.type
    if field.message_type is not None:
        kind = field.message_type.name
    elif field.enum_type is not None:
        kind = field.enum_type.name
    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == 3
    return field.number, kind, repeated


@pytest.mark.parametrize(("path", "descriptor"), OUR_MESSAGES, ids=[p for p, _ in OUR_MESSAGES])
def test_every_field_is_the_published_one(path: str, descriptor: Descriptor) -> None:
    published = _nested(_published(path.split(".")[0]), path)
    for field in descriptor.fields:
        assert field.name in published.fields_by_name, f"{path}.{field.name} is not published"
        assert _shape(field) == _shape(published.fields_by_name[field.name]), f"{path}.{field.name}"


def _enums(file: FileDescriptor) -> dict[str, EnumDescriptor]:
    found: dict[str, EnumDescriptor] = dict(file.enum_types_by_name)
    for message in file.message_types_by_name.values():
        for enum in message.enum_types:
            found[f"{message.name}.{enum.name}"] = enum
    return found


def test_every_enum_value_is_the_published_one() -> None:
    published = {**_enums(service_pb2.DESCRIPTOR), **_enums(model_config_pb2.DESCRIPTOR)}
    for name, enum in _enums(ours.DESCRIPTOR).items():
        values = {v.name: v.number for v in enum.values}
        theirs = {v.name: v.number for v in published[name].values}
        assert values.items() <= theirs.items(), name


def test_every_rpc_is_published_and_served() -> None:
    for name, method in RPCS:
        ours_rpc = OUR_SERVICE.methods_by_name[name]
        theirs = THEIR_SERVICE.methods_by_name[name]
        assert ours_rpc.input_type.name == theirs.input_type.name
        assert ours_rpc.output_type.name == theirs.output_type.name
        assert ours_rpc.client_streaming == theirs.client_streaming, name
        assert ours_rpc.server_streaming == theirs.server_streaming, name
        # The server registers a stream (RPC_RULES) for exactly the RPCs published as one.
        assert RPC_RULES[name].streaming == theirs.client_streaming == theirs.server_streaming
        assert callable(getattr(InferenceService, method)), method
    assert THEIR_SERVICE.full_name == SERVICE_NAME
    assert {name for name, _ in RPCS} >= {
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
        "ModelInfer", "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex",
        "RepositoryModelLoad", "RepositoryModelUnload",
    }  # fmt: skip


def test_generated_code_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_grpc.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
