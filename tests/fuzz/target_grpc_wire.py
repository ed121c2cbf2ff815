"""Coverage-guided fuzz target: the gRPC wire reader (``tensorbits.grpc.wire``), fed floods.

A plain mutator rarely writes the messages that once stalled the server: thousands of copies of
one small field, long repeated fields, nesting several messages deep. So the input is a small
program that builds the message (``build``): a prefix, a unit repeated up to 65,535 times, a
suffix, the flood optionally wrapped in up to four levels of length-delimited fields (the field
numbers the fuzzer's), as an input, its contents, a parameter map entry are. The corpus seeds it
with floods of every kind that matters.

The property, under the small limits every fuzz target uses:
- the walk (``split_infer_request`` then ``check_nested``) answers or refuses with InvalidRequest
  or PayloadTooLarge, nothing else;
- what it passes protobuf parses (a string that is not UTF-8 apart, which protobuf refuses
  itself, a DecodeError the service answers with INVALID_ARGUMENT), and what protobuf built is
  within every bound: tensors, parameter map entries, shape dimensions, typed values, string
  lengths;
- what protobuf refuses, the walk refuses too, or leaves to protobuf's own refusal.

By hand::

    .venv/bin/python tests/fuzz/target_grpc_wire.py -max_total_time=600 tests/fuzz/corpus_grpc_wire
"""

from __future__ import annotations

from harness import SMALL_LIMITS, Reader, fuzz, instrumented

with instrumented(__name__, "tensorbits"):
    from google.protobuf.message import DecodeError

    from tensorbits.grpc import inference_pb2 as pb
    from tensorbits.grpc import wire
    from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
    from tensorbits_protocol.parameters import MAX_PARAMETERS
    from tensorbits_protocol.v2 import MAX_WIRE_RANK

LIMITS = wire.WireLimits.of(SMALL_LIMITS["max_tensors"], SMALL_LIMITS["max_json_elements"])
MAX_MESSAGE = 1 << 22  # what one input may build: a few MiB, so a run does many


def build(data: bytes) -> bytes:
    """The message the input describes: byte 0 even: the input itself; odd: a flood program
    (repeat count, unit length, nesting depth and field numbers, then unit, prefix, suffix)."""
    reader = Reader(data)
    if not reader.byte() & 1:
        return data[1:]
    count = reader.u16()
    unit_length = reader.byte() % 32
    depth = reader.byte() % 5
    numbers = [reader.byte() % 16 for _ in range(depth)]
    prefix_length = reader.byte() % 64
    unit = reader.raw(unit_length)
    prefix = reader.raw(prefix_length)
    suffix = reader.rest()
    body = unit * min(count, MAX_MESSAGE // max(1, len(unit)))
    for number in reversed(numbers):  # innermost first
        body = wire.len_field(number, body)
    return prefix + body + suffix


def _check_bounds(message: pb.ModelInferRequest) -> None:
    tensors = LIMITS.bounds[wire.Count.TENSORS]
    assert len(message.inputs) <= tensors
    assert len(message.outputs) <= tensors
    assert len(message.raw_input_contents) <= tensors
    assert len(message.parameters) <= MAX_PARAMETERS
    values = 0
    texts = [message.model_name, message.model_version, message.id]
    for tensor in message.inputs:
        assert len(tensor.shape) <= MAX_WIRE_RANK
        assert len(tensor.parameters) <= MAX_PARAMETERS
        contents = tensor.contents
        values += sum(len(getattr(contents, f.name)) for f in contents.DESCRIPTOR.fields)
        texts += [tensor.name, tensor.datatype, *tensor.parameters]
    for output in message.outputs:
        assert len(output.parameters) <= MAX_PARAMETERS
        texts += [output.name, *output.parameters]
    assert values <= LIMITS.max_values
    assert all(len(text.encode()) <= wire.MAX_TEXT_BYTES for text in texts)


def TestOneInput(data: bytes) -> None:  # noqa: N802 (the name atheris and libFuzzer use)
    message = build(data)
    try:
        split = wire.split_infer_request(message, LIMITS)
        wire.check_nested(split.message, LIMITS)
    except (InvalidRequest, PayloadTooLarge):
        return
    assert sum(raw.nbytes for raw in split.raw_contents) + len(split.message) <= len(message)
    try:
        parsed = pb.ModelInferRequest.FromString(split.message)
    except DecodeError:  # a string that is not UTF-8: protobuf's own refusal, answered as 400
        return
    assert not parsed.raw_input_contents
    _check_bounds(parsed)


if __name__ == "__main__":
    fuzz(TestOneInput)
