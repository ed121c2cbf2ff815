"""Access control in the deployment files: the API keys come from a Secret mounted as a file
(Compose: a secret file), never from a literal; the probes stay on the routes open without a key
(checked by serving the manifests' own settings in process); the NetworkPolicies admit only the
namespaces they say. Schema validity is test_k8s.py's and test_compose.py's."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
from deploy.files import COMPOSE_FILE, env_list, k8s_resource, kustomize
from support.inprocess import TestClient

from tensorbits.config.settings import Settings
from tensorbits.server.app import create_app

SECRET_NAME = "tensorbits-api-keys"
CLIENT_LABEL = {"tensorbits/client": "true"}
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}


def _deployment_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    pod: dict[str, Any] = k8s_resource("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def _isvc_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    predictor: dict[str, Any] = k8s_resource("InferenceService")["spec"]["predictor"]
    (container,) = predictor["containers"]
    return predictor, container


PODS = {"deployment": _deployment_pod, "inferenceservice": _isvc_pod}


def _network_policy(kustomization: str) -> dict[str, Any]:
    (policy,) = [d for d in kustomize(kustomization) if d["kind"] == "NetworkPolicy"]
    return policy


def _secret_file(pod: dict[str, Any], container: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The key file's path and the Secret volume it lies in, from TENSORBITS_API_KEYS_FILE."""
    path = PurePosixPath(env_list(container)["TENSORBITS_API_KEYS_FILE"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        if path.is_relative_to(mount["mountPath"]):
            volume = volumes[mount["name"]]
            assert mount.get("readOnly") is True
            assert "subPath" not in mount, "a subPath mount would not follow Secret updates"
            return str(path.relative_to(mount["mountPath"])), volume
    pytest.fail(f"{path} is on no mounted volume")


@pytest.mark.parametrize("kind", PODS)
def test_keys_come_from_the_secret_as_a_file(kind: str) -> None:
    pod, container = PODS[kind]()
    names = [e["name"] for e in container["env"]]
    assert "TENSORBITS_API_KEYS" not in names, "keys in a manifest are keys in git"
    relative, volume = _secret_file(pod, container)
    secret = volume["secret"]
    assert secret["secretName"] == SECRET_NAME
    assert secret.get("optional", False) is False, "no Secret must mean no pod, not an open one"
    (item,) = secret["items"]
    assert item["path"] == relative
    assert item["key"] == "api-keys"
    mode = secret["defaultMode"]
    assert mode & 0o222 == 0, f"{mode:o}: read-only"
    assert mode & 0o077 in (0o040, 0o044), f"{mode:o}: the owner's group may read it"
    if mode & 0o004 == 0:  # not world-readable: the server's group must own the file
        assert pod["securityContext"]["fsGroup"] == 10001


def _manifest_settings(
    container: dict[str, Any], keys: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The container's TENSORBITS_* settings, with its key file replaced by ``keys``, the
    backend by NumPy, gRPC and the metrics port off; nothing from this process's environment."""
    for name in list(os.environ):
        if name.startswith("TENSORBITS_"):
            monkeypatch.delenv(name)
    for name, value in env_list(container).items():
        if name.startswith("TENSORBITS_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("TENSORBITS_API_KEYS_FILE", str(keys))
    monkeypatch.setenv("TENSORBITS_BACKEND", "numpy")
    monkeypatch.setenv("TENSORBITS_GRPC_PORT", "0")  # HTTP is what these tests drive
    monkeypatch.setenv("TENSORBITS_METRICS_PORT", "0")  # the main port's /metrics is the one
    return Settings()


@pytest.mark.parametrize("kind", PODS)
def test_the_probes_reach_open_routes_and_the_rest_is_closed(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, container = PODS[kind]()
    keys = tmp_path / "api-keys"
    keys.write_text("deployed-key\n")
    settings = _manifest_settings(container, keys, monkeypatch)
    assert [k.get_secret_value() for k in settings.accepted_api_keys] == ["deployed-key"]
    probes = [
        container[p]["httpGet"]["path"]
        for p in container
        if p.endswith("Probe") and "httpGet" in container[p]
    ]
    assert probes
    # The gRPC probes ask the standard health service, which never wants a key (service.py).
    for probe in (container[p] for p in container if p.endswith("Probe")):
        assert set(probe) & {"httpGet", "grpc"}, probe
    with TestClient(create_app(settings)) as client:
        for path in probes:
            assert client.get(path).status_code == 200, path  # the kubelet sends no key
        for path in ("/v2", "/metrics", "/v1/operators"):
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers={"X-API-Key": "deployed-key"}).status_code == 200


def _pod_labels() -> dict[str, str]:
    labels: dict[str, str] = k8s_resource("Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def _admitted(policy: dict[str, Any]) -> list[dict[str, str]]:
    """The matchLabels of every namespace an ingress rule admits; fails on anything broader (an
    empty selector admits every namespace; ipBlock or a podSelector alone admit other things)."""
    admitted = []
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            assert set(peer) == {"namespaceSelector"}, peer
            selector = peer["namespaceSelector"]
            assert set(selector) == {"matchLabels"}, selector
            assert selector["matchLabels"], "an empty selector admits every namespace"
            admitted.append(selector["matchLabels"])
    return admitted


def test_the_network_policy_admits_labelled_namespaces_on_the_served_ports() -> None:
    """Clients: the HTTP and gRPC ports and nothing else. The monitoring namespace: the metrics
    port alone. Together, every port the container has."""
    policy = _network_policy("networkpolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= _pod_labels().items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert _admitted(policy) == [CLIENT_LABEL, MONITORING]
    clients, monitoring = policy["spec"]["ingress"]
    _, container = _deployment_pod()
    for rule in (clients, monitoring):
        assert {p["protocol"] for p in rule["ports"]} == {"TCP"}
    assert sorted(p["port"] for p in clients["ports"]) == ["grpc", "http"]
    assert [p["port"] for p in monitoring["ports"]] == ["metrics"]
    every = sorted(p["port"] for rule in (clients, monitoring) for p in rule["ports"])
    assert every == sorted(p["name"] for p in container["ports"])


def test_the_kserve_network_policy_admits_the_gateway_knative_and_labelled_namespaces() -> None:
    policy = _network_policy("kserve")
    isvc = k8s_resource("InferenceService")
    # KServe labels the predictor's pods with the InferenceService's name.
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "serving.kserve.io/inferenceservice": isvc["metadata"]["name"]
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert _admitted(policy) == [
        {"kubernetes.io/metadata.name": "istio-system"},
        {"kubernetes.io/metadata.name": "knative-serving"},
        CLIENT_LABEL,
    ]


# ---- Compose -----------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as handle:
        document: dict[str, Any] = yaml.safe_load(handle)
    return document


@pytest.mark.parametrize("service", ["tensorbits-gpu", "tensorbits-cpu"])
def test_compose_services_read_keys_from_a_secret_file(service: str) -> None:
    compose = _compose()
    spec = compose["services"][service]
    assert "TENSORBITS_API_KEYS" not in spec["environment"]
    (secret,) = spec["secrets"]
    file = spec["environment"]["TENSORBITS_API_KEYS_FILE"]
    # Compose mounts a service's secret at /run/secrets/<target>.
    assert file == posixpath.join("/run/secrets", secret["target"])
    source = compose["secrets"][secret["source"]]
    assert source["file"] == "${TENSORBITS_API_KEYS_SECRET_FILE:-./api-keys}"
    ignored = (COMPOSE_FILE.parents[1] / ".gitignore").read_text().splitlines()
    assert "/docker/api-keys" in ignored, "the default key file must stay out of git"
