#!/usr/bin/env bash
# Everything a GPU session runs, in one command (docs/gpu.md).
#
#   bash scripts/gpu_session.sh prep   # here, with network (`make device-prep`): wheels into .whl/
#   bash scripts/gpu_session.sh        # on the offline GPU machine, .whl/ carried along: install,
#                                      # test, benchmark; logs under $OUT, a summary at the end
#
# The GPU machine has Python 3.12, CuPy for CUDA 13, NumPy, pytest, hypothesis, pytest-timeout and
# httpx, and no network: what the service needs beyond that (../shared/tools/device-prep) and what
# the GPU tests need (stock tritonclient's HTTP and gRPC clients and its CUDA shared-memory helper)
# travel as wheels. Every step runs whatever the one before did, under a time limit that keeps the
# whole inside one device call (10 minutes); the exit status is 0 only when every step passed.
# Steps, at most (s): install 60, environment 30, bench/cuda_shared_memory.py 120, bench/gpu_ops.py
# 120, tests/gpu 330, bench/shared_memory.py on a CuPy server 90; each is cut to what is left of
# BUDGET_S, so a slow early step takes time from the later ones, never past the budget.
set -uo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$SELF")/.."

# The GPU tests' wheels beyond the runtime's, at uv.lock's versions (tritonclient[http,grpc] and
# what its HTTP client imports; the device has aiohttp, certifi, packaging and ml-dtypes).
LOCKED_WHEELS="tritonclient python-rapidjson urllib3 geventhttpclient gevent greenlet zope-event
zope-interface brotli cuda-pathfinder"
# tritonclient.utils.cuda_shared_memory imports cuda.bindings, which the lock does not hold (its
# 'cuda' extra): the CUDA 13.0 build, as the machine's driver (580) serves CUDA 13.0. Used only
# where the machine has no cuda-bindings 13 of its own (its image's matches its CuPy).
CUDA_BINDINGS="cuda-bindings==13.0.3"
WHEELS=.whl
SITE=/tmp/site
BUDGET_S=530  # the whole run; one device call is at most 600 s

