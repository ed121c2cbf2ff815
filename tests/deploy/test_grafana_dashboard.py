"""docker/grafana/tensorbits.json, the operators' Grafana dashboard, checked three ways.

- It is a Grafana dashboard model (the JSON Grafana exports and imports): the keys Grafana's
  model has and needs, unique panel ids, every panel placed on the 24-column grid without
  overlapping another, every query on the ``${datasource}`` variable, every variable it uses
  defined, a unit on every panel and legends that name labels the query keeps.
- It cannot drift from the server: a live ``tensorbits serve`` answers HTTP inferences (answered,
  failed, refused with 413 and with 503), a model load and gRPC inferences; every metric name in
  every query must be one of the names its ``/metrics`` and its metrics port expose (``_total``,
  ``_bucket``, ``_sum`` and ``_count`` as exposed), every label a query selects, groups by or
  rewrites must be on that metric (or be one Prometheus adds to a scraped target), and every
  literal label value or regular expression must match a value the server wrote.
- The prometheus-operator overlay renders the ConfigMap Grafana's sidecar loads, carrying the
  file itself.

No JSON schema of Grafana's dashboard model is vendored here, so the structure is checked field
by field: the keys below are those of Grafana's dashboard, panel and variable models (as the
schemas of Grafana's Foundation SDK list them).
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from deploy.files import DOCKER, kustomize
from prometheus_client.parser import text_string_to_metric_families
from support.framing import framed
from support.grpc_live import GrpcServer
from support.live import free_port, serve
from support.rawhttp import ask, one_reply, request
from support.v2 import NOT, binary_input, bit_not_request
from tritonclient.utils import InferenceServerException

from tensorbits_protocol.v1 import BindingGraph

DASHBOARD_FILE = DOCKER / "grafana" / "tensorbits.json"
OVERLAY = "prometheus-operator"
CONFIG_MAP = "tensorbits-grafana-dashboard"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The dashboard's variables: the datasource, the Kubernetes scope and the model (the admission
# bounds are the server's own series, not variables to set).
VARIABLES = {
    "datasource": "datasource",
    "namespace": "query",
    "pod": "query",
    "model": "query",
}
# Grafana's own variables a query may use: its intervals, and the value "All" stands for.
GRAFANA_INTERVALS = {"__rate_interval", "__interval", "__range"}
GRAFANA_VARIABLES = GRAFANA_INTERVALS | {"__all"}
# Labels Prometheus adds to every series of a scraped target (Kubernetes service discovery, the
# Prometheus Operator's ServiceMonitor): on no series the server writes, on all it stores.
TARGET_LABELS = {"namespace", "pod", "instance", "job", "service", "container", "endpoint"}

# The keys of Grafana's dashboard model, panel model and variable model (what Grafana exports).
DASHBOARD_KEYS = {
    "id", "uid", "title", "description", "revision", "gnetId", "tags", "timezone", "editable",
    "graphTooltip", "time", "timepicker", "fiscalYearStartMonth", "liveNow", "weekStart",
    "refresh", "schemaVersion", "version", "panels", "templating", "annotations", "links",
}  # fmt: skip
DASHBOARD_REQUIRED = {"schemaVersion", "templating", "annotations", "panels", "title", "uid"}
PANEL_KEYS = {
    "type", "id", "pluginVersion", "tags", "targets", "title", "description", "transparent",
    "datasource", "gridPos", "links", "repeat", "repeatDirection", "maxPerRow", "maxDataPoints",
    "transformations", "interval", "timeFrom", "timeShift", "hideTimeOverride", "libraryPanel",
    "options", "fieldConfig",
}  # fmt: skip
ROW_KEYS = {"type", "collapsed", "title", "datasource", "gridPos", "id", "panels", "repeat"}
VARIABLE_KEYS = {
    "type", "name", "label", "hide", "skipUrlSync", "description", "query", "datasource",
    "current", "multi", "options", "refresh", "sort", "includeAll", "allValue", "regex",
}  # fmt: skip
VARIABLE_TYPES = {"query", "adhoc", "constant", "datasource", "interval", "textbox", "custom"}
# The panel types this dashboard uses, all built into Grafana.
PANEL_TYPES = {"timeseries", "stat", "table"}
# schemaVersion: Grafana 11 writes 39 and 40, Grafana 12 41 and 42.
SCHEMA_VERSIONS = range(39, 43)
# The live server's body limit: the 413 the refusals panel shows; its admission bound in bytes.
BODY_LIMIT = 64 * 1024
ADMISSION_BYTES = 1 << 20


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    return document


def panels(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows and the panels inside collapsed rows included."""
    found: list[dict[str, Any]] = []
    for panel in document["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def queries(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(panel title, target) for every query of every panel."""
    for panel in panels(document):
        for target in panel.get("targets", []):
            yield panel["title"], target


# ---- a PromQL reader: enough of the language to find metrics, labels and values ---------------

_TOKEN = re.compile(
    r"""(?P<space>\s+)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<duration>(?:\d+(?:ms|[smhdwy]))+\b)
    |(?P<number>0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)
    |(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){}\[\],@])
    |(?P<error>.)""",
    re.VERBOSE,
)
AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
    "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip
GROUPINGS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}


