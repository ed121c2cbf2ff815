"""The fuzz targets, bounded for CI.

``test_fuzz_bounded`` runs each target under atheris (libFuzzer) for a few seconds as a
subprocess, seeded from ``corpus_<target>/``; new inputs go to a temporary directory, never into
the checked-in corpus. ``TENSORBITS_FUZZ_SECONDS`` sets the time (default 15). Without atheris it
is skipped. ``test_targets_without_atheris`` calls each ``TestOneInput`` directly on the corpus,
mutations of it and random bytes, so the targets' logic runs even where atheris is missing.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).parent
TARGETS = (
    "framing",
    "descriptors",
    "http_head",
    "shared_memory",
    "grpc",
    "grpc_wire",
    "graph_reader",
    "binding_graph",
)
SECONDS = int(os.environ.get("TENSORBITS_FUZZ_SECONDS", "15"))
RANDOM_INPUTS = 300


def _load(target: str) -> ModuleType:
    """The target module, loaded from its file (tests/fuzz is no package)."""
    name = f"_tensorbits_fuzz_{target}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"target_{target}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _corpus(target: str) -> list[bytes]:
    files = sorted((HERE / f"corpus_{target}").iterdir())
    assert files, f"corpus_{target} is empty"
    return [f.read_bytes() for f in files]


def _mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randint(1, 8)):
        choice = rng.randrange(4)
        if choice == 0 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice == 1 and data:
            del data[rng.randrange(len(data)) :]
        elif choice == 2:
            data.insert(rng.randint(0, len(data)), rng.randrange(256))
        elif data:
            position = rng.randrange(len(data))
            data[position] = data[position] ^ (1 << rng.randrange(8))
    return bytes(data)


@pytest.mark.parametrize("target", TARGETS)
def test_targets_without_atheris(target: str) -> None:
    test_one_input = _load(target).TestOneInput
    rng = random.Random(f"tensorbits-fuzz-{target}")
    corpus = _corpus(target)
    inputs = [*corpus, b"", b"\x00", b"\x01", b"\xff" * 64]
    inputs += [rng.randbytes(rng.randrange(512)) for _ in range(RANDOM_INPUTS)]
    inputs += [_mutate(rng, rng.choice(corpus)) for _ in range(RANDOM_INPUTS)]
    for data in inputs:
        try:
            test_one_input(data)
        except BaseException as exc:
            pytest.fail(f"target_{target}: {type(exc).__name__}: {exc} on input {data!r}")


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_bounded(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is not installed (dev group)")
    new_inputs = tmp_path / "corpus"
    new_inputs.mkdir()
    command = [
        sys.executable,
        str(HERE / f"target_{target}.py"),
        f"-max_total_time={SECONDS}",
        "-rss_limit_mb=2048",
        "-timeout=10",
        f"-artifact_prefix={tmp_path}/",
        str(new_inputs),  # libFuzzer writes what it finds to the first directory
        str(HERE / f"corpus_{target}"),
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=SECONDS + 90, check=False
    )
    artifacts = [p.name for p in tmp_path.iterdir() if p.is_file()]
    assert result.returncode == 0, (
        f"target_{target} exited {result.returncode}; artifacts {artifacts} in {tmp_path}\n"
        f"{result.stderr[-6000:]}"
    )
    assert "Done" in result.stderr, result.stderr[-2000:]
