"""docker/k8s/ as kustomizations: each folder renders (`kubectl kustomize`, what `kubectl apply -k`
applies) exactly what docker/README.md says it applies. The base needs nothing but the device
plugin (no CRD, no NetworkPolicy, no GPU Operator); the cpu variant asks for no GPU; the
gpu-operator variant adds the operator's RuntimeClass and node label and nothing else; each add-on
holds its own objects only (prometheus-operator: the ServiceMonitor and the Grafana dashboard's
ConfigMap). Schema validity and the manifests' own arithmetic are
test_k8s.py's, on the same rendered documents."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
from deploy.files import (
    DOCKER,
    K8S,
    K8S_ADD_ONS,
    K8S_BASE,
    K8S_KSERVE,
    K8S_VARIANTS,
    KUSTOMIZATIONS,
    env_list,
    kustomize,
)

WORKLOAD = ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "Service"]
# The kinds each kustomization renders, sorted.
RENDERS: dict[str, list[str]] = {
    K8S_BASE: WORKLOAD,
    "cpu": WORKLOAD,
    "gpu-operator": WORKLOAD,
    "repository-poll": sorted(["ConfigMap", *WORKLOAD]),
    "prometheus-operator": ["ConfigMap", "ServiceMonitor"],
    "networkpolicy": ["NetworkPolicy"],
    K8S_KSERVE: ["InferenceService", "NetworkPolicy"],
}
# API groups that exist only where an operator installed their CRDs: `kubectl apply` refuses them
# elsewhere.
CRD_GROUPS = ("monitoring.coreos.com/", "serving.kserve.io/")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# What only NVIDIA's GPU Operator provides (its RuntimeClass, its feature discovery's label).
GPU_OPERATOR_POD = {
    "runtimeClassName": "nvidia",
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
}


def _deployment(kustomization: str) -> dict[str, Any]:
    (deployment,) = [d for d in kustomize(kustomization) if d["kind"] == "Deployment"]
    return deployment


def _pod(kustomization: str) -> dict[str, Any]:
    pod: dict[str, Any] = _deployment(kustomization)["spec"]["template"]["spec"]
    return pod


def _others(kustomization: str) -> list[dict[str, Any]]:
    return [d for d in kustomize(kustomization) if d["kind"] != "Deployment"]


def test_every_folder_is_a_kustomization_listing_all_its_manifests() -> None:
    folders = sorted(p.parent.name for p in K8S.glob("*/kustomization.yaml"))
    assert folders == sorted(KUSTOMIZATIONS) == sorted(RENDERS)
    assert not list(K8S.glob("*.yaml")), "a manifest outside every kustomization"
    for name in KUSTOMIZATIONS:
        folder = K8S / name
        listed = yaml.safe_load((folder / "kustomization.yaml").read_text()).get("resources", [])
        files = sorted(p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
        assert sorted(r for r in listed if r.endswith(".yaml")) == files, name


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_each_kustomization_renders_its_objects(kustomization: str) -> None:
    assert sorted(d["kind"] for d in kustomize(kustomization)) == RENDERS[kustomization]


def test_the_base_applies_on_any_cluster_with_the_device_plugin() -> None:
    """No custom resource (kubectl refuses one without its CRD), no NetworkPolicy (it would shut
    out every unlabelled namespace), nothing only the GPU Operator provides; the GPU comes from
    the device plugin's resource, with its taint tolerated."""
    documents = kustomize(K8S_BASE)
    assert not [d["kind"] for d in documents if d["apiVersion"].startswith(CRD_GROUPS)]
    assert "NetworkPolicy" not in {d["kind"] for d in documents}
    pod = _pod(K8S_BASE)
    assert not set(GPU_OPERATOR_POD) & set(pod)
    assert pod["tolerations"] == [GPU_TOLERATION]
    (container,) = pod["containers"]
    assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    assert env_list(container)["TENSORBITS_BACKEND"] == "cupy"
    assert container["image"] == "tensorbits:0.1.0-gpu"


def test_the_cpu_variant_asks_for_no_gpu() -> None:
    pod = _pod("cpu")
    assert "nvidia" not in yaml.safe_dump(_deployment("cpu")), "a GPU resource, label or class"
    assert not {"runtimeClassName", "nodeSelector", "tolerations"} & set(pod)
    (container,) = pod["containers"]
    env = env_list(container)
    assert env["TENSORBITS_BACKEND"] == "numpy"
    assert "cupy" not in yaml.safe_dump(pod).lower(), "a CuPy setting or kernel cache"
    assert container["image"] == "tensorbits:0.1.0-cpu"
    assert {"cpu", "memory"} <= set(container["resources"]["requests"]), "the HPA measures CPU"
    assert _others("cpu") == _others(K8S_BASE), "only the Deployment differs"


