"""The checks `make image-test` (scripts/image_test.py) makes on a running image, run here on
made-up and local input: each must pass what is right and catch what is wrong. The images
themselves are built and started by `make images image-test`, not by `make test`; there, every
check is also shown failing once against a sabotaged CPU image (--self-check)."""

from __future__ import annotations

import copy
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from deploy.files import K8S, REPO, k8s_resource

sys.path.insert(0, str(REPO / "scripts"))
import image_test  # scripts/image_test.py
import images  # scripts/images.py

from tensorbits.core.backends import BackendUnavailable, select_backend


def test_writable_paths_are_the_deployments_emptydirs() -> None:
    deployment = k8s_resource("Deployment")
    assert image_test.declared_writable_paths(deployment) == ("/tmp", "/var/cache/cupy")
    # The read-only Secret mount is not a writable path, and a writable root is refused.
    writable = copy.deepcopy(deployment)
    (container,) = writable["spec"]["template"]["spec"]["containers"]
    container["securityContext"]["readOnlyRootFilesystem"] = False
    with pytest.raises(image_test.Failed, match="not read-only"):
        image_test.declared_writable_paths(writable)
    assert (K8S / "base" / "deployment.yaml") == image_test.DEPLOYMENT


@pytest.mark.parametrize(
    ("user", "uid", "problem"),
    [
        ("10001:10001", 10001, None),
        ("10001", 10001, None),
        ("10001:10001", 0, "runs as root"),
        ("10001:10001", 10002, "runs as uid 10002"),
        ("10001:10001", None, "not found"),
        ("0:0", 0, "USER is root"),
        ("tensorbits", 10001, "not numeric"),
        ("", 10001, "not numeric"),
    ],
)
def test_user_check(user: str, uid: int | None, problem: str | None) -> None:
    found = image_test.user_problem(user, uid)
    assert (found is None) if problem is None else (found is not None and problem in found)


def _entry(mtime: int = 1, size: int = 0) -> tuple[int, int, int]:
    return (0o100644, size, mtime)


BEFORE = {
    "/": _entry(),
    "/opt/venv/bin/tensorbits": _entry(),
    "/tmp": _entry(),
    "/run": _entry(),
    "/var/cache/cupy": _entry(),
}


@pytest.mark.parametrize(
    ("change", "outside"),
    [
        ({}, []),
        ({"/tmp/x": _entry()}, []),
        ({"/tmp": _entry(2)}, []),  # the mount point's own time
        ({"/var/cache/cupy/kernel.cubin": _entry()}, []),
        ({"/run": _entry(2)}, []),  # buildah's own mount point comes and goes there
        ({"/run/pid": _entry()}, ["/run/pid"]),
        ({"/opt/venv/bin/tensorbits": _entry(size=9)}, ["/opt/venv/bin/tensorbits"]),
        ({"/opt/new": _entry(), "/tmpfoo": _entry()}, ["/opt/new", "/tmpfoo"]),
        ({"/opt/venv/bin/tensorbits": None}, ["/opt/venv/bin/tensorbits"]),  # removed
    ],
)
def test_writes_outside_the_writable_paths(change: dict[str, Any], outside: list[str]) -> None:
    after = {**BEFORE, **change}
    after = {path: entry for path, entry in after.items() if entry is not None}
    assert image_test.writes_outside(BEFORE, after, ("/tmp", "/var/cache/cupy")) == outside


def test_snapshot_sees_a_real_write_and_skips_proc(tmp_path: Path) -> None:
    (tmp_path / "opt").mkdir()
    (tmp_path / "tmp").mkdir()
    (tmp_path / "proc").mkdir()
    (tmp_path / "opt" / "file").write_text("x")
    before = image_test.snapshot(tmp_path)
    assert {"/", "/opt", "/opt/file", "/tmp"} <= before.keys()
    assert "/proc" not in before
    (tmp_path / "tmp" / "scratch").write_text("ok")
    (tmp_path / "proc" / "ignored").write_text("ok")
    assert image_test.writes_outside(before, image_test.snapshot(tmp_path), ["/tmp"]) == []
    (tmp_path / "opt" / "file").write_text("changed")
    os.utime(tmp_path / "opt" / "file", ns=(1, 1))
    assert image_test.writes_outside(before, image_test.snapshot(tmp_path), ["/tmp"]) == [
        "/opt/file"
    ]


def test_dev_tools_are_found_by_module_or_distribution() -> None:
    clean = ["numpy", "numpy-2.4.6.dist-info", "uvicorn", "tensorbits", "httpx"]
    assert image_test.dev_tools_in(clean) == []
    dirty = [*clean, "_pytest", "pytest-9.0.dist-info", "mypy", "tritonclient-2.60.dist-info"]
    assert image_test.dev_tools_in(dirty) == ["_pytest", "mypy", "pytest", "tritonclient"]