@dataclass
class Selector:
    metric: str
    matchers: list[tuple[str, str, str]]  # (label, operator, value)


@dataclass
class Parsed:
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)  # labels of by(), without(), on(), ...
    created: set[str] = field(default_factory=set)  # label_replace's destination labels
    rewrites: list[tuple[str, str]] = field(default_factory=list)  # label_replace (source, regex)


def _unquote(token: str) -> str:
    """A PromQL string literal's value (Go's escapes, which JSON's cover as far as used here)."""
    if token.startswith("`"):
        return token[1:-1]
    inner = token[1:-1]
    if token.startswith("'"):
        inner = inner.replace("\\'", "'").replace('"', '\\"')
    text: str = json.loads('"' + inner + '"')
    return text


def tokens(expr: str) -> list[tuple[str, str]]:
    found = []
    for match in _TOKEN.finditer(expr):
        kind = match.lastgroup
        assert kind is not None
        if kind == "error":
            raise ValueError(f"cannot read {match.group()!r} at {match.start()} of {expr!r}")
        if kind != "space":
            found.append((kind, match.group()))
    return found


def substituted(expr: str, textboxes: dict[str, str]) -> str:
    """``expr`` with Grafana's interval variables and the textbox variables as Grafana sends them
    (the variables inside label values stay: they are strings to PromQL)."""
    for name in GRAFANA_INTERVALS:
        expr = expr.replace("${" + name + "}", "5m").replace("$" + name, "5m")
    for name, value in textboxes.items():
        expr = re.sub(r"\$\{" + name + r"\}|\$" + name + r"\b", value, expr)
    return expr


def parse(expr: str) -> Parsed:
    """The metrics, matchers, grouping labels and label rewrites of one PromQL expression."""
    found = Parsed()
    items = tokens(expr)
    calls: list[list[Any]] = []  # per open parenthesis: [function or None, argument index]
    pending: str | None = None  # a function name whose "(" comes next
    i = 0
    while i < len(items):
        kind, text = items[i]
        following = items[i + 1][1] if i + 1 < len(items) else ""
        if kind == "ident":
            if text in GROUPINGS and following == "(":
                end = next(j for j in range(i + 2, len(items)) if items[j][1] == ")")
                found.grouping |= {t for k, t in items[i + 2 : end] if k == "ident"}
                i = end + 1
                continue
            operator = text in KEYWORDS or text in GROUPINGS
            if following == "(":
                pending = text
            elif not operator and not (text in AGGREGATIONS and following in GROUPINGS):
                selector = Selector(text, [])
                if following == "{":
                    i = _matchers(items, i + 2, selector)
                found.selectors.append(selector)
        elif text == "{":  # a selector with no name outside its braces
            selector = Selector("", [])
            i = _matchers(items, i + 1, selector)
            names = [v for label, op, v in selector.matchers if label == "__name__" and op == "="]
            selector.metric = names[0] if names else ""
            found.selectors.append(selector)
        elif text == "(":
            calls.append([pending, 0])
            pending = None
        elif text == ")":
            calls.pop()
        elif text == "," and calls:
            calls[-1][1] += 1
        elif kind == "string" and calls and calls[-1][0] == "label_replace":
            position = calls[-1][1]
            if position == 1:
                found.created.add(_unquote(text))
            elif position == 3:
                calls[-1].append(_unquote(text))
            elif position == 4:
                found.rewrites.append((calls[-1][2], _unquote(text)))
        i += 1
    assert not calls, f"unbalanced parentheses in {expr!r}"
    return found


