"""Placement on a CuPy server (``TENSORBITS_PLACEMENT``, backends/placement.py): the rule as a
table, and the backend that owns the NumPy and the device backend placing real work by it
through the unchanged request paths: one operator (the v2 HTTP front end), a graph model, a
/v1 batch, with its tensors in the body or in CUDA regions, under ``auto`` and ``host``
(``device`` is the device backend itself). The device is support/device_backend.py's stand-in,
which counts every host<->device copy: host work copies nothing to it, device-borne work is
never copied off it, and every answer is the NumPy backend's, byte for byte."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from core.test_graph_device_regions import (
    LIMITS,
    SLOT_BYTES,
    Device,
    all_in_regions,
    assert_same_bytes,
    body_tensor,
    on_host,
    pair_inputs,
    pair_model,
)
from pydantic import ValidationError
from support.device_backend import StandInDevice
from support.device_stand_in import HostDeviceMemory
from support.framing import HEADER, framed
from support.inprocess import app_client, runtime_of
from support.v1 import rich_batch, run_planned

from tensorbits.api import v1 as v1_front_end
from tensorbits.config.settings import Settings, settings_errors
from tensorbits.core.backends import Selection, _placed
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.backends.placement import (
    DEVICE_MIN_STEPS,
    OPERATOR_DEVICE_MIN_BYTES,
    Place,
    PlacedBackend,
    PlacementSetting,
    Residence,
    Work,
    WorkKind,
    choose,
)
from tensorbits.core.batch import BatchLimits, plan_rest
from tensorbits.core.graphs.request import plan_request, run_request
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits_protocol.infer import InferRequest

Arr = np.ndarray[Any, Any]
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
PREFIX = f"/tensorbits_placement_test_{os.getpid()}"
HOST, DEVICE = Place.HOST, Place.DEVICE
GIB = 1 << 30


def placed_backend(setting: PlacementSetting) -> tuple[PlacedBackend, StandInDevice]:
    device = StandInDevice()
    return PlacedBackend(NumpyBackend(1), device, setting), device


@pytest.fixture(params=["auto", "host"])
def placed(request: pytest.FixtureRequest) -> Iterator[tuple[PlacedBackend, StandInDevice]]:
    backend, device = placed_backend(request.param)
    yield backend, device
    backend.close()


# --- the rule -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "steps", "residence", "nbytes", "auto", "host", "device"),
    [
        # One operator on host-borne data: the host at any size (OPERATOR_DEVICE_MIN_BYTES).
        (WorkKind.OPERATOR, 1, Residence.BODY, 64, HOST, HOST, DEVICE),
        (WorkKind.OPERATOR, 1, Residence.BODY, 4 * GIB, HOST, HOST, DEVICE),
        (WorkKind.OPERATOR, 1, Residence.SYSTEM, 4 * GIB, HOST, HOST, DEVICE),
        # Device-borne data: the device, whatever the setting.
        (WorkKind.OPERATOR, 1, Residence.CUDA, 64, DEVICE, DEVICE, DEVICE),
        (WorkKind.GRAPH, 3, Residence.CUDA, 64, DEVICE, DEVICE, DEVICE),
        # Work whose intermediates stay on the device; one step is one operator.
        (WorkKind.GRAPH, 3, Residence.BODY, 64, DEVICE, HOST, DEVICE),
        (WorkKind.GRAPH, 1, Residence.SYSTEM, 64, HOST, HOST, DEVICE),
        (WorkKind.BATCH, 9, Residence.BODY, 64, DEVICE, HOST, DEVICE),
        (WorkKind.BATCH, 1, Residence.BODY, 64, HOST, HOST, DEVICE),
    ],
)
def test_the_rule(
    kind: WorkKind,
    steps: int,
    residence: Residence,
    nbytes: int,
    auto: Place,
    host: Place,
    device: Place,
) -> None:
    work = Work(kind, residence, nbytes, steps)
    assert (choose(work, "auto"), choose(work, "host"), choose(work, "device")) == (
        auto,
        host,
        device,
    )


def test_the_rules_numbers_are_the_measured_ones() -> None:
    assert OPERATOR_DEVICE_MIN_BYTES is None  # the host won at every size measured
    assert DEVICE_MIN_STEPS == 2


def test_the_setting_takes_three_values_and_names_them_when_refused() -> None:
    assert Settings().placement == "auto"
    assert Settings(placement="host").placement == "host"
    with pytest.raises(ValidationError) as refused:
        Settings(placement="gpu")  # the wrong value on purpose
    (line,) = settings_errors(refused.value)
    assert line.startswith('TENSORBITS_PLACEMENT="gpu": ')
    assert all(f"'{value}'" in line for value in ("auto", "host", "device")), line


def test_device_placement_is_the_device_backend_itself() -> None:
    device = StandInDevice()
    selection = _placed(Selection(device, "cupy: CUDA device works"), "device", 1)
    assert selection.backend is device
    assert selection.reason == "cupy: CUDA device works; placement device"
    placed = _placed(Selection(device, "cupy: CUDA device works"), "auto", 1).backend
    assert isinstance(placed, PlacedBackend)
    assert (placed.name, placed.host_memory, placed.device_memory) == (
        device.name,
        True,
        device.device_memory,
    )
    placed.close()


# --- one operator, through the v2 front end -------------------------------------------------------


def infer_not(client: Any, x: Arr) -> Arr:
    body = {
        "inputs": [
            {
                "name": "InputTensor",
                "datatype": "UINT32",
                "shape": list(x.shape),
                "data": x.tolist(),
            }
        ],
        "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}],
    }
    answer = client.post(f"/v2/models/{NOT}/infer", json=body)
    assert answer.status_code == 200, answer.text
    return np.frombuffer(answer.content[-x.nbytes :], np.uint32)


def test_an_operator_on_body_data_computes_on_the_host(
    placed: tuple[PlacedBackend, StandInDevice], caplog: pytest.LogCaptureFixture
) -> None:
    backend, device = placed
    x = np.random.default_rng(5).integers(0, 1 << 32, 1000, dtype=np.uint32)
    with app_client() as client, caplog.at_level(logging.DEBUG, "tensorbits.placement"):
        runtime_of(client).plane.backend = backend
        assert infer_not(client, x).tobytes() == (~x).tobytes()
    assert device.counts.host_crossings == 0
    assert dict(backend.placements) == {(WorkKind.OPERATOR, HOST): 1}
    (record,) = [r for r in caplog.records if r.name == "tensorbits.placement"]
    fields = record.__dict__
    assert (fields["placement"], fields["work"], fields["residence"]) == (
        "host",
        "operator",
        "body",
    )
    assert fields["bytes"] == 2 * x.nbytes


def test_the_metrics_count_each_placement_and_a_numpy_server_shows_none(
    placed: tuple[PlacedBackend, StandInDevice],
) -> None:
    backend, _ = placed
    x = np.arange(64, dtype=np.uint8)
    series = "tensorbits_placements_total"
    with app_client() as client:
        assert f"\n{series}{{" not in client.get("/metrics").text  # NumPy: nothing placed
        runtime_of(client).plane.backend = backend
        for _ in range(3):
            infer_not(client, x)
        text = client.get("/metrics").text
    assert f'{series}{{place="host",work="operator"}} 3.0' in text
    assert f'{series}{{place="device"' not in text


def test_an_operator_on_a_cuda_region_computes_on_the_device(
    placed: tuple[PlacedBackend, StandInDevice],
) -> None:
    """Input and output in a CUDA region, the host placement too: the device's kernel on the
    client's memory, nothing copied to or from the host."""
    backend, device = placed
    memory = device.device_memory
    assert isinstance(memory, HostDeviceMemory)
    regions = SharedMemoryRegions(PREFIX, 8, 1 << 20, memory, "the stand-in")
    handle, view = memory.export(8192)
    x = np.arange(1000, dtype=np.uint32)
    view[: x.nbytes] = x.view(np.uint8)
    try:
        with app_client(shared_memory=True, shared_memory_prefix=PREFIX) as client:
            runtime = runtime_of(client)
            runtime.plane.backend, runtime.plane.regions = backend, regions
            regions.register_cuda("gpu", handle, 0, 8192)
            shared = {"shared_memory_region": "gpu", "shared_memory_byte_size": x.nbytes}
            body = {
                "inputs": [
                    {"name": "InputTensor", "datatype": "UINT32", "shape": [1000],
                     "parameters": shared}
                ],
                "outputs": [
                    {"name": "OutputTensor",
                     "parameters": {**shared, "shared_memory_offset": 4096}}
                ],
            }  # fmt: skip
            answer = client.post(f"/v2/models/{NOT}/infer", json=body)
            assert answer.status_code == 200, answer.text
        assert view[4096 : 4096 + x.nbytes].view(np.uint32).tobytes() == (~x).tobytes()
        assert device.counts.host_crossings == 0
        assert dict(backend.placements) == {(WorkKind.OPERATOR, DEVICE): 1}
    finally:
        regions.close()
        memory.close_exports()


