# Entry points. Everything runs inside .venv/, created here by uv (itself bootstrapped into .tools/).
PYTHON ?= python3
UV_VERSION := 0.13.8
UV := .tools/bin/uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install install-serve serve test test-all check lint typecheck unit unit-all bench openapi proto clean images image-test wheelhouse gpu-check

$(UV):
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target .tools uv==$(UV_VERSION)

# One .venv/, two stamps. Serving needs the runtime only (the service, the client, the protocol
# they share and their dependencies: --no-dev), so a first `make serve` does not pay for mypy,
# schemathesis or tritonclient; that sync is --inexact so that it never uninstalls the dev tools
# a `make install` put there. `make install` syncs exactly (runtime and dev group) and marks both
# stamps: after it `make serve` syncs nothing, and after `make serve` it installs what is missing.
LOCK_INPUTS := pyproject.toml service/pyproject.toml client/pyproject.toml protocol/pyproject.toml \
	uv.lock
SYNC := UV_PYTHON_DOWNLOADS=never PYTHONPATH=.tools $(UV) sync --all-packages --locked --python $(PYTHON)

$(VENV)/.runtime: $(UV) $(LOCK_INPUTS)
	$(SYNC) --no-dev --inexact
	touch $@

$(VENV)/.installed: $(UV) $(LOCK_INPUTS)
	$(SYNC)
	touch $@ $(VENV)/.runtime

install: $(VENV)/.installed ## create .venv/ with the service, the client, the protocol and the dev tools

install-serve: $(VENV)/.runtime ## create .venv/ with the service, the client and the protocol only (what serve runs)

uv.lock: pyproject.toml service/pyproject.toml client/pyproject.toml protocol/pyproject.toml
	PYTHONPATH=.tools $(UV) lock

# --host/--port only when HOST=/PORT= are given on make's command line: otherwise the server
# reads TENSORBITS_HOST/TENSORBITS_PORT (default 127.0.0.1:8000) like every other setting. Only
# the command line counts (origin), not the environment: a shell's own HOST or PORT (zsh sets
# HOST to the machine's name) must not decide where the server listens.
serve_flag = $(if $(and $(filter command line,$(origin $(1))),$($(1))),$(2) $($(1)))

# GLIBC_TUNABLES: transparent huge pages for malloc's mappings, as the images set it (large request
# buffers fault in fewer pages; memory.py); a value of the caller's own wins.
serve: install-serve ## run the server (TENSORBITS_* settings; PORT=/HOST= override), NumPy backend unless TENSORBITS_BACKEND says otherwise
	TENSORBITS_BACKEND=$${TENSORBITS_BACKEND:-numpy} GLIBC_TUNABLES=$${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1} \
		$(BIN)/tensorbits serve $(call serve_flag,HOST,--host) $(call serve_flag,PORT,--port)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Then the GPU tests, the GPU benchmarks and the GPU check's scripts, which no CI machine runs:
# typed here so that a slip shows before a device does. They import the tests' helpers
# (support.*, core.*) from tests/, named relative to MYPYPATH (pyproject.toml: which are checked).
GPU_TYPED := tests/gpu bench/gpu_ops.py bench/cuda_shared_memory.py scripts/gpu_check.py

# With them, the whole of tests/ and bench/ (bench.harness is found from the repository root; some
# benchmarks import support.* from tests/ too). The folders the tests put on sys.path themselves go
# on MYPYPATH too: tests/fuzz (its targets import harness.py, beside them) and scripts/ (images,
# image_test, gpu_check).
# tests/client is checked in a call of its own, with its folder on MYPYPATH (its tests import
# fake_server): in one call with the rest, its conftest.py and tests/conftest.py would both be
# the module conftest. tests/grpc's files are named grpc.<file> here (grpc.conftest, ...): beside
# grpcio's own package, whose stubs `import grpc` still finds (no grpcio module is named like them).
typecheck: install
	$(BIN)/mypy
	MYPYPATH=tests:tests/fuzz:scripts $(BIN)/mypy --explicit-package-bases \
		--exclude '^tests/client/' tests bench examples $(filter-out tests/% bench/%,$(GPU_TYPED))
	MYPYPATH=tests/client:tests $(BIN)/mypy --explicit-package-bases tests/client