def _matchers(items: list[tuple[str, str]], i: int, selector: Selector) -> int:
    """Read ``label op "value"`` matchers from ``items[i]`` to the closing brace; its index."""
    while items[i][1] != "}":
        (_, label), (_, op), (kind, value) = items[i : i + 3]
        assert kind == "string", f"a matcher's value is not a string: {value!r}"
        selector.matchers.append((label, op, _unquote(value)))
        i += 3
        if items[i][1] == ",":
            i += 1
    return i


def test_the_reader_finds_metrics_labels_and_rewrites() -> None:
    parsed = parse(
        'sum by (model, protocol) (label_replace(sum by (model, route) (rate(a_total{model!="",'
        ' status=~"2.."}[5m])), "protocol", "grpc", "route", "/x[.]Y/.*")) / on (model) '
        "group_left max without (le) (b_bucket) > bool 0.5"
    )
    assert [s.metric for s in parsed.selectors] == ["a_total", "b_bucket"]
    assert parsed.selectors[0].matchers == [("model", "!=", ""), ("status", "=~", "2..")]
    assert parsed.grouping == {"model", "protocol", "route", "le"}
    assert parsed.created == {"protocol"}
    assert parsed.rewrites == [("route", "/x[.]Y/.*")]
    with pytest.raises(ValueError, match="cannot read"):
        parse("rate(x[$__rate_interval])")  # a variable left in: not PromQL


# ---- (a) the dashboard model ---------------------------------------------------------------------


def test_the_dashboard_has_grafanas_model() -> None:
    document = dashboard()
    assert DASHBOARD_REQUIRED <= set(document) <= DASHBOARD_KEYS, set(document) ^ DASHBOARD_KEYS
    assert document["schemaVersion"] in SCHEMA_VERSIONS
    assert isinstance(document["uid"], str)
    assert 8 <= len(document["uid"]) <= 40
    assert document["title"] == "tensorbits"
    assert set(document["time"]) == {"from", "to"}
    assert isinstance(document["templating"]["list"], list)
    for annotation in document["annotations"]["list"]:
        assert {"name", "datasource", "enable", "iconColor"} <= set(annotation)
    for panel in document["panels"]:
        if panel["type"] == "row":
            assert set(panel) <= ROW_KEYS
            assert {"id", "collapsed", "panels"} <= set(panel)
            assert panel["collapsed"] or panel["panels"] == []  # open: its panels follow it
        else:
            assert set(panel) <= PANEL_KEYS, (panel["title"], set(panel) - PANEL_KEYS)
            assert panel["type"] in PANEL_TYPES, panel["title"]
            assert set(panel["fieldConfig"]) == {"defaults", "overrides"}, panel["title"]


def test_panel_ids_are_unique_and_every_panel_has_a_place_on_the_grid() -> None:
    every = panels(dashboard())
    ids = [panel["id"] for panel in every]
    assert all(isinstance(i, int) for i in ids)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"}, panel["title"]
        assert all(isinstance(grid[key], int) for key in grid), panel["title"]
        assert grid["h"] > 0
        assert grid["w"] > 0
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = panel["title"]


def test_the_panels_sit_in_rows_in_order() -> None:
    top = dashboard()["panels"]
    assert top[0]["type"] == "row"
    places = [(panel["gridPos"]["y"], panel["gridPos"]["x"]) for panel in top]
    assert places == sorted(places)  # the file reads as the dashboard shows it
    rows = [panel["title"] for panel in top if panel["type"] == "row"]
    assert rows == [
        "Overview",
        "Traffic",
        "Latency",
        "Admission and refusals",
        "Models and backend",
    ]


def test_every_panel_and_query_reads_the_datasource_variable() -> None:
    for panel in panels(dashboard()):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


def test_every_panel_says_what_it_shows_in_which_unit() -> None:
    for panel in panels(dashboard()):
        if panel["type"] == "row":
            continue
        assert panel["title"]
        assert panel["description"], panel["title"]
        if panel["type"] != "table":
            assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        if panel["type"] == "timeseries":
            legend = panel["options"]["legend"]
            assert legend["showLegend"], panel["title"]
            assert legend["displayMode"] == "table", panel["title"]