# --- graphs ---------------------------------------------------------------------------------------


def test_a_graph_on_body_data_goes_where_the_setting_says(
    placed: tuple[PlacedBackend, StandInDevice],
) -> None:
    """auto: the graph (3 steps) on the device, its two inputs copied there once and its two
    outputs back once; host: on the host, nothing copied."""
    backend, device = placed
    model, inputs = pair_model(), pair_inputs()
    want = on_host(model, inputs)
    request = InferRequest(tuple(body_tensor(n, a) for n, a in inputs.items()))
    got = run_request(plan_request(model, request, LIMITS), backend)
    assert_same_bytes(got, want)
    where = DEVICE if backend.setting == "auto" else HOST
    assert dict(backend.placements) == {(WorkKind.GRAPH, where): 1}
    crossings = (2, 2) if where is DEVICE else (0, 0)
    assert (device.counts.to_device, device.counts.to_host) == crossings


def test_a_graph_on_cuda_regions_stays_on_the_device(
    placed: tuple[PlacedBackend, StandInDevice],
) -> None:
    backend, device = placed
    memory = device.device_memory
    assert isinstance(memory, HostDeviceMemory)
    regions = SharedMemoryRegions(PREFIX, 8, 1 << 20, memory, "the stand-in")
    handle, view = memory.export(8 * SLOT_BYTES)
    regions.register_cuda("gpu", handle, 0, 8 * SLOT_BYTES)
    try:
        model, inputs = pair_model(), pair_inputs()
        want = on_host(model, inputs)
        on_regions = Device(device, regions, "gpu", view)
        got = all_in_regions(on_regions, model, inputs, want, backend)
        assert_same_bytes(got, want)
        assert device.counts.host_crossings == 0
        assert dict(backend.placements) == {(WorkKind.GRAPH, DEVICE): 1}
    finally:
        regions.close()
        memory.close_exports()


