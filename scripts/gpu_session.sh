#!/usr/bin/env bash
# The GPU check, one mode a command (docs/gpu.md says what each runs and how to read it).
#
#   make gpu-check [MODE=quick|bench|full]  # a GPU machine with network: .venv with the gpu
#                                        # extra, then MODE (below) with its packages, no wheels
#   bash scripts/gpu_session.sh prep     # here, with network (`make device-prep`): wheels in .whl/
#   bash scripts/gpu_session.sh quick    # on the GPU machine, with .whl/ copied beside the clone:
#                                        # environment, preflight, tests (at most 300 s)
#   bash scripts/gpu_session.sh bench    # the benchmarks alone (at most 240 s)
#   bash scripts/gpu_session.sh [full]   # all of it (480 s)
#   bash scripts/gpu_session.sh dry-run  # anywhere, no GPU: the same steps on stand-ins (make test)
#   bash scripts/gpu_session.sh plan [MODE]  # the steps of MODE and their limits
#
# A GPU machine without network has Python 3.12, CuPy and NumPy of its own; everything else the
# service and the tests import comes as wheels at uv.lock's versions (scripts/gpu_wheels.py).
# The steps run in this order, each under a time limit cut to what is left of the mode's limit,
# each with its log under $OUT: install the wheels, print the environment, the preflight
# (scripts/gpu_preflight.py: the CuPy backend and CUDA IPC in about 30 s), the tests, then the
# benchmarks. A failed install, or a preflight that finds no working CuPy backend, stops the run
# there (nothing later could pass). The summary at the end counts a skipped test or a benchmark's
# `skipped:` as a failure; the exit status is 0 only when every step passed.
set -uo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$SELF")/.."

WHEELS=${SESSION_WHEELS:-.whl} # the carried wheels (another folder: the dry run's tests)
SITE=${SESSION_SITE:-/tmp/site} # where the wheels go (the dry run's own, passed to its steps)
PYTHON=${PYTHON:-python3}
OUT=${OUT:-${TMPDIR:-/tmp}/tensorbits-gpu-session}
# Machine-independent settings of every step: no plugin a machine happens to have installed is
# loaded by pytest or hypothesis (theirs may not work with the wheels' versions); the GPU tests
# fail instead of skipping without a device (tests/gpu/gpu_support.py).
export PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 HYPOTHESIS_NO_PLUGINS=1
PYTEST_PLUGINS=(-p pytest_timeout -p _hypothesis_pytestplugin -p no:cacheprovider)

# --- here: the wheels -------------------------------------------------------------------------