def test_the_variables_are_defined_and_every_one_used_is() -> None:
    document = dashboard()
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert {name: v["type"] for name, v in variables.items()} == VARIABLES
    for variable in variables.values():
        assert set(variable) <= VARIABLE_KEYS, (variable["name"], set(variable) - VARIABLE_KEYS)
        assert variable["type"] in VARIABLE_TYPES
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "pod", "model"):
        # "All" matches a series without the label too: the dashboard reads a Prometheus that
        # scrapes Compose or bare hosts, where no namespace or pod label exists.
        assert variables[name]["includeAll"], name
        assert variables[name]["allValue"] == ".*", name
        assert variables[name]["query"].startswith("label_values("), name
    text = DASHBOARD_FILE.read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{?(\w+)", text))
    assert used <= set(variables) | GRAFANA_VARIABLES, used - set(variables) - GRAFANA_VARIABLES
    assert set(variables) <= used, "a variable no query uses"


def test_legends_name_labels_the_query_keeps() -> None:
    textboxes = _textboxes(dashboard())
    for title, target in queries(dashboard()):
        parsed = parse(substituted(target["expr"], textboxes))
        placeholders = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        assert placeholders <= parsed.grouping | parsed.created, (title, placeholders)


def _textboxes(document: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["query"] for v in document["templating"]["list"] if v["type"] == "textbox"}


# ---- (b) every query against what a live server exports -------------------------------------------


@dataclass
class Exported:
    """What the server's expositions hold: every sample name, its labels and their values, and
    each sample's labels."""

    labels: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    series: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def add(self, text: str) -> None:
        for name, labels, _ in samples(text):
            values = self.labels.setdefault(name, {})
            for label, value in labels.items():
                values.setdefault(label, set()).add(value)
            self.series.setdefault(name, []).append(labels)

    def values(self, metric: str, label: str) -> set[str]:
        return self.labels[metric].get(label, set())


def _scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        assert response.status == 200
        text: str = response.read().decode()
        return text


def _repository(root: Path) -> Path:
    """A model repository of one graph model, at version 2: the binding model's example."""
    extra = BindingGraph.model_config.get("json_schema_extra")
    assert isinstance(extra, dict)
    assert isinstance(extra["examples"], list)
    folder = root / "hamming"
    (folder / "2").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        'platform: "tensorbits_graph"\ninstance_group [ { kind: KIND_CPU } ]\n'
    )
    (folder / "2" / "model.json").write_text(json.dumps(extra["examples"][0]))
    return root


