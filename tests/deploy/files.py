"""Readers for the deployment files under docker/: Dockerfiles, .dockerignore, YAML manifests.

Small on purpose: just enough of each format to check what the images and manifests promise
(which base, which user, which start command, which files reach the build) from the files
themselves, so the checks follow the files instead of repeating them.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
K8S = DOCKER / "k8s"
DOCKERFILES = {"cpu": DOCKER / "Dockerfile.cpu", "gpu": DOCKER / "Dockerfile.gpu"}
COMPOSE_FILE = DOCKER / "compose.yaml"
COMPOSE_SCHEMA = DOCKER / "schema" / "compose-spec.json"
HEALTHCHECK_SCRIPT = DOCKER / "healthcheck.py"


def find_tool(name: str) -> str | None:
    """``name`` from the running virtual environment's bin/ first (where `uv sync` puts the dev
    tools), then from PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    return shutil.which(name)


# ---- Dockerfiles -------------------------------------------------------------------------------

_FLAG = re.compile(r"--([a-z-]+)(?:=(\S*))?")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    flags: dict[str, str]  # leading --name=value options (COPY --from, RUN --mount, ...)
    rest: str  # the arguments after the flags, continuation lines joined
    line: int  # 1-based line of the instruction's first line
    # Every value of each flag, in order: RUN takes several --mount (flags keeps the last).
    flag_values: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def exec_form(self) -> list[str]:
        """The JSON (exec) form of CMD/ENTRYPOINT/HEALTHCHECK CMD; ValueError if shell form."""
        text = self.rest
        if self.keyword == "HEALTHCHECK":
            keyword, _, text = text.partition(" ")
            if keyword.upper() != "CMD":
                raise ValueError(f"line {self.line}: HEALTHCHECK {keyword} has no command")
        text = text.strip()
        if not text.startswith("["):
            raise ValueError(f"line {self.line}: {self.keyword} is in shell form: {text!r}")
        value = json.loads(text)
        if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
            raise ValueError(f"line {self.line}: {self.keyword} is not a list of strings")
        return value

    def env_pairs(self) -> dict[str, str]:
        """ENV KEY=VALUE ... (the legacy ``ENV KEY VALUE`` form is refused)."""
        pairs: dict[str, str] = {}
        for token in shlex.split(self.rest):
            key, sep, value = token.partition("=")
            if not sep:
                raise ValueError(f"line {self.line}: ENV without '=': {token!r}")
            pairs[key] = value
        return pairs


@dataclass
class Stage:
    base: str  # the FROM image reference
    name: str | None  # the AS alias
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        """The environment this stage's ENV instructions set (no inheritance from the base)."""
        merged: dict[str, str] = {}
        for instruction in self.all("ENV"):
            merged.update(instruction.env_pairs())
        return merged


