"""Run inside a GPU image by scripts/image_test.py (`python -c`, as the image's user), on a
machine without a GPU: what the CuPy backend needs besides the device and its driver.

- CuPy imports, and NVRTC loads from the virtual environment (cuda-pathfinder finds the wheel);
- NVRTC compiles the service's own kernel bodies (tensorbits.core.backends.cupy_backend) for every
  integer type, against CuPy's headers and the CUDA runtime headers the wheel brings: NVRTC
  compiles on the CPU, so this needs no device;
- the kernel cache (CUPY_CACHE_DIR) is writable by this user.
"""

from __future__ import annotations

import os

import cupy
from cuda import pathfinder  # type: ignore[import-not-found]
from cupy.cuda import nvrtc

from tensorbits.core.backends.cupy_backend import POPCOUNT_BODY, SHIFT_BODY

TYPES = (
    "signed char",
    "unsigned char",
    "short",
    "unsigned short",
    "int",
    "unsigned int",
    "long long",
    "unsigned long long",
)


def kernels() -> list[str]:
    found = []
    for n, t in enumerate(TYPES):
        for left in ("true", "false"):
            found.append(
                f'extern "C" __global__ void shift_{left}_{n}(const {t}* xs, const {t}* ys, {t}* zs)'
                f" {{ typedef {t} T; const int i = threadIdx.x; T x = xs[i]; T y = ys[i]; T z;"
                f" {SHIFT_BODY.replace('LEFT', left)} zs[i] = z; }}"
            )
        found.append(
            f'extern "C" __global__ void popcount_{n}(const {t}* xs, unsigned char* zs)'
            f" {{ typedef {t} T; typedef unsigned char O; const int i = threadIdx.x;"
            f" T x = xs[i]; O z; {POPCOUNT_BODY} zs[i] = z; }}"
        )
    return found


def main() -> None:
    print("cupy", cupy.__version__, "nvrtc", ".".join(map(str, nvrtc.getVersion())))
    includes = [
        "-I" + os.path.join(os.path.dirname(cupy.__file__), "_core", "include"),
        "-I" + pathfinder.find_nvidia_header_directory("cudart"),
    ]
    source = "#include <cupy/carray.cuh>\n" + "\n".join(kernels())
    program = nvrtc.createProgram(source, "tensorbits.cu", [], [])
    try:
        nvrtc.compileProgram(program, ["-arch=compute_75", "--std=c++17", *includes])
    except Exception:
        print(nvrtc.getProgramLog(program)[-3000:])
        raise
    ptx = nvrtc.getPTX(program)
    print(f"nvrtc compiled {len(kernels())} kernels of the service: {len(ptx)} bytes of PTX")
    cache = os.environ["CUPY_CACHE_DIR"]
    probe = os.path.join(cache, "write-probe")
    with open(probe, "w") as handle:
        handle.write("x")
    os.remove(probe)
    print(f"kernel cache writable: {cache} as uid {os.getuid()}")


main()