@dataclass
class Traffic:
    """A live server's expositions after one call of each kind, and the routes its gRPC calls
    were counted under."""

    exported: Exported
    grpc_routes: set[str]
    http_routes: set[str]
    held: dict[str, float]  # the in-flight gauges while admission was full


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \S+)?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a text exposition: its name as written (what Prometheus stores: not
    prometheus_client's parser, which names a counter's samples ``..._total`` even where the
    text does not, as Triton's counters' do not), its labels and its value."""
    list(text_string_to_metric_families(text))  # it is a valid exposition
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        assert match is not None, line
        name, body, value = match.groups()
        labels = {}
        for pair in _LABEL.finditer(body or ""):
            labels[pair[1]] = json.loads(f'"{pair[2]}"')
        assert "".join(p[0] for p in _LABEL.finditer(body or "")) == (body or ""), line
        found.append((name, labels, float(value)))
    return found


def _unlabelled(text: str) -> dict[str, float]:
    return {name: value for name, labels, value in samples(text) if not labels}


def _requests_routes(text: str) -> set[str]:
    exported = Exported()
    exported.add(text)
    return exported.values("tensorbits_requests_total", "route")


def _http_calls(server: GrpcServer) -> None:
    data = np.arange(16, dtype=np.uint8)
    client = triton_http.InferenceServerClient(server.http.url, network_timeout=30)
    try:
        tensor = triton_http.InferInput("InputTensor", [16], "UINT8")
        tensor.set_data_from_numpy(data)
        for _ in range(2):
            client.infer(NOT, [tensor])
        with pytest.raises(InferenceServerException):  # a failure: answered 400
            client.infer(NOT, [tensor], parameters={"feature_level": "2_0"})
        client.load_model(NOT)  # a model load (an operator model: loaded already, cheap)
    finally:
        client.close()
    too_large = request("POST", f"/v2/models/{NOT}/infer", {}, b"\0" * (BODY_LIMIT + 1))
    assert one_reply(server.http, too_large).status == 413


def _refused_for_admission(server: GrpcServer, metrics_url: str) -> dict[str, float]:
    """A 503: the one request admission allows held (its declared body never comes) while
    another asks; the in-flight gauges read meanwhile."""
    data = np.zeros(16, dtype=np.uint8)
    body, headers = framed({"inputs": [binary_input("InputTensor", data)]}, data.tobytes())
    head = request("POST", f"/v2/models/{NOT}/infer", headers, body)[: -len(body)]
    with socket.create_connection((server.http.host, server.http.port), timeout=30) as holder:
        holder.sendall(head)
        deadline = time.monotonic() + 30
        while ask(server.http, bit_not_request(data)).status != 503:
            assert time.monotonic() < deadline, "the holding request was never admitted"
            time.sleep(0.05)
        held = _unlabelled(_scrape(metrics_url))
    # The holder gone, its grant is released: the next calls are admitted.
    while _unlabelled(_scrape(metrics_url))["tensorbits_inflight_requests"] != 0:
        assert time.monotonic() < deadline + 30, "the held request's grant was never released"
        time.sleep(0.05)
    return held


def _grpc_calls(server: GrpcServer) -> None:
    data = np.arange(16, dtype=np.uint8)
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        tensor = triton_grpc.InferInput("InputTensor", [16], "UINT8")
        tensor.set_data_from_numpy(data)
        client.infer(NOT, [tensor])
        with pytest.raises(InferenceServerException):
            client.infer(NOT, [tensor], parameters={"feature_level": "2_0"})
    finally:
        client.close()


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Traffic:
    metrics_port = free_port()
    grpc_port = free_port()
    env = {
        "TENSORBITS_GRPC_PORT": str(grpc_port),
        "TENSORBITS_METRICS_PORT": str(metrics_port),
        "TENSORBITS_MAX_BODY_BYTES": str(BODY_LIMIT),
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(ADMISSION_BYTES),
        "TENSORBITS_MAX_INFLIGHT_REQUESTS": "1",
        "TENSORBITS_MODEL_REPOSITORY": str(_repository(tmp_path_factory.mktemp("repository"))),
    }
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    with serve(env) as live:
        server = GrpcServer(live, grpc_port)
        _http_calls(server)
        held = _refused_for_admission(server, metrics_url)
        # The metrics port counts no request of its own: what it shows now is HTTP's alone.
        http_routes = _requests_routes(_scrape(metrics_url))
        _grpc_calls(server)
        port_text = _scrape(metrics_url)
        main_text = _scrape(live.base_url)
    exported = Exported()
    exported.add(port_text)
    assert set(exported.labels) == set(_exposed_names(main_text))  # either port: the same names
    exported.add(main_text)
    grpc_routes = _requests_routes(port_text) - http_routes
    return Traffic(exported, grpc_routes, http_routes, held)


def _exposed_names(text: str) -> set[str]:
    return {name for name, _, _ in samples(text)}


@pytest.mark.integration
def test_the_calls_made_every_series_the_dashboard_reads(traffic: Traffic) -> None:
    """The traffic the checks below read: answered, failed and refused calls on both
    protocols, a graph model at version 2 beside the operators, admission seen full."""
    exported = traffic.exported
    statuses = exported.values("tensorbits_requests_total", "status")
    assert {"200", "400", "413", "503"} <= statuses, statuses
    assert "/v2/repository/models/{model}/load" in traffic.http_routes
    assert "/inference.GRPCInferenceService/ModelInfer" in traffic.grpc_routes
    assert {"hamming", NOT} <= exported.values("nv_inference_request_success", "model")
    assert traffic.held["tensorbits_inflight_requests"] == 1
    assert traffic.held["tensorbits_inflight_bytes"] > 0
    # The bounds the in-flight panels plot them against: the server's settings.
    assert traffic.held["tensorbits_inflight_requests_limit"] == 1
    assert traffic.held["tensorbits_inflight_bytes_limit"] == ADMISSION_BYTES
    # The refusals panel's rules: the body limit's 413, admission's 503.
    rules = exported.values("tensorbits_refusals_total", "rule")
    assert {"max_body_bytes", "max_inflight_requests"} <= rules, rules
    assert exported.values("tensorbits_refusals_total", "protocol") == {"http", "grpc"}
    assert exported.values("tensorbits_backend_info", "backend") == {"numpy"}


@pytest.mark.integration
def test_the_models_table_shows_the_version_each_model_serves(traffic: Traffic) -> None:
    """The "Loaded models and versions" table reads the version label of Triton's series."""
    series = traffic.exported.series["nv_inference_request_success"]
    versions = {labels["model"]: labels["version"] for labels in series}
    assert versions[NOT] == "1"
    assert versions["hamming"] == "2"  # the repository's folder 2