@dataclass
class Dockerfile:
    path: Path
    stages: list[Stage]
    global_args: list[Instruction]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def arg_defaults(self) -> dict[str, str]:
        """The global ``ARG NAME=default`` values (an ARG without a default is left out)."""
        defaults: dict[str, str] = {}
        for instruction in self.global_args:
            name, sep, value = instruction.rest.partition("=")
            if sep:
                defaults[name.strip()] = value.strip()
        return defaults

    def base_of(self, stage: Stage) -> tuple[str, str | None]:
        """The image ``stage`` builds FROM, a global ARG's default when the FROM names one, and
        the ARG's name (None when the FROM is a literal)."""
        match = re.fullmatch(r"\$\{?(\w+)\}?", stage.base)
        if match is None:
            return stage.base, None
        name = match.group(1)
        defaults = self.arg_defaults()
        if name not in defaults:
            raise ValueError(f"{self.path.name}: FROM {stage.base} without a global ARG default")
        return defaults[name], name

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"{self.path.name}: no stage named {name!r}")


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Instructions with their continuation lines joined, comments and blank lines dropped."""
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buffer):
            continue  # comments are dropped even inside a continuation, as Docker does
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1].strip())
            continue
        buffer.append(stripped)
        yield start, " ".join(part for part in buffer if part)
        buffer = []
    if buffer:
        raise ValueError(f"line {start}: the file ends inside a continued instruction")


def parse_dockerfile(path: Path) -> Dockerfile:
    stages: list[Stage] = []
    global_args: list[Instruction] = []
    for line, logical in _logical_lines(path.read_text(encoding="utf-8")):
        keyword, _, rest = logical.partition(" ")
        rest = rest.strip()
        flags: dict[str, str] = {}
        values: dict[str, tuple[str, ...]] = {}
        while (match := _FLAG.match(rest)) is not None:
            flags[match.group(1)] = match.group(2) or ""
            values[match.group(1)] = (*values.get(match.group(1), ()), match.group(2) or "")
            rest = rest[match.end() :].strip()
        instruction = Instruction(keyword.upper(), flags, rest, line, values)
        if instruction.keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            if len(words) not in (1, 3):
                raise ValueError(f"{path.name}:{line}: cannot read FROM {rest!r}")
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            if instruction.keyword != "ARG":
                raise ValueError(f"{path.name}:{line}: {keyword} before the first FROM")
            global_args.append(instruction)
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(path, stages, global_args)


@cache
def dockerfile(kind: str) -> Dockerfile:
    return parse_dockerfile(DOCKERFILES[kind])


def exposed_ports(kind: str) -> set[int]:
    """The ports the ``kind`` image's final stage EXPOSEs."""
    ports: set[int] = set()
    for instruction in dockerfile(kind).final.all("EXPOSE"):
        ports.update(int(word.split("/")[0]) for word in instruction.rest.split())
    return ports


def copy_sources_and_dest(instruction: Instruction) -> tuple[list[str], str]:
    """COPY's sources and destination (shell-like form; the JSON form is not used here)."""
    if instruction.rest.startswith("["):
        words = json.loads(instruction.rest)
    else:
        words = shlex.split(instruction.rest)
    if len(words) < 2:
        raise ValueError(f"line {instruction.line}: COPY needs a source and a destination")
    return words[:-1], words[-1]


# ---- .dockerignore -----------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker's matcher reads it: '*' and '?' stay inside one path
    element, '**' crosses any number of them."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            negate = body.startswith(("!", "^"))
            body = re.escape(body[1:] if negate else body).replace("\\-", "-")
            out.append(f"[{'^' if negate else ''}{body}]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


@dataclass(frozen=True)
class DockerIgnore:
    rules: tuple[tuple[bool, str, re.Pattern[str]], ...]  # (is_exception, pattern, regex)

    @classmethod
    def read(cls, path: Path) -> DockerIgnore:
        rules = []
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exception = line.startswith("!")
            pattern = line[1:].strip() if exception else line
            pattern = re.sub(r"/+", "/", pattern.strip("/")).removeprefix("./")
            rules.append((exception, pattern, _pattern_regex(pattern)))
        return cls(tuple(rules))

    def excluded(self, relative: str) -> bool:
        """Whether the file at ``relative`` (POSIX, from the context root) stays out of the
        context: the last rule that matches the path or one of its parent folders decides."""
        parts = relative.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        verdict = False
        for exception, _, regex in self.rules:
            if any(regex.match(prefix) for prefix in prefixes):
                verdict = not exception
        return verdict

    def may_reinclude_under(self, folder: str) -> bool:
        """Whether some exception rule could bring back a file below the excluded ``folder``
        (always assumed for exceptions with wildcards)."""
        return any(
            exception and (any(c in pattern for c in "*?[") or pattern.startswith(folder + "/"))
            for exception, pattern, _ in self.rules
        )


def context_files(root: Path = REPO) -> list[str]:
    """Every file a `docker build` of ``root`` sends, per ``root``/.dockerignore. Git's ignored
    folders (.venv/, caches) are walked too: the daemon knows nothing of .gitignore."""
    ignore = DockerIgnore.read(root / ".dockerignore")
    sent: list[str] = []
    for folder, subfolders, files in os.walk(root):
        here = Path(folder).relative_to(root).as_posix()
        prefix = "" if here == "." else here + "/"
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not ignore.excluded(prefix + name) or ignore.may_reinclude_under(prefix + name)
        )
        sent.extend(prefix + name for name in files if not ignore.excluded(prefix + name))
    return sorted(sent)