def test_the_fallback_check_reads_the_servers_own_words(caplog: pytest.LogCaptureFixture) -> None:
    """Here, as in the GPU image without a device, `auto` falls back to NumPy and says why: the
    check accepts the line the server writes, and refuses a log without it."""
    with caplog.at_level(logging.INFO, logger="tensorbits.backend"):
        selection = select_backend("auto")
    selection.backend.close()
    if selection.backend.name != "numpy":
        pytest.skip("a CUDA device works here: auto does not fall back")
    assert image_test.fallback_problem(caplog.text) is None
    assert image_test.fallback_problem("backend selected: numpy on cpu (numpy backend requested)")


def test_the_cupy_refusal_check_reads_the_servers_own_words() -> None:
    try:
        select_backend("cupy").backend.close()
    except BackendUnavailable as exc:
        message = f"tensorbits: {exc}"
    else:
        pytest.skip("a CUDA device works here: cupy does not refuse")
    assert image_test.cupy_refusal_problem(2, message) is None
    assert image_test.cupy_refusal_problem(None, message) is not None  # kept running
    assert image_test.cupy_refusal_problem(0, message) is not None
    assert image_test.cupy_refusal_problem(1, "Traceback ... RuntimeError") is not None


@pytest.mark.parametrize(
    ("code", "log", "clean"),
    [
        (0, "Finished server process [7]", True),
        (1, "Finished server process [7]\nsubprocess exited on terminated", True),
        (1, "Finished server process [7]\nError: exit status 1", False),
        (0, "Shutting down", False),
        (137, "subprocess exited on killed", False),
    ],
)
def test_the_stop_check(code: int, log: str, clean: bool) -> None:
    assert (image_test.stop_problem(code, log) is None) is clean


def test_every_sabotage_names_a_failure_the_checks_raise() -> None:
    """--self-check matches each sabotage's failure by these words: each must be words a check
    above really says (user_problem, wait_ready, the health check, writes_outside)."""
    source = (REPO / "scripts" / "image_test.py").read_text()
    assert set(image_test.SABOTAGES) == {
        "root",
        "no-serve",
        "healthcheck",
        "write",
        "podman-writable",
        "podman-kill",
    }
    assert set(image_test.PODMAN_SABOTAGES) < set(image_test.SABOTAGES)
    for words in image_test.SABOTAGE_FAILURES.values():
        assert source.count(words) >= 2, f"{words!r}: no check says it"


# ---- the podman stage: the Deployment's container, read from the manifest -------------------------


def test_the_probes_are_read_as_the_kubelet_sends_them() -> None:
    """Startup first; each probe's port (a name, or a number for `grpc:`) as the port's name."""
    probes = image_test.declared_probes(k8s_resource("Deployment"))
    assert [(p.name, p.kind, p.port, p.target) for p in probes] == [
        ("startupProbe", "grpc", "grpc", ("inference.GRPCInferenceService",)),
        ("livenessProbe", "httpGet", "http", ("/v2/health/live",)),
        ("readinessProbe", "httpGet", "http", ("/v2/health/ready",)),
    ]
    assert probes[0].period_s * probes[0].failure_threshold == 120


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    """The Deployment's one container, itself (edits change the Deployment)."""
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_probes_of_every_kind_and_their_mistakes() -> None:
    deployment = copy.deepcopy(k8s_resource("Deployment"))
    container = _container(deployment)
    container["livenessProbe"] = {"exec": {"command": ["tensorbits-healthcheck"]}}
    container["readinessProbe"] = {"httpGet": {"path": "/metrics", "port": 8002}}
    probes = image_test.declared_probes(deployment)
    assert (probes[1].kind, probes[1].port, probes[1].target) == (
        "exec",
        "",
        ("tensorbits-healthcheck",),
    )
    assert (probes[2].port, probes[2].period_s, probes[2].failure_threshold) == ("metrics", 10, 3)
    for wrong in (
        {"httpGet": {"path": "/", "port": "nope"}},
        {"grpc": {"port": 9999}},
        {"tcpSocket": {"port": 8000}},
        {"httpGet": {"path": "/", "port": 8000, "scheme": "HTTPS"}},
    ):
        container["readinessProbe"] = wrong
        with pytest.raises(image_test.Failed):
            image_test.declared_probes(deployment)


