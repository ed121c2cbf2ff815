"""Generate the gRPC messages (``make proto``): service/src/tensorbits/grpc/inference_pb2.py and
its type stubs (.pyi) from inference.proto, and the model configuration's schema it imports
(core/graphs/model_config_pb2.py and .pyi from Triton's model_config.proto), with the grpcio-tools and mypy-protobuf of the lock,
so that the same lock gives the same bytes. ``--check`` writes nothing and exits 1 when the
committed files differ from what would be generated (tests/grpc/test_proto.py runs it)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOT = ROOT / "service" / "src"
PROTOS = (
    Path("tensorbits/core/graphs/model_config.proto"),
    Path("tensorbits/grpc/inference.proto"),
)
OUTPUTS = tuple(
    proto.with_name(f"{proto.stem}_pb2{suffix}") for proto in PROTOS for suffix in (".py", ".pyi")
)


def generate(into: Path) -> None:
    """Run protoc (grpc_tools) with mypy-protobuf's plugin, writing under ``into``."""
    bin_dir = Path(sys.executable).parent  # protoc-gen-mypy lives beside the interpreter
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{SOURCE_ROOT}",
            f"--python_out={into}", f"--mypy_out={into}",
            *(str(SOURCE_ROOT / proto) for proto in PROTOS),
        ],
        check=True, env=env, capture_output=True,  # mypy-protobuf announces each file it writes
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            str(out)
            for out in OUTPUTS
            if not (SOURCE_ROOT / out).exists()
            or (Path(tmp) / out).read_bytes() != (SOURCE_ROOT / out).read_bytes()
        ]
        if args.check:
            if stale:
                print(f"stale, run `make proto`: {', '.join(stale)}", file=sys.stderr)
                return 1
            return 0
        for out in OUTPUTS:
            shutil.copyfile(Path(tmp) / out, SOURCE_ROOT / out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
