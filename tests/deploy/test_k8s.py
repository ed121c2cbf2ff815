"""docker/k8s/: every document its kustomizations render (`kubectl kustomize`, what `kubectl
apply -k` applies) valid against the Kubernetes schemas, offline, and saying what the deployment
needs (one GPU per pod, health probes, non-root, read-only root, scaling). What each
kustomization adds or leaves out is test_kustomize.py's.

kubernetes-validate ships the Kubernetes OpenAPI schemas per version (strict variants reject
unknown fields), so this needs no cluster and no network. KServe's InferenceService is a CRD,
not in those schemas: its pod part (the predictor is a PodSpec plus KServe's extension fields)
is validated against the same PodSpec/Container schemas, and the rest is checked field by field
against KServe's v1beta1 API (pkg/apis/serving/v1beta1: predictor.go, component.go,
predictor_custom.go).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from deploy.files import (
    K8S,
    K8S_BASE,
    K8S_CHECKED,
    K8S_KSERVE,
    K8S_VARIANTS,
    KUSTOMIZATIONS,
    dockerfile,
    env_list,
    exposed_ports,
    k8s_named,
    k8s_resource,
    k8s_resources,
    kustomize,
    load_yaml_documents,
)

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed (dev dependency)")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate not installed (dev dependency)"
)
from kubernetes_validate import utils as kv_utils  # type: ignore[import-untyped]  # noqa: E402

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # no type hints

# The oldest Kubernetes minor version these manifests promise to fit, and the newest the
# installed kubernetes-validate knows. Every shipped version in between is checked too.
OLDEST_KUBERNETES = "1.28"
KSERVE_API_VERSION = "serving.kserve.io/v1beta1"
# ComponentExtensionSpec (component.go), inlined into PredictorSpec next to the PodSpec.
KSERVE_COMPONENT_FIELDS: dict[str, Any] = {
    "minReplicas": {"type": "integer", "minimum": 0},
    "maxReplicas": {"type": "integer", "minimum": 0},
    "scaleTarget": {"type": "integer", "minimum": 1},
    "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
    "containerConcurrency": {"type": "integer", "minimum": 0},
    "timeout": {"type": "integer", "minimum": 1},
    "canaryTrafficPercent": {"type": "integer", "minimum": 0, "maximum": 100},
    "logger": {"type": "object"},
    "batcher": {"type": "object"},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    "deploymentStrategy": {"type": "object"},
    "autoScaling": {"type": "object"},
}


def _versions() -> list[str]:
    shipped = sorted(
        {kv_utils.major_minor(v) for v in kv_utils.all_versions()},
        key=lambda v: tuple(map(int, v.split("."))),
    )
    oldest = tuple(map(int, OLDEST_KUBERNETES.split(".")))
    chosen = [v for v in shipped if tuple(map(int, v.split("."))) >= oldest]
    assert chosen, f"kubernetes-validate ships nothing from {OLDEST_KUBERNETES} on"
    return chosen


# Custom resources, not in the Kubernetes schemas: checked field by field below.
CRD_GROUPS = ("serving.kserve.io/", "monitoring.coreos.com/")


# ---- schema validation ----------------------------------------------------------------------------


def test_manifests_are_present() -> None:
    assert set(K8S_CHECKED) <= set(KUSTOMIZATIONS)
    kinds = sorted(d["kind"] for _, d in k8s_resources())
    assert kinds == [
        "ConfigMap",  # the Grafana dashboard (prometheus-operator/)
        "Deployment",
        "HorizontalPodAutoscaler",
        "InferenceService",
        "NetworkPolicy",  # the plain Deployment's
        "NetworkPolicy",  # the InferenceService's (kserve/)
        "PodDisruptionBudget",
        "Service",  # one address, HTTP, gRPC and metrics
        "Service",  # headless, for gRPC's client-side round robin
        "ServiceMonitor",  # the Prometheus Operator's
    ]


@pytest.mark.parametrize("version", _versions())
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_manifest_validates_strictly(kustomization: str, version: str) -> None:
    """Every built-in kind each kustomization renders (the variants' patched Deployments too)."""
    plain = [d for d in kustomize(kustomization) if not d["apiVersion"].startswith(CRD_GROUPS)]
    for resource in plain:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(
                f"docker/k8s/{kustomization} {resource['kind']} against Kubernetes {version}: "
                f"{where}: {exc.message}"
            )


def test_strict_validation_catches_mistakes() -> None:
    """The check above means something: an unknown field and a wrong type are refused."""
    deployment = json.loads(json.dumps(k8s_resource("Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, _versions()[-1], strict=True)
    hpa = json.loads(json.dumps(k8s_resource("HorizontalPodAutoscaler")))
    hpa["spec"]["minReplicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, _versions()[-1], strict=True)


def test_inference_service_is_not_in_the_kubernetes_schemas() -> None:
    """Why it gets its own validation below: it is KServe's CRD, not a built-in kind."""
    with pytest.raises(kv_utils.SchemaNotFoundError):
        kubernetes_validate.validate(k8s_resource("InferenceService"), _versions()[-1], strict=True)


@cache
def _definitions(version: str) -> dict[str, Any]:
    full = kv_utils.latest_version() if version == "latest" else version
    schemas = kv_utils.schema_contents(
        f"kubernetes-json-schema/v{full}-local-strict/_definitions.json", full
    )
    assert isinstance(schemas, dict)
    return schemas


def _definition_validator(name: str) -> Draft202012Validator:
    """A validator for one Kubernetes type (io.k8s.api.core.v1.PodSpec, ...) whose references
    resolve inside the strict _definitions.json of the newest shipped version."""
    definitions = _definitions("latest")
    schema = {**definitions, "$ref": f"#/$defs/{name}"}
    return jsonschema.Draft202012Validator(schema)


def _messages(validator: Draft202012Validator, instance: Any) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(instance)
    ]


def test_inference_service_predictor_is_a_valid_pod_spec_with_kserve_fields() -> None:
    isvc = k8s_resource("InferenceService")
    assert set(isvc) == {"apiVersion", "kind", "metadata", "spec"}
    assert (
        _messages(
            _definition_validator("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
            isvc["metadata"],
        )
        == []
    )
    assert set(isvc["spec"]) == {"predictor"}, "a predictor only: no transformer or explainer"
    predictor = dict(isvc["spec"]["predictor"])
    extensions = {k: predictor.pop(k) for k in list(predictor) if k in KSERVE_COMPONENT_FIELDS}
    extension_schema = {
        "type": "object",
        "properties": KSERVE_COMPONENT_FIELDS,
        "additionalProperties": False,
    }
    assert _messages(jsonschema.Draft202012Validator(extension_schema), extensions) == []
    # What is left is the inlined PodSpec: strict, so a KServe-only or misspelt key fails here.
    pod_spec = _definition_validator("io.k8s.api.core.v1.PodSpec")
    assert _messages(pod_spec, predictor) == []
    # and the check bites:
    assert _messages(pod_spec, {**predictor, "protocolVersion": "v2"}) != []


# ---- the plain Deployment ---------------------------------------------------------------------------


# The kustomizations that render a Deployment: the base and the variants that replace it.
DEPLOYMENTS = (K8S_BASE, *K8S_VARIANTS)


def _pod_spec(kustomization: str = K8S_BASE) -> dict[str, Any]:
    deployment = k8s_resource("Deployment", kustomization)
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _container(kustomization: str = K8S_BASE) -> dict[str, Any]:
    (container,) = _pod_spec(kustomization)["containers"]
    assert isinstance(container, dict)
    return container


def _port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    assert isinstance(number, int)
    return number


def test_deployment_asks_for_one_gpu_in_limits() -> None:
    resources = _container()["resources"]
    assert str(resources["limits"]["nvidia.com/gpu"]) == "1"
    # requests alone are invalid for extended resources; equal if both are given
    gpu_request = resources.get("requests", {}).get("nvidia.com/gpu")
    assert gpu_request is None or str(gpu_request) == "1"
    assert {"cpu", "memory"} <= set(resources["requests"]), "the scheduler and HPA need requests"


def test_deployment_probes_map_to_the_v2_health_endpoints() -> None:
    container = _container()
    port = int(env_list(container)["TENSORBITS_PORT"])
    # (The start-up probe asks the gRPC health service: test_startup_probe_asks_the_grpc_...)
    for probe, path in (
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert _port_number(container, get["port"]) == port, probe


def test_deployment_runs_the_image_as_its_non_root_user_on_a_read_only_root() -> None:
    pod, container = _pod_spec(), _container()
    user = dockerfile("gpu").final.last("USER")
    assert user is not None
    uid, _, gid = user.rest.partition(":")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsGroup"] == int(gid)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False


def _writable_mounts(pod: dict[str, Any], container: dict[str, Any]) -> set[str]:
    empty_dirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    return {m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty_dirs}


def test_deployment_gives_the_kernel_cache_and_tmp_a_writable_volume() -> None:
    container = _container()
    cache_dir = env_list(container)["CUPY_CACHE_DIR"]
    assert cache_dir == dockerfile("gpu").final.env()["CUPY_CACHE_DIR"]
    assert {cache_dir, "/tmp"} <= _writable_mounts(_pod_spec(), container)


def test_deployment_env_matches_the_image() -> None:
    env = env_list(_container())
    image_env = dockerfile("gpu").final.env()
    assert env["TENSORBITS_BACKEND"] == "cupy"
    assert env["TENSORBITS_WORKERS"] == "1", "one worker per GPU"
    assert env["TENSORBITS_PORT"] == image_env["TENSORBITS_PORT"]
    assert env["TENSORBITS_HOST"] == "0.0.0.0"
    assert ":latest" not in _container()["image"]
    assert _container()["image"].endswith("-gpu")


def test_service_hpa_and_pdb_point_at_the_deployment() -> None:
    deployment = k8s_resource("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"

    service = k8s_named("Service", "tensorbits")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"http", "grpc", "metrics"}
    assert _port_number(_container(), ports["http"]["targetPort"]) == 8000
    # gRPC at TENSORBITS_GRPC_PORT's default (the manifest leaves it unset).
    assert _port_number(_container(), ports["grpc"]["targetPort"]) == 8001
    assert ports["grpc"]["port"] == 8001
    assert "TENSORBITS_GRPC_PORT" not in env_list(_container())

    hpa = k8s_resource("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "Deployment",
        deployment["metadata"]["name"],
    )
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] == "Resource":
            name = metric["resource"]["name"]
            assert name in _container()["resources"]["requests"], f"HPA on {name} needs requests"

    pdb = k8s_resource("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"], "drains must be possible"


# ---- the KServe InferenceService --------------------------------------------------------------------


def _isvc_container() -> dict[str, Any]:
    containers = k8s_resource("InferenceService")["spec"]["predictor"]["containers"]
    (container,) = containers
    assert isinstance(container, dict)
    return container


def test_inference_service_is_a_custom_v2_predictor_on_8080() -> None:
    isvc = k8s_resource("InferenceService")
    assert isvc["apiVersion"] == KSERVE_API_VERSION
    assert isvc["kind"] == "InferenceService"
    container = _isvc_container()
    assert container["name"] == "kserve-container"
    env = env_list(container)
    # The protocol of a custom container is its PROTOCOL env var (predictor_custom.go); the
    # protocolVersion field exists only on KServe's built-in model specs.
    assert env["PROTOCOL"] == "v2"
    assert "protocolVersion" not in isvc["spec"]["predictor"]
    # KServe's default port, reached through the server's settings, not a different image.
    assert env["TENSORBITS_PORT"] == "8080"
    assert [p["containerPort"] for p in container["ports"]] == [8080]
    assert "command" not in container, "the image's own start command"
    assert "args" not in container
    assert env["TENSORBITS_WORKERS"] == "1"


def test_inference_service_probes_resources_and_security() -> None:
    predictor = k8s_resource("InferenceService")["spec"]["predictor"]
    container = _isvc_container()
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    cache_dir = env_list(container)["CUPY_CACHE_DIR"]
    assert {cache_dir, "/tmp"} <= _writable_mounts(predictor, container)
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"], "no scale-to-zero"
    assert predictor["scaleMetric"] == "concurrency"


# ---- stopping, probes, metrics, gRPC balancing ----------------------------------------------------


def _setting(container: dict[str, Any], name: str) -> float:
    """A setting as the container's server reads it: its env value, else the Settings default."""
    from tensorbits.config.settings import Settings

    env = env_list(container)
    variable = f"TENSORBITS_{name.upper()}"
    if variable in env:
        return float(env[variable])
    default = Settings.model_fields[name].default
    assert isinstance(default, int | float)
    return float(default)


def _prestop_seconds(container: dict[str, Any]) -> float:
    """The preStop hook's sleep: ``sleep: {seconds: N}`` or ``exec: [sleep, N]``."""
    hook = container["lifecycle"]["preStop"]
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    command = hook["exec"]["command"]
    assert command[0] == "sleep", command
    assert len(command) == 2, command
    return float(command[1])


@pytest.mark.parametrize("kustomization", DEPLOYMENTS)
def test_the_stop_fits_the_grace_period(kustomization: str) -> None:
    """The kubelet's SIGKILL comes terminationGracePeriodSeconds after the stop began, the
    preStop hook included: the hook's sleep, the server's drain delay and its graceful timeout
    must all fit, with a margin, or requests still in flight are cut."""
    pod, container = _pod_spec(kustomization), _container(kustomization)
    prestop = _prestop_seconds(container)
    delay = _setting(container, "drain_delay")
    drain = _setting(container, "timeout_graceful_shutdown")
    grace = pod["terminationGracePeriodSeconds"]
    assert prestop >= 5, "the endpoint removal takes seconds to reach every proxy"
    assert grace > prestop + delay + drain, (grace, prestop, delay, drain)
    assert drain >= 10, "the requests in flight need time to finish"


# ---- memory: the limit is the sum of what the server may hold ------------------------------------

# In a comment of the manifest (or of the kustomization it comes from), terms joined by " + ":
#   limits.memory (4Gi) = TENSORBITS_MAX_INFLIGHT_BYTES (2Gi) + ... + base (1Gi) + headroom (768Mi)
_TERM_PATTERN = r"[\w.]+ \([^)]+\)"
_TERMS_PATTERN = rf"{_TERM_PATTERN}(?: \+ {_TERM_PATTERN})*"
_MEMORY_SUM = re.compile(rf"limits\.memory \(([^)]+)\) = ({_TERMS_PATTERN})")
_TERM = re.compile(r"([\w.]+) \(([^)]+)\)")
_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
# The settings each backend's sum must name, in order (the pinned pool is CuPy's alone).
_MEMORY_SETTINGS = {
    "cupy": ["TENSORBITS_MAX_INFLIGHT_BYTES", "TENSORBITS_PINNED_POOL_BYTES"],
    "numpy": ["TENSORBITS_MAX_INFLIGHT_BYTES"],
}
# The least base a sum may state: the server without requests (the interpreter and its
# libraries; on CuPy, CUDA's context and CuPy too).
_MIN_BASE = {"cupy": 1 << 30, "numpy": 512 << 20}


def _quantity(text: object) -> int:
    """A Kubernetes memory quantity in bytes (a plain number or a binary suffix)."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(text))
    assert match, f"{text!r}: not a byte count or binary quantity"
    return int(match[1]) * _UNITS[match[2] or ""]


def _memory_sum(kustomization: str) -> tuple[Path, int, list[tuple[str, int]]]:
    """The comment stating the memory sum that ``kustomization`` renders: in its own folder's
    YAML files, else in the folders it builds on (``resources: [../x]``), nearest first."""
    folder = K8S / kustomization
    for path in sorted(folder.glob("*.yaml")):
        comments = [
            line.split("#", 1)[1]
            for line in path.read_text().splitlines()
            if line.lstrip().startswith("#")
        ]
        match = _MEMORY_SUM.search(" ".join(" ".join(comments).split()))
        if match:
            terms = [(name, _quantity(value)) for name, value in _TERM.findall(match[2])]
            return path, _quantity(match[1]), terms
    (kustomization_file,) = load_yaml_documents(folder / "kustomization.yaml")
    for resource in kustomization_file["resources"]:
        if resource.startswith("../") and (K8S / kustomization / resource).is_dir():
            return _memory_sum(Path(resource).name)
    raise AssertionError(f"docker/k8s/{kustomization}: no comment states the memory limit's sum")


def _check_memory_sum(kustomization: str, container: dict[str, Any]) -> None:
    from tensorbits.config.settings import Settings

    path, stated, terms = _memory_sum(kustomization)
    where = path.relative_to(K8S.parent.parent)
    env = env_list(container)
    backend = env["TENSORBITS_BACKEND"]
    limit = _quantity(container["resources"]["limits"]["memory"])
    assert stated == limit, f"{where} states limits.memory {stated}, the limit is {limit}"
    names = [name for name, _ in terms]
    assert names == [*_MEMORY_SETTINGS[backend], "base", "headroom"], (where, names)
    for name, value in terms[:-2]:
        assert name in env, f"{name}: a term of the sum is set in the env, not left to a default"
        assert _quantity(env[name]) == value, f"{where}: {name} is {env[name]} in the env"
    if backend == "numpy":
        assert "TENSORBITS_PINNED_POOL_BYTES" not in env, "no pinned pool without CuPy"
    base, headroom = terms[-2][1], terms[-1][1]
    assert base >= _MIN_BASE[backend], f"{where}: a base of {base} bytes is too little"
    assert headroom >= 0
    assert sum(value for _, value in terms) == limit, f"{where}: the terms do not add up"
    # And the server accepts them together (the pool at most the bytes in flight).
    Settings.model_validate(
        {name.removeprefix("TENSORBITS_").lower(): env[name] for name in names[:-2]}
    )


@pytest.mark.parametrize("kustomization", DEPLOYMENTS)
def test_the_memory_limit_is_the_sum_of_what_the_server_may_hold(kustomization: str) -> None:
    """The container's memory limit is the sum its manifest's comment states: the bytes in
    flight, on CuPy the pinned pool, a base and a headroom; each setting's term the value the
    rendered env gives it, so changing one without the limit (or the comment) fails here."""
    _check_memory_sum(kustomization, _container(kustomization))


def test_the_inference_services_memory_limit_is_the_same_sum() -> None:
    _check_memory_sum(K8S_KSERVE, _isvc_container())


def test_the_memory_sum_is_read_from_the_comments() -> None:
    """The reader itself: a sum over continuation lines, and the terms it finds."""
    text = "limits.memory (4Gi) = A_B (2Gi) + C (256Mi) + base (1Gi) + headroom (768Mi) Then (x)"
    match = _MEMORY_SUM.search(text)
    assert match is not None
    assert _quantity(match[1]) == 4 << 30
    assert _TERM.findall(match[2]) == [
        ("A_B", "2Gi"), ("C", "256Mi"), ("base", "1Gi"), ("headroom", "768Mi")
    ]  # fmt: skip
    assert _quantity("268435456") == 256 << 20


def test_startup_probe_asks_the_grpc_health_service() -> None:
    """A `grpc:` probe: on the container's gRPC port (a number: Kubernetes takes no name there),
    for a service the server's health service knows (an unknown one would never pass)."""
    from tensorbits.grpc.service import SERVICE_NAME

    container = _container()
    probe = container["startupProbe"]["grpc"]
    assert probe["port"] == _port_number(container, "grpc") == _setting(container, "grpc_port")
    assert probe.get("service", "") in ("", SERVICE_NAME)
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"


def test_the_grpc_health_service_serves_the_probed_name() -> None:
    """The name the probe sends, asked of the real health service over a real runtime: SERVING
    while ready, NOT_SERVING once the drain begins (what takes the pod out)."""
    from grpc_health.v1 import health_pb2

    from tensorbits.config.settings import Settings
    from tensorbits.grpc.server import Health
    from tensorbits.runtime import Runtime

    service = _container()["startupProbe"]["grpc"].get("service", "")
    runtime = Runtime.start(Settings(backend="numpy", grpc_port=0))
    try:
        health = Health(runtime)
        assert health._status(service) == health_pb2.HealthCheckResponse.SERVING
        runtime.drain.begin()
        assert health._status(service) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        runtime.close()


def test_ports_agree_across_the_image_and_the_manifests() -> None:
    """HTTP 8000, gRPC 8001, metrics 8002: the images' EXPOSE and ENV, the Deployment's
    container ports and env, the Service, the NetworkPolicy's named ports, the ServiceMonitor,
    the pod annotations, the InferenceService's annotations and env."""
    container = _container()
    numbers = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert numbers == {"http": 8000, "grpc": 8001, "metrics": 8002}
    for kind in ("cpu", "gpu"):
        assert exposed_ports(kind) == set(numbers.values()), kind
        image_env = dockerfile(kind).final.env()
        assert int(image_env["TENSORBITS_PORT"]) == numbers["http"], kind
        assert int(image_env["TENSORBITS_METRICS_PORT"]) == numbers["metrics"], kind
    assert _setting(container, "port") == numbers["http"]
    assert _setting(container, "grpc_port") == numbers["grpc"]
    assert _setting(container, "metrics_port") == numbers["metrics"]

    service = k8s_named("Service", "tensorbits")
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in numbers, port
        assert port["port"] == numbers[port["targetPort"]], port

    annotations = k8s_resource("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == numbers["metrics"]
    assert annotations["prometheus.io/path"] == "/metrics"

    monitor = k8s_resource("ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"

    isvc = k8s_resource("InferenceService")
    isvc_env = env_list(_isvc_container())
    assert (
        isvc["metadata"]["annotations"]["prometheus.kserve.io/port"]
        == isvc_env["TENSORBITS_METRICS_PORT"]
    )
    assert isvc["metadata"]["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    assert isvc_env["TENSORBITS_METRICS_PORT"] not in (isvc_env["TENSORBITS_PORT"], "8001")


def test_the_service_monitor_selects_the_metrics_service_only() -> None:
    monitor = k8s_resource("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [d for _, d in k8s_resources() if d["kind"] == "Service"]
    chosen = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in chosen] == ["tensorbits"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "scheme", "interval", "scrapeTimeout"}, endpoint
    assert endpoint["scheme"] == "http"


def test_the_headless_service_publishes_every_ready_pod_for_grpc() -> None:
    headless = k8s_named("Service", "tensorbits-grpc")
    pod_labels = k8s_resource("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= pod_labels.items()
    assert headless["spec"].get("publishNotReadyAddresses", False) is False
    (port,) = headless["spec"]["ports"]
    assert (port["name"], port["targetPort"], port["appProtocol"]) == ("grpc", "grpc", "grpc")
    assert port["port"] == _port_number(_container(), "grpc")


def test_the_inference_service_lands_on_gpu_nodes_as_the_deployment_does() -> None:
    """As the base: the device plugin's GPU and its taint's toleration, nothing that only the
    GPU Operator provides (test_kustomize.py: the gpu-operator overlay adds those)."""
    predictor = k8s_resource("InferenceService")["spec"]["predictor"]
    pod = _pod_spec()
    for key in ("tolerations", "nodeSelector", "runtimeClassName"):
        assert predictor.get(key) == pod.get(key), key
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