def test_the_deployments_env_with_the_ports_moved() -> None:
    deployment = k8s_resource("Deployment")
    env = image_test.orchestrated_env(deployment, {"http": 1, "grpc": 2, "metrics": 3})
    assert (env["TENSORBITS_PORT"], env["TENSORBITS_GRPC_PORT"]) == ("1", "2")
    assert (env["TENSORBITS_METRICS_PORT"], env["TENSORBITS_HOST"]) == ("3", "127.0.0.1")
    assert "TENSORBITS_BACKEND" not in env  # the GPU image's: the CPU image keeps numpy
    declared = {e["name"]: e["value"] for e in _container(deployment)["env"]}
    for name in ("TENSORBITS_DRAIN_DELAY", "TENSORBITS_TIMEOUT_GRACEFUL_SHUTDOWN"):
        assert env[name] == declared[name]
    # The Secret's file is where the env says the keys are.
    mounts = image_test.secret_mounts(deployment)
    files = [f"{there}/{item}" for there, items in mounts.items() for item in items]
    assert files == [env["TENSORBITS_API_KEYS_FILE"]]
    from_ref = copy.deepcopy(deployment)
    _container(from_ref)["env"].append({"name": "X", "valueFrom": {"fieldRef": {}}})
    with pytest.raises(image_test.Failed, match="not a literal"):
        image_test.orchestrated_env(from_ref, {"http": 1, "grpc": 2, "metrics": 3})
    writable_secret = copy.deepcopy(deployment)
    for mount in _container(writable_secret)["volumeMounts"]:
        mount.pop("readOnly", None)
    with pytest.raises(image_test.Failed, match="mounted writable"):
        image_test.secret_mounts(writable_secret)


def test_podman_runs_the_deployments_container() -> None:
    deployment = k8s_resource("Deployment")
    grace = image_test.grace_period_s(deployment)
    assert (grace, image_test.pre_stop_command(deployment)) == (45, ["sleep", "10"])
    args = image_test.podman_run_args(
        "c",
        "localhost/tensorbits:x-cpu",
        "10001:10001",
        image_test.declared_writable_paths(deployment),
        {"TENSORBITS_PORT": "1"},
        {"/here": "/etc/tensorbits/api-keys"},
        grace,
        (1024, 4096),
    )
    assert args[0] == "run"
    assert args[-1] == "localhost/tensorbits:x-cpu"
    joined = " ".join(args)
    for part in (
        "--read-only=true",
        "--read-only-tmpfs=false",
        "--tmpfs /tmp --tmpfs /var/cache/cupy",
        "--user 10001:10001",
        "--cap-drop all",
        "--security-opt no-new-privileges",
        "--stop-timeout 45",
        "--network host",
        "--volume /here:/etc/tensorbits/api-keys:ro",
        "--env TENSORBITS_PORT=1",
        "--ulimit nofile=1024:4096",
    ):
        assert part in joined
    assert args.count("--tmpfs") == 2
    writable = image_test.podman_run_args("c", "i", "1:1", [], {}, {}, 1, (1, 1), read_only=False)
    assert "--read-only=false" in writable


DRAINED = (
    '{"message": "draining: not ready from now on; finishing the requests in flight"}\n'
    '{"message": "Finished server process [1]"}'
)


@pytest.mark.parametrize(
    ("code", "log", "elapsed", "problem"),
    [
        (0, DRAINED, 0.4, None),
        (0, DRAINED, 45.0, "not within the grace period"),
        (137, '{"message": "Finished server process [1]"}', 0.1, "no drain"),
        (137, DRAINED.splitlines()[0], 45.2, "grace period"),
        (0, DRAINED.splitlines()[0], 1.0, "clean shutdown"),
        (143, DRAINED, 1.0, "exit 143 after the shutdown"),
    ],
)
def test_the_podman_stop_check(code: int, log: str, elapsed: float, problem: str | None) -> None:
    found = image_test.podman_stop_problem(code, log, elapsed, 45)
    assert (found is None) if problem is None else (found is not None and problem in found)
    if problem is None:
        message = "draining: not ready from now on; finishing the requests in flight"
        assert image_test.drain_message(log) == message


def test_without_podman_the_stage_says_so_and_passes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # the module image_test looks in
    image_test.podman_check(image_test.Container(images.IMAGES[0]), tmp_path)
    assert capsys.readouterr().out == "image-test cpu: podman: not installed, skipped\n"


def test_the_image_table_matches_the_dockerfiles() -> None:
    """One image per CUDA list, the CPU image, and tags that say which."""
    assert [i.name for i in images.IMAGES] == ["cpu", "gpu-cuda12", "gpu-cuda13"]
    for image in images.IMAGES:
        assert image.dockerfile.is_file()
        assert image.ref.startswith(f"localhost/tensorbits:{images.VERSION}-{image.name}")
        assert image.gpu == ("CUDA_MAJOR" in image.build_args)
    assert (
        images.dockerfile_args(images.DOCKER / "Dockerfile.cpu").keys() == images.LOCAL_BASES.keys()
    )


def test_ci_builds_and_tests_the_images_after_the_suite() -> None:
    script = (REPO / ".ci" / "run").read_text()
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith("make ")]
    assert lines[-2:] == ["make test-all", "make images image-test"]  # every test, then images
    makefile = (REPO / "Makefile").read_text()
    assert "\nimages:" in makefile
    assert "\nimage-test:" in makefile
    assert "--self-check" in makefile, "make image-test shows its checks failing too"