def test_the_gpu_operator_variant_adds_its_runtime_class_and_node_label_only() -> None:
    base, variant = _deployment(K8S_BASE), _deployment("gpu-operator")
    pod = variant["spec"]["template"]["spec"]
    assert {key: pod[key] for key in GPU_OPERATOR_POD} == GPU_OPERATOR_POD
    for key in GPU_OPERATOR_POD:
        del pod[key]
    assert variant == base
    assert _others("gpu-operator") == _others(K8S_BASE)


@pytest.mark.parametrize("add_on", K8S_ADD_ONS)
def test_the_add_ons_hold_no_workload(add_on: str) -> None:
    """Applied beside a Deployment from the base or a variant: nothing of those again."""
    kinds = {d["kind"] for d in kustomize(add_on)}
    assert not kinds & set(WORKLOAD)


def test_the_images_differ_by_tag_alone() -> None:
    """One name, `tensorbits`, in every folder that runs the server: the name an operator's
    `images:` entry matches, whichever folder they apply."""
    images = {
        name: container["image"]
        for name in (K8S_BASE, *K8S_VARIANTS)
        for container in _pod(name)["containers"]
    }
    (isvc,) = [d for d in kustomize(K8S_KSERVE) if d["kind"] == "InferenceService"]
    images[K8S_KSERVE] = isvc["spec"]["predictor"]["containers"][0]["image"]
    assert {image.partition(":")[0] for image in images.values()} == {"tensorbits"}
    assert images == {
        K8S_BASE: "tensorbits:0.1.0-gpu",
        "cpu": "tensorbits:0.1.0-cpu",
        "gpu-operator": "tensorbits:0.1.0-gpu",
        "repository-poll": "tensorbits:0.1.0-cpu",
        K8S_KSERVE: "tensorbits:0.1.0-gpu",
    }


def test_the_repository_poll_variant_mounts_a_polled_repository_from_a_config_map() -> None:
    """The cpu variant, with Triton's layout mounted from one ConfigMap updated in place (no
    hash suffix: a change is polled, not rolled out), in poll mode; its model the example's."""
    pod = _pod("repository-poll")
    (container,) = pod["containers"]
    env = env_list(container)
    assert env["TENSORBITS_MODEL_CONTROL_MODE"] == "poll"
    assert float(env["TENSORBITS_REPOSITORY_POLL_SECS"]) > 0
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "models"]
    assert (mount["mountPath"], mount["readOnly"]) == (env["TENSORBITS_MODEL_REPOSITORY"], True)
    (volume,) = [v for v in pod["volumes"] if v["name"] == "models"]
    (config_map,) = [d for d in kustomize("repository-poll") if d["kind"] == "ConfigMap"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"] == "tensorbits-models"
    paths = {item["key"]: item["path"] for item in volume["configMap"]["items"]}
    assert paths == {"config.pbtxt": "masked/config.pbtxt", "model.onnx": "masked/1/model.onnx"}
    example = DOCKER.parent / "examples" / "models" / "masked"
    for key, path in paths.items():
        shipped = (K8S / "repository-poll" / key).read_bytes()
        assert shipped == (example / path.removeprefix("masked/")).read_bytes(), key
        assert config_map["data"][key].encode("latin-1") == shipped, key
    assert _others("repository-poll") == [config_map, *_others("cpu")]


def _applied_folders(text: str) -> list[str]:
    return re.findall(r"kubectl apply -k docker/k8s/([\w-]+)", text)


def test_the_readme_applies_each_kustomization_by_its_folder() -> None:
    """docker/README.md's commands apply exactly the folders above, with -k (a plain `apply -f`
    of docker/k8s/ would take the add-ons' CRDs and policies along)."""
    readme = (DOCKER / "README.md").read_text(encoding="utf-8")
    assert sorted(set(_applied_folders(readme))) == sorted(KUSTOMIZATIONS)
    assert "apply -f docker/k8s" not in readme
    assert all((K8S / name).is_dir() for name in _applied_folders(readme))


def test_the_comments_name_folders_that_exist() -> None:
    """The manifests' own `kubectl apply -k` lines, checked the same way."""
    for path in sorted(Path(K8S).rglob("*.yaml")):
        for name in _applied_folders(path.read_text(encoding="utf-8")):
            assert name in KUSTOMIZATIONS, f"{path.relative_to(K8S)}: docker/k8s/{name}"
