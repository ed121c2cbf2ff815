"""Settings, from ``TENSORBITS_*`` environment variables, validated at start-up.

The Settings model is the one list of settings: ``tensorbits serve --help`` (``settings_help``),
the messages for invalid values (``settings_errors``) and the warning about unknown variables
(``unknown_variables``) are all read off it.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tensorbits.config.api_keys import key_problem, read_key_file
from tensorbits.config.certificates import check_certificate
from tensorbits.core.backends.pinned_pool import DEFAULT_POOL_BYTES as DEFAULT_PINNED_POOL_BYTES
from tensorbits.core.graphs.limits import GraphLimits
from tensorbits.core.limits import CoreLimits
from tensorbits_protocol.integers import shown

MiB = 1 << 20
GiB = 1 << 30

ENV_PREFIX = "TENSORBITS_"

# TENSORBITS_* variables that are not settings but are read elsewhere in the project (memory.py,
# the client, the image's health check, docker/compose.yaml, tests and bench scripts): set in the
# same shell as `serve`, they are no typo, so no warning.
OTHER_VARIABLES = frozenset(
    ENV_PREFIX + name
    for name in (
        "MALLOC_TUNING",
        "URL",
        "API_KEY",
        "HEALTHCHECK_URL",
        "HEALTHCHECK_TIMEOUT",
        "IMAGE",
        "TAG",
        "PUBLISH_ADDRESS",
        "PUBLISH_PORT",
        "CPU_PUBLISH_PORT",
        "GRPC_PUBLISH_PORT",
        "CPU_GRPC_PUBLISH_PORT",
        "API_KEYS_SECRET_FILE",
    )
)
# Variables of the tests, the fuzzers, the image scripts (scripts/images.py, image_test.py) and
# the GPU check (make gpu-check sets TENSORBITS_GPU_REQUIRED for the GPU tests and their servers).
OTHER_PREFIXES = (
    ENV_PREFIX + "PROBE_", ENV_PREFIX + "FUZZ_", ENV_PREFIX + "IMAGE_", ENV_PREFIX + "GPU_"
)  # fmt: skip


class Settings(BaseSettings):
    """Every knob of the server. Limits bound what any single request can make us allocate."""

    model_config = SettingsConfigDict(env_prefix="TENSORBITS_", extra="forbid", frozen=True)

    backend: Literal["auto", "numpy", "cupy"] = Field(
        "auto", description="auto: CuPy when a CUDA device works, else NumPy"
    )
    device_id: int = Field(0, ge=0, description="CUDA device of the cupy backend")
    placement: Literal["auto", "host", "device"] = Field(
        "auto",
        description="where a cupy server computes each request: auto (one operator on host "
        "data on the host, graphs and /v1 batches on the device), host, or device; data in "
        "CUDA shared memory always on the device",
    )
    cpu_threads: int | None = Field(None, ge=1, description="NumPy worker threads (default: cores)")
    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8000, ge=0, le=65535, description="port to bind (0: any free port)")
    grpc_port: int = Field(
        8001,
        ge=0,
        le=65535,
        description="port of the gRPC endpoint (the Open Inference Protocol's "
        "GRPCInferenceService and the gRPC health service), on TENSORBITS_HOST; 0: no gRPC",
    )
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="port of a listener serving GET /metrics alone, without an API key (for "
        "Prometheus; inference stays behind the keys), on TENSORBITS_HOST; 0: none",
    )
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="worker processes sharing the port (SO_REUSEPORT); each admits 1/N of the "
        "in-flight limits, so they hold for the whole server",
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        "info", description="least severe log record written"
    )
    log_json: bool | None = Field(
        None,
        description="JSON log lines (true), readable lines (false); unset: JSON unless stderr "
        "is a terminal",
    )

    # Request limits (413 past them; 431 for the request head).
    max_head_bytes: int = Field(
        64 * 1024,
        ge=1024,
        le=16 * MiB,
        description="request line and headers of one request (431 past it, 414 for the URL)",
    )
    max_body_bytes: int = Field(
        256 * MiB, ge=1024, description="request body, before and after decompression"
    )
    max_tensor_elements: int = Field(1 << 30, ge=1, description="elements of any one tensor")
    max_tensors: int = Field(64, ge=1, description="inputs + outputs of one v2 request")
    max_buffers: int = Field(256, ge=1, description="named buffers of one /v1 batch")
    max_dispatches: int = Field(4096, ge=1, description="dispatches of one /v1 batch")
    max_batch_header_bytes: int = Field(
        16 * MiB,
        ge=1024,
        description="JSON header of one /v1 batch (the largest the count limits allow fits)",
    )
    max_json_depth: int = Field(64, ge=2, description="nesting depth of a JSON document")
    max_json_elements: int = Field(1 << 22, ge=1, description="elements of JSON tensor data")
    header_cache_bytes: int = Field(
        4 * MiB,
        ge=0,
        description="bytes of planned request headers remembered, plans included, per API (0: none)",
    )

    # The shared-memory extensions (shared_memory.py; CUDA on CuPy only): off unless switched on.
    shared_memory: bool = Field(
        False,
        description="serve Triton's shared-memory extensions: clients on this host register "
        "POSIX shared-memory regions (and, on the CuPy backend, CUDA IPC handles of device "
        "memory) and pass tensors by reference",
    )
    shared_memory_prefix: str = Field(
        "/tensorbits",
        pattern=r"^/[^/]*$",
        max_length=200,
        description="the keys a region may be registered with start with this: a client cannot "
        "make the server open another program's memory",
    )
    max_shared_memory_regions: int = Field(
        64, ge=1, le=4096, description="regions registered at once (400 past it)"
    )
    max_shared_memory_bytes: int = Field(
        16 * 1024 * MiB,
        ge=1,
        description="bytes of all registered regions together (400 past it)",
    )

    # Graph models (ONNX files of the family's operators, and graphs in the /v1 binding model;
    # docs/graph-models.md).
    model_repository: Path | None = Field(
        None,
        description="folder of graph models loaded at start, in Triton's layout: "
        "<name>/config.pbtxt (or config.json) and <name>/1/model.onnx (or model.json) (none: no "
        "folder)",
    )
    model_control_mode: Literal["none", "poll", "explicit"] = Field(
        "explicit",
        description="Triton's model control: none (the repository loaded at start, the load and "
        "unload API refused), poll (loaded at start, then read again every "
        "repository_poll_secs: folders added, changed and removed followed; the API refused), "
        "explicit (loaded at start, the API loads and unloads)",
    )
    repository_poll_secs: float = Field(
        15.0,
        ge=0.1,
        le=86400,
        description="seconds between two reads of the model repository in poll mode (a model "
        "is taken once its folder is unchanged across two reads)",
    )
    max_model_bytes: int = Field(
        64 * MiB, ge=1024, description="bytes of one graph model's file (413 past it)"
    )
    max_graph_nodes: int = Field(
        1024, ge=1, le=1 << 20, description="nodes of one graph model (413 past it)"
    )
    max_loaded_models: int = Field(
        64, ge=0, le=4096, description="graph models loaded at once (413 past it)"
    )

    # Admission (503 + Retry-After past them): bounds memory under load.
    max_inflight_bytes: int = Field(
        2 * GiB, ge=MiB, description="bytes of the requests in flight (503 past it)"
    )
    max_inflight_requests: int = Field(64, ge=1, description="requests in flight (503 past it)")
    # Not a request's bytes: a fixed addition to the memory bound (backends/pinned_pool.py says
    # why), which the Kubernetes manifests size their memory limit by.
    pinned_pool_bytes: int = Field(
        DEFAULT_PINNED_POOL_BYTES,
        ge=0,
        description="pinned host memory the cupy backend stages host-to-device copies in, at "
        "most (a copy that does not fit is made from pageable memory, slower, never refused; "
        "0: none; split between workers)",
    )

    # Connections.
    timeout_keep_alive: int = Field(65, ge=1, description="seconds an idle connection is kept")
    timeout_header_read: float = Field(
        30.0, gt=0, description="seconds a client may take to send a request line and headers"
    )
    timeout_body_read: float = Field(
        60.0, gt=0, description="seconds a client may take to send a request body (408 past it)"
    )
    timeout_graceful_shutdown: int = Field(
        30,
        ge=1,
        description="seconds in-flight requests get to finish on SIGTERM, once the server has "
        "stopped accepting (after TENSORBITS_DRAIN_DELAY)",
    )
    drain_delay: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="seconds the server keeps accepting after SIGTERM, not ready meanwhile, so "
        "that load balancers stop routing to it first (0: none; in Kubernetes a preStop sleep "
        "does this)",
    )

    # --- Access control and TLS (api_keys.py, certificates.py; docs/reliability.md) -------------------------
    # Keys from both sources are accepted; none at all: no access control (nothing installed).
    # NoDecode: a comma-separated list in the environment, not pydantic-settings' JSON.
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        (), description="API keys accepted, comma-separated (none: every request is served)"
    )
    api_keys_file: Path | None = Field(
        None, description="file of API keys, one a line, blank lines and # comments ignored"
    )
    auth_open_paths: Annotated[tuple[str, ...], NoDecode] = Field(
        ("/v2/health/live", "/v2/health/ready"),
        description="paths served without a key (exact, comma-separated; add /metrics to open it)",
    )
    tls_cert_file: Path | None = Field(None, description="PEM certificate (chain): serve HTTPS")
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file")
    tls_key_password: SecretStr | None = Field(None, description="password of an encrypted key")
    _accepted_api_keys: tuple[SecretStr, ...] = PrivateAttr(())

    @field_validator(
        "api_keys_file", "tls_cert_file", "tls_key_file", "tls_key_password", mode="before"
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # VAR= (or Compose's ${VAR:-}) means "not set", not a file named "" (the working folder).
        return None if value == "" else value

    @field_validator("api_keys", "auth_open_paths", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("api_keys")
    @classmethod
    def _valid_keys(cls, keys: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for number, key in enumerate(keys, start=1):
            problem = key_problem(key.get_secret_value())
            if problem is not None:
                raise ValueError(f"API key number {number} {problem}")  # never the key itself
        return keys

    @field_validator("auth_open_paths")
    @classmethod
    def _absolute_paths(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            if not path.startswith("/"):
                raise ValueError(f"open path {path[:100]!r} does not begin with '/'")
        return paths

    @property
    def accepted_api_keys(self) -> tuple[SecretStr, ...]:
        """Every key accepted: ``api_keys`` and the file's, read once when the settings were
        built. Empty: access control is off."""
        return self._accepted_api_keys

    @model_validator(mode="after")
    def _read_keys_and_check_tls(self) -> Settings:
        keys = [key.get_secret_value() for key in self.api_keys]
        if self.api_keys_file is not None:
            keys += read_key_file(self.api_keys_file)
        self._accepted_api_keys = tuple(SecretStr(key) for key in dict.fromkeys(keys))
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        if self.tls_cert_file is not None and self.tls_key_file is not None:
            password = self.tls_key_password
            check_certificate(
                self.tls_cert_file,
                self.tls_key_file,
                password.get_secret_value() if password is not None else None,
            )
        elif self.tls_key_password is not None:
            raise ValueError("tls_key_password is set but no tls_key_file is")
        return self

    @model_validator(mode="after")
    def _polling_needs_a_repository(self) -> Settings:
        if self.model_control_mode == "poll" and self.model_repository is None:
            raise ValueError(
                "model_control_mode poll reads a model repository: set model_repository too"
            )
        return self

    @model_validator(mode="after")
    def _shared_memory_in_one_process(self) -> Settings:
        if self.shared_memory and self.workers > 1:
            raise ValueError(
                "shared_memory needs workers 1: a region is registered with the one process "
                "that answered the registration, and another worker would not know it"
            )
        return self

    @model_validator(mode="after")
    def _grpc_tls_needs_a_plain_key(self) -> Settings:
        if self.grpc_port and self.tls_key_password is not None:
            raise ValueError(
                "gRPC serves TLS only with an unencrypted key (grpcio takes the key as PEM "
                "bytes): give tls_key_file unencrypted without tls_key_password, or set "
                "grpc_port 0"
            )
        return self

    @model_validator(mode="after")
    def _ports_differ(self) -> Settings:
        if self.grpc_port != 0 and self.grpc_port == self.port:
            raise ValueError(
                f"grpc_port and port are both {self.port}: the gRPC and HTTP endpoints need "
                "ports of their own (grpc_port 0 switches gRPC off)"
            )
        if self.metrics_port != 0 and self.metrics_port in (self.port, self.grpc_port):
            raise ValueError(
                f"metrics_port {self.metrics_port} is also the HTTP or gRPC port: the metrics "
                "listener needs a port of its own (metrics_port 0 switches it off)"
            )
        return self

    @model_validator(mode="after")
    def _inflight_admits_one_body(self) -> Settings:
        if self.max_inflight_bytes < self.max_body_bytes:
            raise ValueError(
                "max_inflight_bytes must be at least max_body_bytes, or no maximal request "
                "could ever be admitted"
            )
        if self.workers > 1 and self.max_inflight_bytes // self.workers < self.max_body_bytes:
            raise ValueError(
                f"max_inflight_bytes / workers ({self.max_inflight_bytes} / {self.workers}) must "
                "be at least max_body_bytes: each worker admits its share of max_inflight_bytes, "
                "and a maximal request has to fit in one worker's share"
            )
        if self.max_inflight_requests < self.workers:
            raise ValueError(
                f"max_inflight_requests ({self.max_inflight_requests}) must be at least workers "
                f"({self.workers}): each worker admits its share of max_inflight_requests"
            )
        return self

    @property
    def worker_inflight_bytes(self) -> int:
        """What one worker process admits of ``max_inflight_bytes``: its 1/``workers`` share,
        so that the bound holds for the whole server."""
        return self.max_inflight_bytes // self.workers

    @property
    def worker_pinned_pool_bytes(self) -> int:
        """One worker's share of ``pinned_pool_bytes`` (each has its own CuPy and pool), never
        more than its share of ``max_inflight_bytes``: the pool stages the inputs of the requests
        in flight, so more could never be used (a server run with a small in-flight bound and
        the default pool gets a pool of that bound, not a refusal)."""
        return min(self.pinned_pool_bytes, self.max_inflight_bytes) // self.workers

    @property
    def worker_inflight_requests(self) -> int:
        """One worker's share of ``max_inflight_requests``."""
        return self.max_inflight_requests // self.workers

    @property
    def graph_limits(self) -> GraphLimits:
        """The bounds every graph model's file is read under, as values (core/graphs/limits.py):
        its constants' bytes are bounded by the file's own."""
        return GraphLimits(
            max_model_bytes=self.max_model_bytes,
            max_nodes=self.max_graph_nodes,
            max_initializer_bytes=self.max_model_bytes,
        )

    @property
    def core_limits(self) -> CoreLimits:
        """The limits the core holds every request to, as values (core/limits.py)."""
        # Each limit is the setting of its name.
        return CoreLimits(**{f.name: getattr(self, f.name) for f in fields(CoreLimits)})


