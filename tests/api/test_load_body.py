"""A load's JSON body read a block at a time (``api/load_body.py``): wherever the blocks cut,
the strings found and the file decoded are those of the whole body."""

from __future__ import annotations

import base64
import json

import pytest
from support.repository_load import load_runtime

from tensorbits.api import load_body
from tensorbits.grpc import load_wire
from tensorbits_protocol import jsondata

RUNTIME = load_runtime(1 << 20)
FILE = "file:1/model.onnx"
DATA = bytes(range(256)) * 40  # its base64 holds "/" and "+"
CONFIG = json.dumps({"backend": "onnxruntime", "name": 'a\\"b'})


@pytest.mark.parametrize("block", [4, 8, 12, 64])
@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "slashes escaped"])
def test_a_body_is_read_alike_in_blocks_of_any_size(
    block: int, escaped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded = base64.b64encode(DATA).decode()
    body = json.dumps({"parameters": {"config": CONFIG, FILE: encoded}})
    if escaped:  # as some JSON writers write "/"
        body = body.replace("/", "\\/")
    monkeypatch.setattr(jsondata, "_SCAN_BLOCK", block)
    monkeypatch.setattr(load_body, "BASE64_BLOCK", block)
    monkeypatch.setattr(load_body, "INLINE_STRING_BYTES", 24)  # both values cut out
    read = load_body.read_load_body(bytearray(body.encode()), RUNTIME)
    assert read == load_body.LoadBody(CONFIG, {FILE: DATA})


@pytest.mark.parametrize("size", [0, 1, load_wire.COPY_BLOCK, 3 * load_wire.COPY_BLOCK + 5])
def test_a_file_is_copied_out_of_its_message_whole(size: int) -> None:
    data = b"head" + bytes(range(256)) * (size // 256) + b"x" * (size % 256) + b"tail"
    assert load_wire._copied(data, 4, len(data) - 4) == data[4:-4]
