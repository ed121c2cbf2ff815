"""tensorbits: the bitwise tensor-operator service (DirectML, OpenVINO, ONNX)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tensorbits")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = ["__version__"]