def variable(field: str) -> str:
    """The environment variable of a Settings field."""
    return ENV_PREFIX + field.upper()


def _is_secret(field: str) -> bool:
    info = Settings.model_fields.get(field)
    return info is not None and "SecretStr" in repr(info.annotation)


def settings_help() -> str:
    """Every setting as ``serve --help`` lists it: variable, default, description."""
    lines = ["environment variables (a flag above overrides its variable):"]
    for name, info in Settings.model_fields.items():
        default = info.get_default(call_default_factory=True)
        if isinstance(default, tuple):  # written in the environment comma-separated
            shown = ",".join(str(item) for item in default) or "(none)"
        elif default is None:
            shown = "(none)"
        elif isinstance(default, bool):
            shown = str(default).lower()
        else:
            shown = str(default)
        lines.append(f"  {variable(name)}={shown}")
        if info.description:
            lines.append(f"      {info.description}")
    return "\n".join(lines)


_FIELD_NAMES = re.compile(
    r"\b(" + "|".join(sorted(Settings.model_fields, key=len, reverse=True)) + r")\b"
)


_SHOWN_CHARS = 80  # as a refused request's value is shown (descriptors.described)


def _given(value: object) -> str:
    """A setting's value in its error line, in bounded words: a string (the environment's) cut
    at 80 characters with its length, an integer past 40 digits by its length (``shown``)."""
    if isinstance(value, str):
        if len(value) <= _SHOWN_CHARS:
            return json.dumps(value)
        return f"{json.dumps(value[:_SHOWN_CHARS])}... (a string of {len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool):
        return shown(value)
    return repr(value)[:_SHOWN_CHARS]


