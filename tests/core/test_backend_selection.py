"""Backend selection: ``numpy`` always works; ``auto`` falls back to NumPy and says why when CuPy
is missing or installed without a working device; ``cupy`` refuses loudly in both cases."""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from support.host_calls import compute
from support.stream_stand_in import stand_in_streams

from tensorbits.core.backends import BackendUnavailable, Selection, select_backend
from tensorbits.core.backends.numpy_backend import NumpyBackend


@pytest.fixture
def select() -> Iterator[Callable[..., Selection]]:
    """``select_backend``, each selection it made closed after the test (each NumPy backend owns
    a thread pool)."""
    made: list[Selection] = []

    def choose(name: Any, **options: Any) -> Selection:
        made.append(select_backend(name, **options))
        return made[-1]

    yield choose
    for selection in made:
        selection.backend.close()


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import cupy`` raises ImportError, as on a machine without CuPy."""
    monkeypatch.setitem(sys.modules, "cupy", None)


def _fake_cupy(get_device_count: Any) -> types.ModuleType:
    module = types.ModuleType("cupy")
    runtime = types.SimpleNamespace(getDeviceCount=get_device_count)
    module.cuda = types.SimpleNamespace(runtime=runtime)  # type: ignore[attr-defined]
    return module


@pytest.fixture
def cupy_without_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy "installed", but asking the driver for devices fails (no GPU, no driver)."""

    def fail() -> int:
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(fail))


@pytest.fixture
def cupy_with_zero_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(lambda: 0))


def _works(selection: Selection) -> None:
    x = np.array([[0, 128], [42, 255]], np.uint8)
    got = compute(selection.backend, "DML_OPERATOR_ELEMENT_WISE_BIT_NOT", {"InputTensor": x})
    assert got.tolist() == [[255, 127], [213, 0]]


def test_numpy_is_always_available(select: Callable[..., Selection], no_cupy: None) -> None:
    selection = select("numpy", cpu_threads=2)
    assert isinstance(selection.backend, NumpyBackend)
    assert selection.backend.name == "numpy"
    assert selection.backend.device == "cpu (2 threads)"
    assert selection.reason == "numpy backend requested"
    assert selection.backend.memory_in_use() is None
    _works(selection)


def test_auto_falls_back_when_cupy_is_absent(
    select: Callable[..., Selection], no_cupy: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="tensorbits.backend"):
        selection = select("auto")
    assert selection.backend.name == "numpy"
    assert selection.reason.startswith("auto: fell back to numpy (CuPy could not be imported:")
    assert "cupy" in selection.reason
    assert any("fell back to numpy" in r.getMessage() for r in caplog.records)
    _works(selection)


@pytest.mark.parametrize(
    ("fake_cupy", "options", "phrases"),
    [
        pytest.param(
            "cupy_without_device",
            {"cpu_threads": 1},
            [
                "fell back to numpy",
                "CuPy is installed but no CUDA device works",
                "cudaErrorNoDevice",
            ],
            id="no-device-works",
        ),
        pytest.param(
            "cupy_with_zero_devices",
            {"device_id": 0},
            ["CUDA device 0 not found (0 present)"],
            id="the-device-id-does-not-exist",
        ),
    ],
)
def test_auto_falls_back_to_numpy_without_a_usable_device(
    select: Callable[..., Selection],
    request: pytest.FixtureRequest,
    fake_cupy: str,
    options: dict[str, Any],
    phrases: list[str],
) -> None:
    request.getfixturevalue(fake_cupy)
    selection = select("auto", **options)
    assert selection.backend.name == "numpy"
    for phrase in phrases:
        assert phrase in selection.reason
    _works(selection)


def test_cupy_requested_without_cupy_raises(no_cupy: None) -> None:
    with pytest.raises(BackendUnavailable, match="CuPy could not be imported"):
        select_backend("cupy")


def test_cupy_requested_without_a_device_raises(cupy_without_device: None) -> None:
    with pytest.raises(BackendUnavailable) as info:
        select_backend("cupy")
    assert "CuPy is installed but no CUDA device works" in str(info.value)
    assert "cudaErrorNoDevice" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_cupy_requested_with_zero_devices_raises(cupy_with_zero_devices: None) -> None:
    with pytest.raises(BackendUnavailable, match=r"CUDA device 0 not found \(0 present\)"):
        select_backend("cupy")


def test_cupy_failing_with_any_exception_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken CUDA library can make CuPy raise anything, not only ImportError."""

    class Exploding(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            raise OSError("libcudart.so.12: cannot open shared object file")

    monkeypatch.setitem(sys.modules, "cupy", Exploding("cupy"))
    with pytest.raises(BackendUnavailable, match="libcudart"):
        select_backend("cupy")


# --- CuPy host transfers, without a GPU ----------------------------------------------------------
class _DeviceArray:
    """Stands in for cupy.ndarray.get with CuPy's own restrictions on ``out``
    (cupy/_core/core.pyx: same dtype, same shape, C- or F-contiguous)."""

    def __init__(self, host: np.ndarray[Any, Any]) -> None:
        self.host = host
        self.dtype = host.dtype
        self.shape = host.shape

    def get(self, out: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:
        if out is None:
            return self.host.copy()
        if out.dtype != self.dtype:
            raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
        if not (out.flags.c_contiguous or out.flags.f_contiguous):
            raise RuntimeError("`out` cannot be specified when copying to non-contiguous ndarray")
        out[...] = self.host
        return out


def _bare_cupy_backend() -> Any:
    from tensorbits.core.backends.cupy_backend import CupyBackend

    backend = object.__new__(CupyBackend)  # no device: only the host-transfer methods are used
    cupy: Any = types.SimpleNamespace(asarray=lambda host: _DeviceArray(np.array(host)))
    backend._cupy = cupy  # a stand-in for the module: asarray alone
    backend._device = contextlib.nullcontext()  # cupy.cuda.Device, entered around transfers
    backend.streams = stand_in_streams()  # each thread's stream, stood in for
    return backend


def test_cupy_to_host_into_strided_and_big_endian_out() -> None:
    backend = _bare_cupy_backend()
    device = _DeviceArray(np.arange(12, dtype=np.int32).reshape(3, 4))
    backing = np.zeros((3, 8), np.int32)
    got = backend.to_host(device, backing[:, ::2])
    assert np.shares_memory(got, backing)
    assert backing[:, ::2].tolist() == device.host.tolist()
    assert not backing[:, 1::2].any()
    big_endian = np.zeros((3, 4), np.dtype(">i4"))
    assert backend.to_host(device, big_endian) is big_endian
    assert big_endian.tolist() == device.host.tolist()
    plain = np.zeros((3, 4), np.int32)
    assert backend.to_host(device, plain) is plain
    assert backend.to_host(device).tolist() == device.host.tolist()


def test_cupy_asarray_makes_big_endian_input_native() -> None:
    backend = _bare_cupy_backend()
    host = np.array([1.0, -0.0], np.dtype(">f4"))
    device = backend.asarray(host)
    assert device.dtype == np.dtype("<f4")
    assert device.dtype.isnative
    assert device.host.view(np.uint32).tolist() == [0x3F800000, 0x80000000]
