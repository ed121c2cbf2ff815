"""Settings, from ``TENSORBITS_*`` environment variables, validated at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tensorbits import auth, tls

MiB = 1 << 20
GiB = 1 << 30


class Settings(BaseSettings):
    """Every knob of the server. Limits bound what any single request can make us allocate."""

    model_config = SettingsConfigDict(env_prefix="TENSORBITS_", extra="forbid", frozen=True)

    backend: Literal["auto", "numpy", "cupy"] = "auto"
    device_id: int = Field(0, ge=0)
    cpu_threads: int | None = Field(None, ge=1, description="NumPy worker threads (default: cores)")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    workers: int = Field(1, ge=1)
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    log_json: bool = True

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

    # Admission (503 + Retry-After past them): bounds memory under load.
    max_inflight_bytes: int = Field(2 * GiB, ge=MiB)
    max_inflight_requests: int = Field(64, ge=1)

    # Connections.
    timeout_keep_alive: int = Field(65, ge=1)
    timeout_header_read: float = Field(
        30.0, gt=0, description="seconds a client may take to send a request line and headers"
    )
    timeout_body_read: float = Field(
        60.0, gt=0, description="seconds a client may take to send a request body (408 past it)"
    )
    timeout_graceful_shutdown: int = Field(30, ge=1)

    # --- Access control and TLS (auth.py, tls.py; docs/reliability.md) -------------------------
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
            problem = auth.key_problem(key.get_secret_value())
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
            keys += auth.read_key_file(self.api_keys_file)
        self._accepted_api_keys = tuple(SecretStr(key) for key in dict.fromkeys(keys))
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        if self.tls_cert_file is not None and self.tls_key_file is not None:
            password = self.tls_key_password
            tls.check_certificate(
                self.tls_cert_file,
                self.tls_key_file,
                password.get_secret_value() if password is not None else None,
            )
        elif self.tls_key_password is not None:
            raise ValueError("tls_key_password is set but no tls_key_file is")
        return self

    @model_validator(mode="after")
    def _inflight_admits_one_body(self) -> Settings:
        if self.max_inflight_bytes < self.max_body_bytes:
            raise ValueError(
                "max_inflight_bytes must be at least max_body_bytes, or no maximal request "
                "could ever be admitted"
            )
        return self
