"""``config.pbtxt`` (Triton's protobuf text format of ModelConfig) as the document the JSON form
is, and checked by the same rules: dims made numbers again, enums by name, the ignored keys
taken and dropped in both forms, every refusal naming ``config.pbtxt`` (or the key path) and its
rule, a text past the bound refused before protobuf's parser sees it; the repository folder
reading either form, and refusing a folder that holds both."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Literal

import pytest
from core.graph_models import (
    BATCH_LIMITS,
    MASKED_PBTXT,
    masked_model,
)
from google.protobuf import text_format
from google.protobuf.descriptor import Descriptor
from hypothesis import given, settings
from hypothesis import strategies as st
from support.planes import data_plane
from tritonclient.grpc import model_config_pb2 as triton_model_config

from tensorbits.core.graphs.config_fields import MODEL_FIELDS, TENSOR_FIELDS, Treatment, fields
from tensorbits.core.graphs.limits import GraphLimits
from tensorbits.core.graphs.models import build
from tensorbits.core.graphs.triton_config import (
    ACCEPTED_KEYS,
    IGNORED_KEYS,
    MAX_CONFIG_BYTES,
    TENSOR_KEYS,
    read_config,
    served_version,
)
from tensorbits.core.graphs.triton_pbtxt import MODEL_CONFIG, pbtxt_as_json, read_pbtxt
from tensorbits.grpc import inference_pb2
from tensorbits.repository.folder import load_repository
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, TensorbitsError

MASKED_JSON = {
    "name": "masked",
    "backend": "onnxruntime",
    "input": [{"name": "x", "data_type": "TYPE_UINT8", "dims": [-1, 4]}],
    "output": [{"name": "z", "data_type": "TYPE_UINT8", "dims": [-1, 4]}],
    "instance_group": [{"kind": "KIND_CPU", "count": 1}],
}


def refused(text: str | bytes, rule: str, field: str = "config.pbtxt") -> TensorbitsError:
    with pytest.raises(TensorbitsError) as caught:
        read_pbtxt(text)
    error = caught.value
    assert (error.field, error.rule) == (field, rule), error.message
    assert 400 <= error.status_code < 500
    assert error.message.startswith(f"{field}: ")
    return error


def test_triton_s_example_is_the_json_document_with_dims_as_numbers() -> None:
    document = read_pbtxt(MASKED_PBTXT)
    assert document == MASKED_JSON  # max_batch_size 0 is protobuf's default: left out
    assert all(type(d) is int for e in document["input"] + document["output"] for d in e["dims"])
    assert json.loads(pbtxt_as_json(MASKED_PBTXT)) == MASKED_JSON


def test_both_forms_are_one_document_under_one_set_of_checks() -> None:
    from_pbtxt = read_config(pbtxt_as_json(MASKED_PBTXT), "masked")
    assert from_pbtxt == read_config(json.dumps(MASKED_JSON), "masked")
    assert "instance_group" not in from_pbtxt  # taken, not acted on
    model = build(
        "masked", pbtxt_as_json(MASKED_PBTXT), masked_model(), GraphLimits(), BATCH_LIMITS
    )
    assert model.config["input"] == [{"name": "x", "data_type": "TYPE_UINT8", "dims": [-1, 4]}]


@pytest.mark.parametrize(
    ("before", "after", "field", "rule"),
    [
        # a fixed dimension the file does not declare: dims reach the shape check as numbers
        ("dims: [ -1, 4 ] } ]\noutput", "dims: [ -1, 5 ] } ]\noutput",
         "config.input[0].dims", "shape"),
        ("dims: [ -1, 4 ] } ]\noutput", "dims: [ 4 ] } ]\noutput", "config.input[0].dims", "shape"),
        ('"x" data_type: TYPE_UINT8', '"x" data_type: TYPE_UINT16',
         "config.input[0].data_type", "datatype"),
        ('name: "z"', 'name: "w"', "config.output[0].name", "unknown_output"),
        ('"onnxruntime"', '"tensorrt"', "config.backend", "unsupported_backend"),
        ("max_batch_size: 0", "max_batch_size: -1", "config.max_batch_size", "max_batch_size"),
        # batched: dims leave out the batch dimension, so the file's whole shape disagrees
        ("max_batch_size: 0", "max_batch_size: 8", "config.input[0].dims", "shape"),
        ('name: "masked"', 'name: "other"', "config.name", "model_mismatch"),
    ],
)  # fmt: skip
def test_a_pbtxt_that_disagrees_with_the_file_is_refused_as_json_is(
    before: str, after: str, field: str, rule: str
) -> None:
    text = MASKED_PBTXT.replace(before, after)
    assert text != MASKED_PBTXT
    with pytest.raises(InvalidRequest) as caught:
        build("masked", pbtxt_as_json(text), masked_model(), GraphLimits(), BATCH_LIMITS)
    assert (caught.value.field, caught.value.rule) == (field, rule)


def test_a_syntax_error_names_the_file_the_rule_and_protobuf_s_line_and_column() -> None:
    error = refused('name: "masked"\nbackend: onnxruntime"\n', "text_format")
    assert "2:" in error.message
    error = refused("input [ { name: x } ]", "text_format")
    assert "1:" in error.message
    refused('name: "a"\nname: "b"', "text_format")  # a singular field given twice
    refused("max_batch_size: 99999999999", "text_format")  # past int32
    refused("input { data_type: TYPE_UINT128 }", "text_format")  # no such enum value
    refused("[some.extension]: 1", "text_format")
    refused(b'name: "\xff"', "text_format")  # not UTF-8
    refused('name: "\ud800"', "text_format")  # a lone surrogate: not UTF-8 either
    refused('name: "a\\mb"', "text_format")  # an escape C's and protobuf's strings lack
    refused("input { data_type: 9223372036854775808 }", "text_format")  # an enum past int32
    refused("input { dims: 9223372036854775808 }", "text_format")  # past int64


@pytest.mark.parametrize("action", ["ignore", "default", "error"])
def test_an_unknown_escape_is_refused_whatever_the_warning_filters(
    action: Literal["ignore", "default", "error"],
) -> None:
    """Protobuf's unescaping only warns of it (a server's filters may ignore that warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter(action)
        error = refused('name: "a\\qb"', "text_format")
    assert "\\q" in error.message