prep() {
    ../shared/tools/device-prep >/dev/null || return 1
    local pins
    pins=$(python3 - "$LOCKED_WHEELS" <<'PY'
import sys, tomllib
wanted = sys.argv[1].split()
locked = {p["name"]: p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"]}
missing = [name for name in wanted if name not in locked]
if missing:
    sys.exit(f"gpu_session.sh: not in uv.lock: {' '.join(missing)}")
print(" ".join(f"{name}=={locked[name]}" for name in wanted))
PY
) || return 1
    # shellcheck disable=SC2086  # one word per requirement
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d "$WHEELS" $pins "$CUDA_BINDINGS" || return 1
    # Two versions of one distribution stop the whole install on the machine.
    python3 - "$WHEELS" <<'PY' || return 1
import collections, pathlib, re, sys
names = collections.Counter(
    re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    for wheel in pathlib.Path(sys.argv[1]).glob("*.whl")
)
if twice := sorted(name for name, count in names.items() if count > 1):
    sys.exit(f"gpu_session.sh: more than one wheel of: {' '.join(twice)}")
PY
    local bytes
    bytes=$(du -cb "$WHEELS"/*.whl | tail -1 | cut -f1)
    echo "device-prep: $(ls "$WHEELS"/*.whl | wc -l) wheels, $((bytes / 1024 / 1024)) MiB in $WHEELS/" \
        "(the carry limit is 64 MiB for the whole working tree)"
    git check-ignore -q "$WHEELS/" || { echo "gpu_session.sh: $WHEELS/ is not git-ignored" >&2; return 1; }
    echo "device-prep: now call the device tool's run with carry [\"$WHEELS\"] and the command:"
    echo "    bash scripts/gpu_session.sh"
}

# --- on the GPU machine -------------------------------------------------------------------------

OUT=${OUT:-${TMPDIR:-/tmp}/tensorbits-gpu-session}
PYTHON=${PYTHON:-python3}
STARTED=$(date +%s)
SUMMARY=()
FAILED=0

# step NAME LIMIT_S LOG COMMAND...: run COMMAND with its output in $OUT/LOG, stopped after
# LIMIT_S seconds (or what is left of the budget); record how it ended; show the log's end.
step() {
    local name=$1 limit=$2 log=$3 left status started took verdict
    shift 3
    left=$((BUDGET_S - ($(date +%s) - STARTED)))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        SUMMARY+=("SKIPPED  $name: no time left")
        FAILED=1
        return
    fi
    echo "=== $name (at most ${limit}s) -> $log"
    started=$(date +%s)
    timeout -k 10 "$limit" "$@" >"$OUT/$log" 2>&1
    status=$?
    took=$(($(date +%s) - started))
    case $status in
        0) verdict=PASSED ;;
        124 | 137) verdict="TIMED OUT" ;;
        5) verdict="NO TESTS RAN" ;;
        *) verdict="FAILED (exit $status)" ;;
    esac
    [ "$status" -eq 0 ] || FAILED=1
    SUMMARY+=("$(printf '%-16s %-26s %4ss  %s' "$verdict" "$name" "$took" "$OUT/$log")")
    tail -n 25 "$OUT/$log"
}

install_wheels() {
    local wheels=()
    for wheel in "$WHEELS"/*.whl; do
        case $(basename "$wheel") in
            cuda_bindings-* | cuda_pathfinder-*)
                # The machine's own cuda-bindings 13 goes with its CuPy: keep it when there is one.
                if "$PYTHON" -c 'import sys, cuda.bindings as b, cuda.bindings.runtime
sys.exit(b.__version__.split(".")[0] != "13")' 2>/dev/null; then
                    echo "kept the machine's cuda-bindings; not installing $(basename "$wheel")"
                    continue
                fi ;;
        esac
        wheels+=("$wheel")
    done
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}"
}

environment() {
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    df -h /dev/shm  # system shared memory: bench/shared_memory.py's regions live there
    "$PYTHON" - <<'PY'
import importlib.metadata as metadata, platform
import cupy
print("python", platform.python_version(), "cupy", cupy.__version__,
      "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "driver", cupy.cuda.runtime.driverGetVersion(),
      "devices", cupy.cuda.runtime.getDeviceCount())
for name in ("numpy", "cuda-bindings", "cuda-pathfinder", "tritonclient", "grpcio", "protobuf",
             "fastapi", "pydantic", "uvicorn", "pytest", "hypothesis"):
    try:
        print(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name} missing")
import tritonclient.grpc, tritonclient.http, tritonclient.utils.cuda_shared_memory  # noqa
import tensorbits.cli  # noqa
print("imports: tritonclient.http, .grpc, .utils.cuda_shared_memory, tensorbits: ok")
PY
}

# bench/shared_memory.py against a CuPy server, or one 'skipped:' line where no CuPy backend
# starts here (as the other benchmarks say it), instead of a server that exits at start-up.
shared_memory_on_cupy() {
    local reason
    if ! reason=$("$PYTHON" -c 'from tensorbits.backends import select_backend
select_backend("cupy").backend.close()' 2>&1); then
        echo "skipped: no CuPy backend: ${reason##*$'\n'}"
        return 0
    fi
    "$PYTHON" bench/shared_memory.py --mib 64 --repeat 7 --no-triton \
        --server-env TENSORBITS_BACKEND=cupy
}

run() {
    mkdir -p "$OUT"
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "gpu_session.sh: no wheels in $WHEELS/: run 'make device-prep' first and carry $WHEELS" >&2
        exit 2
    fi
    export PYTHONPATH="$SITE:$PWD/service/src:$PWD/client/src${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1 TENSORBITS_BACKEND=cupy
    step "install wheels" 60 install.log bash "$SELF" install
    step "environment" 30 environment.log bash "$SELF" environment
    # The benchmarks before the tests: their figures are what the session is for, and they warm
    # the kernel cache (~/.cupy) for the tests: the issue's CUDA shared memory first, then the
    # operator core on CuPy (every operator x data type, 16/64/256 MiB; each row is printed as it
    # ends, so one stopped by its limit still leaves its rows).
    step "bench cuda_shared_memory" 120 bench-cuda-shared-memory.log \
        "$PYTHON" bench/cuda_shared_memory.py --rounds 7 --mib 256
    step "bench gpu_ops" 120 bench-gpu-ops.log "$PYTHON" bench/gpu_ops.py
    # Every GPU test, test_cuda_shared_memory.py first (file order); -v: the log names each test
    # as it ends, so a run stopped by the limit still says how far it got.
    step "tests/gpu" 330 gpu-tests.log \
        "$PYTHON" -m pytest -v -p no:cacheprovider --durations=15 tests/gpu
    # The HTTP paths on CuPy last, with what is left: SDK and tritonclient system shared memory
    # and v2 binary HTTP against a CuPy server, 64 MiB BIT_NOT.
    step "bench shm on cupy" 90 bench-shared-memory-cupy.log bash "$SELF" shared-memory-on-cupy
    {
        echo "=== summary ($(($(date +%s) - STARTED))s; logs in $OUT)"
        printf '%s\n' "${SUMMARY[@]}"
        grep -E '^(=+ .*(passed|failed|error|skipped).* =+)$' "$OUT/gpu-tests.log" 2>/dev/null
        grep -E '^(targets at|DIFFERENT RESULT|skipped:)' "$OUT/bench-gpu-ops.log" 2>/dev/null \
            | sed 's/^/bench gpu_ops: /'
    } | tee "$OUT/summary.txt"
    exit "$FAILED"
}

case ${1:-run} in
    prep) prep ;;
    run) run ;;
    install) install_wheels ;;  # steps of run, each in a process of its own (for timeout)
    environment) environment ;;
    shared-memory-on-cupy) shared_memory_on_cupy ;;
    *)
        echo "usage: bash scripts/gpu_session.sh [prep|run|install|environment|shared-memory-on-cupy]" >&2
        exit 2
        ;;
esac