# Two lanes (tests/conftest.py marks them): the fast one, every test that needs no server process,
# child interpreter, browser, container or fuzzer (`-m "not live"`), spread over the cores by
# pytest-xdist (WORKERS=N to choose); and all of them, the live ones included, serially: those
# measure memory and latency and must not compete with each other or with other tests.
# PYTHONDONTWRITEBYTECODE cleared for the fast lane: pytest keeps the modules it rewrites (its
# assertions) in __pycache__/ only where bytecode may be written; otherwise every worker compiles
# every test module, the plugins and what they import again on every run (half its collection).
WORKERS ?= auto
unit: install
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -m "not live" -n $(WORKERS)

unit-all: install
	$(BIN)/pytest

check: lint typecheck

test: check unit ## lint, types and the fast lane: every test that starts no process (minutes)

test-all: check unit-all ## lint, types and every test, the live ones too, serially (what CI runs)

bench: install ## operator core on the CPU; bench/compare.py, bench/in_process.py, bench/client.py and bench/load.py measure the rest
	$(BIN)/python bench/ops.py

# The GPU check (scripts/gpu_check.py, docs/gpu.md): the preflight, tests/gpu in GPU mode (a skip
# fails), bench/gpu_ops.py --quick, one summary; summary.txt and the logs in RESULTS. With network:
# .venv with the gpu extra (the lock's CuPy). On an air-gapped host, WHEELHOUSE=folder (what `make
# wheelhouse` made on a connected machine): pip --no-index from it, with the host's Python,
# NumPy, CuPy and cuda-bindings. The wheelhouse's folder is named here only (git-ignored).
WHEELHOUSE_DIR := wheelhouse
WHEELHOUSE_PYTHON ?= 3.12
RESULTS ?= bench/results/gpu-check
GPU_CHECK = $(if $(WHEELHOUSE),$(PYTHON) scripts/gpu_check.py run --wheelhouse $(WHEELHOUSE),\
	$(BIN)/python scripts/gpu_check.py run --uv $(UV))
gpu-check: $(if $(WHEELHOUSE),,$(UV)) ## the GPU check on this host's NVIDIA GPU (WHEELHOUSE=folder on an air-gapped host; RESULTS=folder)
	$(if $(WHEELHOUSE),,$(SYNC) --all-extras)
	$(GPU_CHECK) --results $(RESULTS)

wheelhouse: $(UV) ## uv.lock's wheels for `make gpu-check WHEELHOUSE=` on an air-gapped GPU host (WHEELHOUSE_PYTHON=3.12), hash-checked, with their size
	$(PYTHON) scripts/gpu_check.py wheelhouse $(or $(WHEELHOUSE),$(WHEELHOUSE_DIR)) --uv $(UV) \
		--python-version $(WHEELHOUSE_PYTHON)

openapi: install ## regenerate openapi/openapi.json from the app
	$(BIN)/python scripts/export_openapi.py

proto: install ## regenerate the gRPC messages (grpc/inference_pb2.py/.pyi) and the ModelConfig schema they import (core/graphs/model_config_pb2.py/.pyi)
	$(BIN)/python scripts/generate_grpc.py

# Images, built and run without a Docker daemon: buildah (installed from Debian's packages when
# missing), official bases when a registry answers, else stand-ins made here (scripts/images.py;
# docker/README.md). A CA bundle reaches the builds as the secret `ca-bundle`, only when given:
# CA_BUNDLE=file, by default the one SSL_CERT_FILE names (a TLS-intercepting proxy's trust).
CA_BUNDLE ?= $(SSL_CERT_FILE)
IMAGES ?=
images_only = $(if $(IMAGES),--only $(IMAGES))

images: $(UV) ## build the CPU and GPU images (buildah; IMAGES="cpu gpu-cuda12 gpu-cuda13" to choose)
	$(PYTHON) scripts/images.py build $(images_only) $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))

image-test: install ## start the built images through buildah, the CPU one under podman too, and check them (see docker/README.md)
	$(BIN)/python scripts/image_test.py $(images_only) --self-check

clean:
	rm -rf $(VENV) .tools .mypy_cache .ruff_cache .pytest_cache .hypothesis