# ---- YAML manifests ----------------------------------------------------------------------------


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        documents = [doc for doc in yaml.safe_load_all(handle) if doc is not None]
    for doc in documents:
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: a document is not a mapping")
    return documents


# Every folder under docker/k8s/ is a kustomization (docker/README.md): the base, which applies
# on any cluster; the variants built on it (they replace it); the add-ons applied beside one of
# those; and KServe's alternative.
K8S_BASE = "base"
K8S_VARIANTS = ("cpu", "gpu-operator", "repository-poll")
K8S_ADD_ONS = ("prometheus-operator", "networkpolicy")
K8S_KSERVE = "kserve"
KUSTOMIZATIONS = (K8S_BASE, *K8S_VARIANTS, *K8S_ADD_ONS, K8S_KSERVE)
# The set the checks look each kind up in (k8s_resource): the base with every add-on, and KServe.
K8S_CHECKED = (K8S_BASE, *K8S_ADD_ONS, K8S_KSERVE)


@cache
def _kustomize_output(name: str) -> str:
    kubectl = find_tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: docker/k8s/ is rendered by `kubectl kustomize`")
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S / name)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize docker/k8s/{name}: {result.stderr.strip()}")
    return result.stdout


@cache
def _kustomized(name: str) -> tuple[dict[str, Any], ...]:
    documents = tuple(doc for doc in yaml.safe_load_all(_kustomize_output(name)) if doc)
    if not all(isinstance(doc, dict) for doc in documents):
        raise ValueError(f"docker/k8s/{name}: a rendered document is not a mapping")
    return documents


def kustomize(name: str) -> list[dict[str, Any]]:
    """The documents ``kubectl apply -k docker/k8s/<name>`` applies, as ``kubectl kustomize``
    renders them (a copy: the tests may change theirs). Skips the test where kubectl is absent."""
    return copy.deepcopy(list(_kustomized(name)))


def k8s_resources() -> list[tuple[str, dict[str, Any]]]:
    """(kustomization, document) for every document of ``K8S_CHECKED``, rendered."""
    return [(name, doc) for name in K8S_CHECKED for doc in kustomize(name)]


def k8s_resource(kind: str, kustomization: str | None = None) -> dict[str, Any]:
    """The one rendered resource of ``kind`` in ``K8S_CHECKED`` or in ``kustomization``."""
    documents = (
        [doc for _, doc in k8s_resources()] if kustomization is None else kustomize(kustomization)
    )
    found = [doc for doc in documents if doc.get("kind") == kind]
    if len(found) != 1:
        where = "docker/k8s/" + (kustomization or "{" + ",".join(K8S_CHECKED) + "}")
        raise LookupError(f"expected one {kind} rendered from {where}, found {len(found)}")
    return found[0]


def env_list(container: dict[str, Any]) -> dict[str, str]:
    """A Kubernetes container's literal env values by name."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def k8s_named(kind: str, name: str) -> dict[str, Any]:
    """The one rendered resource of ``kind`` named ``name`` in ``K8S_CHECKED`` (for kinds there
    are several of, such as Service)."""
    found = [
        doc
        for _, doc in k8s_resources()
        if doc.get("kind") == kind and doc.get("metadata", {}).get("name") == name
    ]
    if len(found) != 1:
        raise LookupError(
            f"expected one {kind} {name!r} rendered from docker/k8s/, found {len(found)}"
        )
    return found[0]
