"""Write the graph models the documentation uses into ``examples/models/``, a model repository
in Triton's layout (``<name>/config.pbtxt`` and ``<name>/1/model.onnx``).

The files are committed beside this script; running it again writes the same bytes::

    python examples/build_models.py            # from the repository's root, with ``onnx``

Serve them at start with ``TENSORBITS_MODEL_REPOSITORY=examples/models``, or load one with the
repository API (its ``config.pbtxt`` as JSON, its ``1/model.onnx`` as ``file:1/model.onnx``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODELS = Path(__file__).resolve().parent / "models"
# An IR version and opset every ONNX Runtime of the last years reads (make_model's default IR
# version may be newer than the reader's).
IR_VERSION = 10
OPSET = 18

# masked: z = x AND k, x and z UINT8 rows of 4 (any number of rows), k the constant row
# [1, 3, 7, 15]: each column keeps its low 1, 2, 3 and 4 bits.
MASK = np.array([1, 3, 7, 15], np.uint8)
MASKED_CONFIG = """\
name: "masked"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_UINT8 dims: [ -1, 4 ] } ]
output [ { name: "z" data_type: TYPE_UINT8 dims: [ -1, 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def masked_model() -> bytes:
    """The ONNX file of ``masked``: one BitwiseAnd of the input x and the initializer k."""
    rows: list[str | int | None] = ["n", 4]
    graph = helper.make_graph(
        [helper.make_node("BitwiseAnd", ["x", "k"], ["z"], name="and")],
        "masked",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, rows)],
        [helper.make_tensor_value_info("z", TensorProto.UINT8, rows)],
        [numpy_helper.from_array(MASK, "k")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model, full_check=True)
    data: bytes = model.SerializeToString()
    return data


def repository() -> dict[str, bytes]:
    """Every file of the examples' repository, by its path under ``examples/models/``."""
    return {
        "masked/config.pbtxt": MASKED_CONFIG.encode(),
        "masked/1/model.onnx": masked_model(),
    }


def write(files: Mapping[str, bytes], root: Path) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else MODELS
    files = repository()
    write(files, root)
    for name, data in files.items():
        print(f"{root / name}  {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