def settings_errors(error: ValidationError) -> list[str]:
    """One line per invalid setting: the variable, the value given (never a secret's) and what
    pydantic says is allowed. Errors of the model as a whole (two settings that disagree) name
    the settings in their message."""
    lines = []
    for item in error.errors(include_url=False):
        message = item["msg"].removeprefix("Value error, ")
        if not item["loc"]:
            # A check of the model as a whole names the fields it compares: add their variables.
            named = dict.fromkeys(variable(m[0]) for m in _FIELD_NAMES.finditer(message))
            lines.append(f"{message} ({', '.join(named)})" if named else message)
            continue
        field = str(item["loc"][0])
        given = "(secret, not shown)" if _is_secret(field) else _given(item["input"])
        lines.append(f"{variable(field)}={given}: {message}")
    return lines


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``TENSORBITS_*`` variable that no setting reads (a typo, most often),
    with the closest setting's variable when one is close."""
    known = [variable(name) for name in Settings.model_fields]
    warnings = []
    for name in sorted(environ):
        upper = name.upper()  # pydantic-settings reads variables case-insensitively
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in OTHER_VARIABLES:
            continue
        if upper.startswith(OTHER_PREFIXES):
            continue
        # Compare the part after the prefix, or every name would look alike.
        close = difflib.get_close_matches(
            upper.removeprefix(ENV_PREFIX), [k.removeprefix(ENV_PREFIX) for k in known], n=1
        )
        hint = f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""
        warnings.append(f"tensorbits: warning: {name} is not a setting, ignored{hint}")
    return warnings