def test_a_lone_surrogate_in_a_json_configuration_is_a_400() -> None:
    """The load API's JSON body can carry one ("\\ud800" in the config parameter)."""
    with pytest.raises(InvalidRequest) as caught:
        read_config("\ud800", "m")
    assert (caught.value.field, caught.value.rule) == ("config", "json")


@pytest.mark.parametrize(
    ("text", "named", "where"),
    [
        ("dynamic_batching { max_queue_delay: 1 }", "max_queue_delay", "2:"),
        ("optimization { execution_accelerator { } }", "execution_accelerator", "2:"),
        ("max_bath_size: 0", "max_bath_size", "2:1"),  # a misspelt setting
        ('input [ { name: "x" reshap: { shape: [ 4 ] } } ]', "reshap", "2:"),
        ("instance_group [ { rate_limitr { } } ]", "rate_limitr", "2:"),
    ],
)
def test_a_field_this_server_does_not_take_is_refused_naming_it(
    text: str, named: str, where: str
) -> None:
    error = refused(f'name: "masked"\n{text}\n', "unsupported_config")
    assert f'"{named}"' in error.message
    assert where in error.message
    assert "not a field of Triton's ModelConfig" in error.message


# (a misspelt key in each form's words, its place in the JSON document, the key it is close to)
MISSPELT = [
    pytest.param("max_batch_sise: 0", {"max_batch_sise": 0}, "config.max_batch_sise",
                 "max_batch_size", id="setting"),
    pytest.param('input [ { name: "x" data_typ: TYPE_UINT8 } ]',
                 {"input": [{"name": "x", "data_typ": "TYPE_UINT8"}]}, "config.input[0].data_typ",
                 "data_type", id="tensor-key"),
    pytest.param("instance_group [ { kinds: KIND_CPU } ]", None, None, "kind",
                 id="ignored-setting-s-key"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "document", "field", "meant"), MISSPELT)
def test_a_misspelt_key_is_answered_with_the_closest_in_both_forms(
    text: str, document: dict[str, Any] | None, field: str | None, meant: str
) -> None:
    error = refused(f'name: "masked"\n{text}\n', "unsupported_config")
    assert error.message.endswith(f"; did you mean '{meant}'?")
    if document is not None:
        text = json.dumps({**MASKED_JSON, **document})
        with pytest.raises(InvalidRequest) as caught:
            build("masked", text, masked_model(), GraphLimits(), BATCH_LIMITS)
        assert (caught.value.field, caught.value.rule) == (field, "unsupported_config")
        assert caught.value.message.endswith(f"; did you mean '{meant}'?")


def test_a_key_close_to_none_gets_no_suggestion() -> None:
    assert "did you mean" not in refused("zzzzzz: 1", "unsupported_config").message