# --- /v1 batches ----------------------------------------------------------------------------------


def test_a_batch_goes_where_the_setting_says(placed: tuple[PlacedBackend, StandInDevice]) -> None:
    """The rich batch (nine dispatches): on the device under auto, its buffers copied there
    and its outputs back; on the host under host, nothing copied. One dispatch: the host."""
    backend, device = placed
    header, payload = rich_batch(np.random.default_rng(3))
    want = run_planned(header, payload, NumpyBackend(1))
    assert run_planned(header, payload, backend) == want
    where = DEVICE if backend.setting == "auto" else HOST
    assert dict(backend.placements) == {(WorkKind.BATCH, where): 1}
    assert (device.counts.host_crossings > 0) == (where is DEVICE)
    device.counts.reset()
    backend.placements.clear()
    header["dispatches"] = header["dispatches"][:1]
    assert run_planned(header, payload, backend) == run_planned(header, payload, NumpyBackend(1))
    assert dict(backend.placements) == {(WorkKind.BATCH, HOST): 1}
    assert device.counts.host_crossings == 0


def test_a_batch_placed_on_the_device_is_admitted_with_its_device_copies(
    placed: tuple[PlacedBackend, StandInDevice],
) -> None:
    """What the /v1 front end holds for a batch is what the backend its placement chooses
    needs: the data buffers again on the device under auto, the host's bytes under host."""
    backend, _ = placed
    header, payload = rich_batch(np.random.default_rng(5))
    body, headers = framed(header, payload, binary=True)
    settings = Settings(backend="numpy")
    plan = plan_rest(bytearray(body), int(headers[HEADER]), BatchLimits.of(settings.core_limits))
    held = v1_front_end._needs(plan, backend).held
    on_device = backend.setting == "auto"
    assert plan.data_bytes > 0
    assert held == plan.memory_needed(device_copies=on_device)