def _check_selectors(where: str, parsed: Parsed, exported: Exported) -> None:
    for selector in parsed.selectors:
        metric = selector.metric
        assert metric in exported.labels, f"{where}: {metric!r} is not exported"
        on_metric = set(exported.labels[metric])
        for label, op, value in selector.matchers:
            assert label in on_metric | TARGET_LABELS, f"{where}: {metric} has no label {label!r}"
            if "$" in value or label in TARGET_LABELS:
                continue  # a variable's value, or a target's: not the server's to write
            seen = exported.values(metric, label)
            if op == "=":
                assert value in seen, f"{where}: {metric}{{{label}={value!r}}} never written"
            elif op == "=~":
                assert any(re.fullmatch(value, v) for v in seen), (where, label, value, seen)
            else:
                re.compile(value)


def _check_query(where: str, expr: str, textboxes: dict[str, str], exported: Exported) -> None:
    parsed = parse(substituted(expr, textboxes))
    _check_selectors(where, parsed, exported)
    metrics = [s.metric for s in parsed.selectors]
    for label in parsed.grouping - parsed.created - TARGET_LABELS:
        for metric in metrics:
            assert label in exported.labels[metric], f"{where}: {metric} has no label {label!r}"
    for label, regex in parsed.rewrites:
        if label in TARGET_LABELS:
            continue
        seen = set().union(*(exported.values(metric, label) for metric in metrics))
        assert seen, f"{where}: label_replace reads {label!r}, on none of {metrics}"
        assert any(re.fullmatch(regex, value) for value in seen), (where, regex, seen)


@pytest.mark.integration
def test_every_query_reads_series_the_server_exports(traffic: Traffic) -> None:
    document = dashboard()
    textboxes = _textboxes(document)
    checked = 0
    for title, target in queries(document):
        _check_query(f"{title!r} {target['refId']}", target["expr"], textboxes, traffic.exported)
        checked += 1
    assert checked >= 20


@pytest.mark.integration
def test_every_variable_query_reads_a_label_the_server_exports(traffic: Traffic) -> None:
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"])
        assert match is not None, variable["query"]
        selector, label = match.groups()
        parsed = parse(selector)
        _check_selectors(variable["name"], parsed, traffic.exported)
        (metric,) = [s.metric for s in parsed.selectors]
        assert label in set(traffic.exported.labels[metric]) | TARGET_LABELS


@pytest.mark.integration
def test_the_protocol_label_says_each_calls_protocol(traffic: Traffic) -> None:
    """The dashboard splits by protocol with the server's ``protocol`` label, not by reading
    the route: every route a gRPC call was counted under is labelled grpc, every HTTP one
    http, and no query rewrites a route."""
    by_route: dict[str, set[str]] = {}
    for labels in traffic.exported.series["tensorbits_requests_total"]:
        by_route.setdefault(labels["route"], set()).add(labels["protocol"])
    assert traffic.grpc_routes
    assert traffic.http_routes
    assert all(by_route[route] == {"grpc"} for route in traffic.grpc_routes), by_route
    assert all(by_route[route] == {"http"} for route in traffic.http_routes), by_route
    textboxes = _textboxes(dashboard())
    for title, target in queries(dashboard()):
        assert not parse(substituted(target["expr"], textboxes)).rewrites, title


# ---- (c) the ConfigMap Grafana's sidecar loads -----------------------------------------------------


def test_the_prometheus_operator_overlay_renders_the_dashboard_config_map() -> None:
    (config_map,) = [d for d in kustomize(OVERLAY) if d["kind"] == "ConfigMap"]
    metadata = config_map["metadata"]
    assert metadata["name"] == CONFIG_MAP  # no hash suffix: a new version replaces it
    assert metadata["labels"]["grafana_dashboard"] == "1"  # what the sidecar looks for
    assert "namespace" not in metadata  # the namespace it is applied to
    assert list(config_map["data"]) == ["tensorbits.json"]
    assert config_map["data"]["tensorbits.json"] == DASHBOARD_FILE.read_text(encoding="utf-8")
    kinds = sorted(d["kind"] for d in kustomize(OVERLAY))
    assert kinds == ["ConfigMap", "ServiceMonitor"]


def test_the_dashboard_fits_a_config_map_applied_client_side() -> None:
    """`kubectl apply` keeps the whole object in an annotation, 256 KiB at most."""
    assert len(DASHBOARD_FILE.read_bytes()) < 128 * 1024


def test_the_compose_provisioning_note_points_at_the_file() -> None:
    readme = (DOCKER / "README.md").read_text(encoding="utf-8")
    assert "docker/grafana/tensorbits.json" in readme
    assert "grafana_dashboard" in readme