def test_version_policy_is_honoured_and_another_file_name_refused_in_both_forms() -> None:
    policies: list[dict[str, Any]] = [
        {"latest": {"num_versions": 1}},
        {"specific": {"versions": ["1"]}},
        {"all": {}},
    ]
    for policy in policies:
        document = read_config(
            json.dumps({"backend": "onnxruntime", "version_policy": policy}), "m"
        )
        assert served_version(document, [1]) == 1
    document = read_config(pbtxt_as_json("backend: 'onnxruntime' version_policy { all { } }"), "m")
    with pytest.raises(InvalidRequest) as caught:
        served_version(document, [1, 2])  # one version of a graph model is served
    assert (caught.value.field, caught.value.rule) == ("config.version_policy", "version_policy")
    specific = read_config('{"backend": "onnxruntime", "versionPolicy": {"specific": {}}}', "m")
    with pytest.raises(InvalidRequest):
        served_version({**specific, "version_policy": {"specific": {"versions": [3]}}}, [1, 2])
    assert served_version({"version_policy": {"specific": {"versions": [1]}}}, [1, 2]) == 1
    assert served_version({}, [1, 5, 2]) == 5  # Triton's default: the latest
    for text in ('{"backend": "onnxruntime", "default_model_filename": "model.onnx"}',):
        assert "default_model_filename" not in read_config(text, "m")
    with pytest.raises(InvalidRequest) as caught:
        read_config(pbtxt_as_json('backend: "onnxruntime" default_model_filename: "a.onnx"'), "m")
    assert (caught.value.field, caught.value.rule) == (
        "config.default_model_filename",
        "unsupported_config",
    )


def test_ignored_keys_are_taken_whatever_they_hold_and_dropped() -> None:
    assert set(IGNORED_KEYS) == set(fields(Treatment.IGNORED))
    assert {"instance_group", "dynamic_batching", "optimization", "parameters"} <= set(IGNORED_KEYS)
    assert all(reason for reason in IGNORED_KEYS.values())
    groups = [{"kind": "KIND_GPU", "count": 4, "gpus": [0, 1]}]
    document = read_config(json.dumps({"backend": "onnxruntime", "instance_group": groups}), "m")
    assert document == {"backend": "onnxruntime"}
    text = 'backend: "onnxruntime" instance_group [ { kind: KIND_GPU count: 4 gpus: [ 0, 1 ] } ]'
    assert read_pbtxt(text)["instance_group"] == groups
    assert read_config(pbtxt_as_json(text), "m") == {"backend": "onnxruntime"}


@pytest.fixture
def parser_unused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if protobuf's text-format parser is reached."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the text reached the parser")

    monkeypatch.setattr(text_format, "Parse", refuse)


@pytest.mark.usefixtures("parser_unused")
def test_a_text_past_the_bound_is_refused_before_it_is_parsed() -> None:
    text = MASKED_PBTXT + "#" * (MAX_CONFIG_BYTES - len(MASKED_PBTXT) + 1)
    with pytest.raises(PayloadTooLarge) as caught:
        read_pbtxt(text)
    assert (caught.value.field, caught.value.rule) == ("config.pbtxt", "max_config_bytes")
    assert str(MAX_CONFIG_BYTES) in caught.value.message


def test_a_text_at_the_bound_is_parsed() -> None:
    text = MASKED_PBTXT + "#" * (MAX_CONFIG_BYTES - len(MASKED_PBTXT))
    assert len(text.encode()) == MAX_CONFIG_BYTES
    assert read_pbtxt(text) == MASKED_JSON


def test_a_text_that_grows_past_the_bound_as_json_is_refused() -> None:
    entry = "input{data_type:2}"  # 18 characters, 27 as JSON
    text = entry * (MAX_CONFIG_BYTES // len(entry))
    with pytest.raises(PayloadTooLarge) as caught:
        pbtxt_as_json(text)
    assert (caught.value.field, caught.value.rule) == ("config.pbtxt", "max_config_bytes")


TOKENS = st.sampled_from(
    ["name", "input", "dims", "data_type", "TYPE_UINT8", "instance_group", "kind", "KIND_GPU",
     "gpus", "passive", "true", "{", "}", "[", "]", "<", ">", ":", ",", ";", '"', "'", "\\",
     "\\x", "\\u", "\\377", "-", "0x", "0", "-1", "9223372036854775808", "inf", "1e5", "#",
     "\n", " ", "[a.b]", "\x00", "é", "\ud800"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200),
        st.lists(TOKENS, max_size=30).map("".join),
        st.builds(
            lambda cut, noise: MASKED_PBTXT[:cut] + noise + MASKED_PBTXT[cut:],
            st.integers(0, len(MASKED_PBTXT)),
            st.lists(TOKENS, max_size=6).map("".join),
        ),
    )
)
def test_any_text_is_a_document_or_a_4xx_refusal_never_a_crash(text: str | bytes) -> None:
    refusal: TensorbitsError | None = None
    try:
        read_config(pbtxt_as_json(text), "masked")
    except TensorbitsError as error:
        refusal = error
    if refusal is not None:
        assert 400 <= refusal.status_code < 500
        assert refusal.field is not None
        assert refusal.field.startswith("config")