prep() {
    local prep_python=${PREP_PYTHON:-python3} requirements bytes
    WHEELS=.whl # always the repository's: it is emptied first
    local platforms=(--python-version 3.12 --implementation cp)
    for n in $(seq 39 -1 5); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
        --platform manylinux1_x86_64)
    mkdir -p .git/info
    grep -qx "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >>.git/info/exclude
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    requirements=$(mktemp)
    .venv/bin/python scripts/gpu_wheels.py requirements >"$requirements" || return 1
    # Each at the lock's version, checked against the lock's hashes.
    "$prep_python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --require-hashes "${platforms[@]}" -d "$WHEELS" -r "$requirements" \
        || return 1
    # tritonclient's CUDA helper imports cuda.bindings, which the lock holds only as an extra
    # (installed there only where the machine has no cuda-bindings 13 of its own).
    "$prep_python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: "${platforms[@]}" -d "$WHEELS" \
        "cuda-bindings==$(.venv/bin/python -c 'import sys; sys.path.insert(0, "scripts")
import gpu_wheels; print(gpu_wheels.CUDA_BINDINGS)')" || return 1
    rm -f "$requirements"
    .venv/bin/python scripts/gpu_wheels.py check "$WHEELS" || return 1
    bytes=$(du -cb "$WHEELS"/*.whl | tail -1 | cut -f1)
    echo "device-prep: $(ls "$WHEELS"/*.whl | wc -l) wheels, $((bytes / 1024 / 1024)) MiB in" \
        "$WHEELS/"
    git check-ignore -q "$WHEELS/" || { echo "gpu_session.sh: $WHEELS/ is not git-ignored" >&2; return 1; }
    echo "device-prep: then, on the GPU machine, in a copy of this clone with $WHEELS/ beside it:"
    echo "    bash scripts/gpu_session.sh quick"
}

# --- the steps --------------------------------------------------------------------------------

STARTED=$(date +%s)
SUMMARY=()
FAILED=0
STOPPED=""
PLAN_ONLY=0

# pytest_totals LOG: pytest's closing line of counts ("=== 3 passed, 1 skipped in 2.0s ===", or
# without the rules under -q; "12 tests collected in 0.5s" under --collect-only).
pytest_totals() {
    grep -E '^(=+ )?[0-9]+ [a-z]+( [a-z]+)?(, [0-9]+ [a-z]+)* in [0-9.]+s( \(.*\))?( =+)?$' "$1" 2>/dev/null
}

# verdict STATUS LOG: how a step ended. A benchmark's `skipped:` line, or skipped tests in
# pytest's summary, fail it: on the GPU machine a skip means the device part did not run.
verdict() {
    local status=$1 log=$2
    case $status in
        0)
            if grep -qE '^skipped:' "$log" 2>/dev/null || pytest_totals "$log" | grep -q ' skipped'; then
                echo "FAILED (skipped)"
            else
                echo PASSED
            fi
            ;;
        124 | 137) echo "TIMED OUT" ;;
        5) echo "NO TESTS RAN" ;;
        *) echo "FAILED (exit $status)" ;;
    esac
}

# step NAME LIMIT_S LOG COMMAND...: run COMMAND, its output in $OUT/LOG, stopped after LIMIT_S
# seconds or what is left of BUDGET_S; record how it ended; show the log's end. Sets STEP_STATUS.
step() {
    local name=$1 limit=$2 log=$3 left started took result
    shift 3
    STEP_STATUS=0
    if [ "$PLAN_ONLY" -eq 1 ]; then
        printf '%-26s at most %4ss  -> %s\n' "$name" "$limit" "$log"
        return
    fi
    if [ -n "$STOPPED" ]; then
        SUMMARY+=("$(printf '%-16s %-26s  %s' "NOT RUN" "$name" "$STOPPED")")
        FAILED=1
        return
    fi
    left=$((BUDGET_S - ($(date +%s) - STARTED)))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        SUMMARY+=("$(printf '%-16s %-26s  %s' "NOT RUN" "$name" "no time left of ${BUDGET_S}s")")
        FAILED=1
        return
    fi
    echo "=== $name (at most ${limit}s) -> $OUT/$log"
    started=$(date +%s)
    timeout -k 10 "$limit" "$@" >"$OUT/$log" 2>&1
    STEP_STATUS=$?
    took=$(($(date +%s) - started))
    result=$(verdict "$STEP_STATUS" "$OUT/$log")
    [ "$result" = PASSED ] || FAILED=1
    SUMMARY+=("$(printf '%-16s %-26s %4ss  %s' "$result" "$name" "$took" "$OUT/$log")")
    tail -n 20 "$OUT/$log"
}

install_wheels() {
    local wheels=() wheel
    if [ "${NO_WHEELS:-0}" = 1 ]; then
        # make gpu-check: the project's own environment (.venv with the gpu extra) has it all.
        echo "no wheels: $PYTHON's own packages ($("$PYTHON" -c 'import sys; print(sys.prefix)'))"
        return 0
    fi
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        if [ "${DRY:-0}" -eq 1 ]; then
            echo "no wheels in $WHEELS/ (make device-prep makes them): the running Python's packages"
            return 0
        fi
        echo "gpu_session.sh: no wheels in $WHEELS/: run 'make device-prep' first and copy $WHEELS/ here"
        return 2
    fi
    for wheel in "$WHEELS"/*.whl; do
        case $(basename "$wheel") in
            cuda_bindings-* | cuda_pathfinder-*)
                # The machine's own cuda-bindings 13 goes with its CuPy: keep it when there is one.
                if "$PYTHON" -c 'import sys, cuda.bindings as b, cuda.bindings.runtime
sys.exit(b.__version__.split(".")[0] != "13")' 2>/dev/null; then
                    echo "kept the machine's cuda-bindings; not installing $(basename "$wheel")"
                    continue
                fi
                ;;
        esac
        wheels+=("$wheel")
    done
    rm -rf "$SITE"
    "$PYTHON" --version
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
        --no-cache-dir --target "$SITE" "${wheels[@]}" || return 1
    echo "installed ${#wheels[@]} wheels into $SITE"
}

environment() {
    echo "kernel $(uname -r) $(uname -m)"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
    else
        echo "nvidia-smi: not found"
    fi
    df -h /dev/shm | tail -1 # system shared memory: bench/shared_memory.py's regions live there
    if [ "${DRY:-0}" -eq 0 ]; then
        "$PYTHON" - <<'PY' || true # printed even where CuPy is broken: the preflight judges
import cupy
r = cupy.cuda.runtime
print("cupy", cupy.__version__, "CUDA runtime", r.runtimeGetVersion(),
      "driver", r.driverGetVersion(), "devices", r.getDeviceCount())
PY
        "$PYTHON" scripts/gpu_wheels.py report --device
    else
        # No CuPy here: every import the check makes, with what the wheels would not bring
        # refused (nothing may be missing offline).
        "$PYTHON" scripts/gpu_wheels.py report --carried-only
    fi
}

# bench/shared_memory.py against a CuPy server, then a NumPy one, or one 'skipped:' line where no CuPy backend
# starts here (as the other benchmarks say it), instead of a server that exits at start-up.
shared_memory_on_cupy() {
    local reason
    if ! reason=$("$PYTHON" -c 'from tensorbits.core.backends import select_backend
select_backend("cupy").backend.close()' 2>&1); then
        echo "skipped: no CuPy backend: ${reason##*$'\n'}"
        return 0
    fi
    "$PYTHON" bench/shared_memory.py --mib 64 --repeat 7 --no-triton \
        --server-env TENSORBITS_BACKEND=cupy
    # The same requests on the NumPy backend, on the same machine: what the GPU changes for a
    # tensor that travels over HTTP.
    "$PYTHON" bench/shared_memory.py --mib 64 --repeat 7 --no-triton \
        --server-env TENSORBITS_BACKEND=numpy
}

steps_install() {
    step "install wheels" 45 install.log bash "$SELF" install
    [ "$STEP_STATUS" -eq 0 ] || STOPPED="the wheels did not install (install.log)"
    step "environment" 30 environment.log bash "$SELF" environment
}

steps_preflight() {
    local stand_in=()
    [ "$DRY" -eq 1 ] && stand_in=(--stand-in)
    step "preflight" 60 preflight.log "$PYTHON" scripts/gpu_preflight.py "${stand_in[@]}"
    [ "$STEP_STATUS" -eq 3 ] && STOPPED="no working CuPy backend (preflight.log)"
}

steps_tests() {
    if [ "$DRY" -eq 1 ]; then
        # Every GPU test module imports and collects, in GPU mode, on the stand-in.
        step "tests/gpu" 240 gpu-tests.log env TENSORBITS_GPU_REQUIRED=1 PYTHONPATH="$PWD/tests:${PYTHONPATH:-}" \
            "$PYTHON" -m pytest -q "${PYTEST_PLUGINS[@]}" -p gpu.stand_in.plugin --collect-only tests/gpu
        return
    fi
    # Every GPU test, test_cuda_shared_memory.py first (file order); -v: the log names each test
    # as it ends, so a run stopped by the limit still says how far it got.
    step "tests/gpu" 240 gpu-tests.log env TENSORBITS_GPU_REQUIRED=1 \
        "$PYTHON" -m pytest -v "${PYTEST_PLUGINS[@]}" --continue-on-collection-errors \
        --durations=15 tests/gpu
}

steps_benchmarks() {
    if [ "$DRY" -eq 1 ]; then
        step "bench cuda_shared_memory" 60 bench-cuda-shared-memory.log \
            "$PYTHON" bench/cuda_shared_memory.py --help
        step "bench gpu_ops" 90 bench-gpu-ops.log \
            "$PYTHON" bench/gpu_ops.py --xp numpy --quick --sizes 1 --repeat 1 --retries 0
        step "bench shm on cupy" 45 bench-shared-memory-cupy.log \
            "$PYTHON" bench/shared_memory.py --help
        return
    fi
    # The commands of docs/benchmarks.md: CUDA shared memory first, then the operator core on
    # CuPy (each row printed as it ends: one stopped by its limit still leaves its rows), then
    # the HTTP paths on a CuPy server.
    step "bench cuda_shared_memory" 60 bench-cuda-shared-memory.log \
        "$PYTHON" bench/cuda_shared_memory.py --rounds 7 --mib 256
    step "bench gpu_ops" 90 bench-gpu-ops.log "$PYTHON" bench/gpu_ops.py
    step "bench shm on cupy" 45 bench-shared-memory-cupy.log bash "$SELF" shared-memory-on-cupy
}

summary() {
    echo "=== summary: $MODE, $(($(date +%s) - STARTED))s of ${BUDGET_S}s; logs in $OUT"
    printf '%s\n' "${SUMMARY[@]}"
    grep -E '^preflight: ' "$OUT/preflight.log" 2>/dev/null
    pytest_totals "$OUT/gpu-tests.log" | sed 's/^/tests\/gpu: /'
    grep -E '^(targets at|DIFFERENT RESULT|skipped:)' "$OUT/bench-gpu-ops.log" 2>/dev/null \
        | sed 's/^/bench gpu_ops: /'
}

session() {
    MODE=$1
    DRY=0
    case $MODE in
        quick) BUDGET_S=300 ;;
        bench) BUDGET_S=240 ;;
        full) BUDGET_S=480 ;;
        dry-run) BUDGET_S=240 DRY=1 ;;
    esac
    export DRY
    if [ "$PLAN_ONLY" -eq 0 ]; then
        mkdir -p "$OUT"
        [ "$DRY" -eq 1 ] && SITE=${TMPDIR:-/tmp}/tensorbits-gpu-dry-run-site
        export SESSION_SITE=$SITE
        export PYTHONPATH="$SITE:$PWD/service/src:$PWD/client/src:$PWD/protocol/src${PYTHONPATH:+:$PYTHONPATH}"
        export TENSORBITS_BACKEND=cupy
        [ "$DRY" -eq 1 ] && export TENSORBITS_BACKEND=numpy
    else
        echo "$MODE: at most ${BUDGET_S}s in all"
    fi
    steps_install
    [ "$MODE" = bench ] || steps_preflight
    [ "$MODE" = bench ] || steps_tests
    [ "$MODE" = quick ] || steps_benchmarks
    [ "$PLAN_ONLY" -eq 1 ] && return 0
    summary | tee "$OUT/summary.txt"
    exit "$FAILED"
}

case ${1:-full} in
    prep) prep ;;
    quick | bench | full | dry-run) session "$1" ;;
    plan)
        PLAN_ONLY=1
        session "${2:-full}"
        ;;
    # The check's steps, each run in a process of its own (for timeout).
    install) install_wheels ;;
    environment) environment ;;
    shared-memory-on-cupy) shared_memory_on_cupy ;;
    verdict) verdict "$2" "$3" ;;
    *)
        echo "usage: bash scripts/gpu_session.sh [prep|quick|bench|full|dry-run|plan [MODE]]" >&2
        exit 2
        ;;
esac
