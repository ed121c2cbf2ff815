"""What a graph model's name and version may be (``core/graphs/names.py``): the one rule the
load API and the repository folder's reader check; and the reader, on a folder with one hostile
entry of each kind (``support/hostile_repository.py``), serving the good models and listing each
refused one, with its rule, under a name every encoder takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from core.graph_models import masked_model
from support.hostile_repository import GOOD, LARGEST, REFUSED, SECRET, hostile_repository

from tensorbits.config.settings import Settings
from tensorbits.core.graphs.names import (
    MAX_VERSION,
    RESERVED,
    check_name,
    check_version,
    displayed,
)
from tensorbits.runtime import Runtime
from tensorbits.server.app import create_app
from tensorbits_protocol.errors import InvalidRequest


def test_the_reserved_names_are_the_literal_segments_of_the_model_routes() -> None:
    segments = set()
    for path in create_app(Settings(backend="numpy")).openapi()["paths"]:
        if path.startswith("/v2/models/"):
            tail = path.removeprefix("/v2/models/").split("/")
            segments |= {segment for segment in tail if "{" not in segment}
    assert segments == RESERVED


REFUSED_NAMES = {
    "": "model_name",
    "a/b": "model_name",
    "..": "model_name",
    "x" * 257: "model_name",
    "bad\udcffname": "model_name",  # a folder's bytes that are not UTF-8
    "stats": "reserved_name",
    "infer": "reserved_name",
    "config": "reserved_name",
    "builtin": "builtin_model",
}


@pytest.mark.parametrize(("name", "rule"), REFUSED_NAMES.items())
def test_a_name_is_refused_naming_its_rule(name: str, rule: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_name(name, lambda n: n == "builtin")
    assert (refused.value.field, refused.value.rule) == ("model_name", rule)
    refused.value.message.encode("utf-8")  # every encoder takes the words


@pytest.mark.parametrize("name", ["x", "x" * 256, "ü-模型", "applied.x", "stats2", "Stats"])
def test_a_name_is_taken(name: str) -> None:
    check_name(name, lambda n: False)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0",
        "01",
        "-1",
        "+1",
        " 1",
        "1.0",
        "\u0661",
        "\uff11",
        str(MAX_VERSION + 1),
        "9" * 10_000,
    ],
)
def test_a_version_is_ascii_digits_within_int64(text: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_version(text)
    assert refused.value.rule == "version"


@pytest.mark.parametrize("text", ["1", "42", str(MAX_VERSION)])
def test_a_version_is_taken_as_its_number(text: str) -> None:
    assert str(check_version(text)) == text


def test_a_name_that_is_not_utf8_is_displayed_with_its_bytes_escaped() -> None:
    assert displayed("caf\udce9") == "caf\\xe9"
    assert displayed("café") == "café"


def test_the_reader_serves_the_good_models_and_lists_each_hostile_entry(tmp_path: Path) -> None:
    root = hostile_repository(tmp_path / "repository", tmp_path / "outside", masked_model())
    runtime = Runtime.start(Settings(backend="numpy", model_repository=root))
    try:
        graphs = runtime.plane.graphs
        served = {model.name: model.version for model in graphs.models()}
        assert served == {GOOD: "1", LARGEST: str(MAX_VERSION)}
        failed = graphs.failed()
        assert set(failed) == set(REFUSED)
        for name, rule in REFUSED.items():
            assert failed[name].startswith(f"failed to load '{name}': "), failed[name]
            assert rule in failed[name], (name, failed[name])
        assert "'\u0661'" in failed["arabic_indic"]  # the folder's name, as it is
        text = json.dumps(failed, ensure_ascii=False).encode("utf-8")  # the index's encoders
        assert SECRET.encode() not in text
        assert b"SECRET" not in text
        for name in REFUSED:
            assert runtime.unavailable_because(name) == failed[name]
    finally:
        runtime.close()