# --- the schema ----------------------------------------------------------------------------------


def _fields(message: Descriptor) -> set[tuple[str, int, int, bool]]:
    return {(f.name, f.number, f.type, f.is_repeated) for f in message.fields}


def _all_messages(descriptor: Descriptor) -> dict[str, Descriptor]:
    found = {descriptor.name: descriptor}
    for nested in descriptor.nested_types:
        found |= {f"{descriptor.name}.{k}": v for k, v in _all_messages(nested).items()}
    return found


def test_every_field_of_the_schema_has_its_row_in_the_table() -> None:
    """A field Triton adds is refused until the table says what it does here."""
    config = MODEL_CONFIG.DESCRIPTOR
    assert list(MODEL_FIELDS) == [f.name for f in config.fields]
    for kind in ("input", "output"):
        tensor = config.fields_by_name[kind].message_type
        assert set(TENSOR_FIELDS[kind]) == {f.name for f in tensor.fields}
    assert set(fields(Treatment.HONOURED)) == ACCEPTED_KEYS
    assert set(fields(Treatment.HONOURED, TENSOR_FIELDS["input"])) == TENSOR_KEYS
    assert all(rule.reason for rule in MODEL_FIELDS.values())


def test_the_schema_is_triton_s_model_config_whole_and_the_grpc_answer_s() -> None:
    """Each message, field (name, number, type, list or not) and enum value of the schema is
    Triton's (tritonclient's copy), and the gRPC ModelConfig RPC answers with this very class:
    one schema."""
    theirs = triton_model_config.DESCRIPTOR
    ours = MODEL_CONFIG.DESCRIPTOR.file
    assert set(ours.message_types_by_name) == set(theirs.message_types_by_name)
    assert set(ours.enum_types_by_name) == set(theirs.enum_types_by_name)
    for name, top in ours.message_types_by_name.items():
        published = _all_messages(theirs.message_types_by_name[name])
        for path, message in _all_messages(top).items():
            assert _fields(message) == _fields(published[path]), path
            for enum in message.enum_types:
                reference = published[path].enum_types_by_name[enum.name]
                assert [(v.name, v.number) for v in enum.values] == [
                    (v.name, v.number) for v in reference.values
                ]
    answer = inference_pb2.ModelConfigResponse.DESCRIPTOR.fields_by_name["config"]
    assert answer.message_type is MODEL_CONFIG.DESCRIPTOR


# --- the repository folder -----------------------------------------------------------------------


def _folder(root: Path, name: str, files: dict[str, str | bytes]) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.onnx").write_bytes(masked_model())
    for file, content in files.items():
        path = root / name / file
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def test_the_folder_reads_config_pbtxt_and_refuses_a_folder_with_both(tmp_path: Path) -> None:
    _folder(tmp_path, "masked", {"config.pbtxt": MASKED_PBTXT})
    _folder(
        tmp_path, "both", {"config.pbtxt": MASKED_PBTXT, "config.json": json.dumps(MASKED_JSON)}
    )
    _folder(tmp_path, "broken", {"config.pbtxt": 'backend: "onnxruntime"\nbatching {}\n'})
    _folder(tmp_path, "none", {})  # no configuration: completed from the file, as Triton does
    _folder(tmp_path, "large", {"config.pbtxt": "#" * (MAX_CONFIG_BYTES + 1)})
    plane = data_plane()
    load_repository(plane, tmp_path)
    model = plane.graphs.get("masked")
    assert model is not None
    assert model.config["input"][0]["dims"] == [-1, 4]
    failed = plane.graphs.failed()
    assert set(failed) == {"both", "broken", "large"}
    assert "config.pbtxt and config.json" in failed["both"]
    assert "config.pbtxt: 2:1" in failed["broken"]
    assert '"batching"' in failed["broken"]
    completed = plane.graphs.get("none")
    assert completed is not None
    assert completed.config == {**model.config, "name": "none"}  # the file says the rest
    assert "config.pbtxt is" in failed["large"]
