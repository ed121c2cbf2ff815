"""docker/k8s/: every manifest valid against the Kubernetes schemas, offline, and saying what
the deployment needs (one GPU per pod, health probes, non-root, read-only root, scaling).

kubernetes-validate ships the Kubernetes OpenAPI schemas per version (strict variants reject
unknown fields), so this needs no cluster and no network. KServe's InferenceService is a CRD,
not in those schemas: its pod part (the predictor is a PodSpec plus KServe's extension fields)
is validated against the same PodSpec/Container schemas, and the rest is checked field by field
against KServe's v1beta1 API (pkg/apis/serving/v1beta1: predictor.go, component.go,
predictor_custom.go).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from deploy.deployfiles import (
    K8S,
    dockerfile,
    env_list,
    k8s_manifest_paths,
    k8s_resource,
    k8s_resources,
)

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed (dev dependency)")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate not installed (dev dependency)"
)
from kubernetes_validate import utils as kv_utils  # noqa: E402

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


def _label(path: Path) -> str:
    return path.relative_to(K8S).as_posix()


def _plain_resources() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p, d in k8s_resources() if not d["apiVersion"].startswith("serving.kserve")]


# ---- schema validation ----------------------------------------------------------------------------


def test_manifests_are_present() -> None:
    kinds = sorted(d["kind"] for _, d in k8s_resources())
    assert kinds == [
        "Deployment",
        "HorizontalPodAutoscaler",
        "InferenceService",
        "NetworkPolicy",  # the plain Deployment's
        "NetworkPolicy",  # the InferenceService's (kserve/)
        "PodDisruptionBudget",
        "Service",
    ]
    assert all(p.suffix == ".yaml" for p in k8s_manifest_paths())


@pytest.mark.parametrize("version", _versions())
@pytest.mark.parametrize(
    ("path", "resource"),
    _plain_resources(),
    ids=[f"{_label(p)}:{d['kind']}" for p, d in _plain_resources()],
)
def test_manifest_validates_strictly(path: Path, resource: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(resource, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{_label(path)} against Kubernetes {version}: {where}: {exc.message}")


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


def _definition_validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator for one Kubernetes type (io.k8s.api.core.v1.PodSpec, ...) whose references
    resolve inside the strict _definitions.json of the newest shipped version."""
    definitions = _definitions("latest")
    schema = {**definitions, "$ref": f"#/$defs/{name}"}
    return jsonschema.Draft202012Validator(schema)


def _messages(validator: jsonschema.Draft202012Validator, instance: Any) -> list[str]:
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


def _pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = k8s_resource("Deployment")["spec"]["template"]["spec"]
    return spec


def _container() -> dict[str, Any]:
    (container,) = _pod_spec()["containers"]
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
    for probe, path in (
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
        ("startupProbe", "/v2/health/live"),
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

    service = k8s_resource("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"http", "grpc"}
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
