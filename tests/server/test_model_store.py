"""The model store (``model_store.py``): the repository extension's loads and unloads held for
every worker of a server. Two or three "workers" in one process, each a runtime of its own built
as a worker builds it (``Runtime.start`` with the workers' folder), on one folder: what one
loads or unloads through ``model_lifecycle`` (as both front ends do), the others serve."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from core.graph_models import chain_model, model_bytes, tensor
from onnx import TensorProto, helper
from support.inprocess import app_client, runtime_of
from support.v2 import NOT

from tensorbits import model_lifecycle, observability
from tensorbits.config.settings import Settings
from tensorbits.core.graphs.models import GraphModels
from tensorbits.core.models import ModelStates
from tensorbits.repository.store import (
    APPLIED,
    ENTRIES,
    FOLLOW_EVERY_S,
    GENERATION,
    MAX_KEY_CHARS,
    MODELS,
    entry_key,
    quote_name,
    unquote_key,
)
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import OperatorNotFound, PayloadTooLarge

CONFIG = json.dumps({"backend": "onnxruntime"})
MODEL_FILE = "file:1/model.onnx"


def xor_model() -> bytes:
    return model_bytes(
        [helper.make_node("BitwiseXor", ["a", "b"], ["c"])],
        [tensor("a", TensorProto.UINT32, [3]), tensor("b", TensorProto.UINT32, [3])],
        [tensor("c", TensorProto.UINT32, [3])],
    )


def or_model() -> bytes:
    return model_bytes(
        [helper.make_node("BitwiseOr", ["p", "q"], ["r"])],
        [tensor("p", TensorProto.UINT8, [2]), tensor("q", TensorProto.UINT8, [2])],
        [tensor("r", TensorProto.UINT8, [2])],
    )


def _settings(**overrides: Any) -> Settings:
    return Settings(**{"backend": "numpy", "cpu_threads": 1, "workers": 2, **overrides})


@contextmanager
def _workers(folder: Path, count: int = 2, **settings: Any) -> Iterator[list[Runtime]]:
    with ExitStack() as stack:
        runtimes = []
        for _ in range(count):
            runtime = Runtime.start(_settings(**settings), workers_folder=folder)
            stack.callback(runtime.close)
            runtimes.append(runtime)
        yield runtimes


@pytest.fixture
def anyio_backend() -> str:
    """A worker's event loop is asyncio's (uvicorn's): the store watches on it."""
    return "asyncio"


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[list[Runtime]]:
    """Two workers, each watching the store on the test's event loop, as each would on its own."""
    with _workers(tmp_path) as runtimes:
        yield runtimes


async def _load(runtime: Runtime, name: str, data: bytes | None = None) -> None:
    files: Mapping[str, bytes] = {} if data is None else {MODEL_FILE: data}
    config = None if data is None else CONFIG
    await model_lifecycle.load_model(runtime, name, config, files)


def _inputs(runtime: Runtime, name: str) -> list[str] | None:
    model = runtime.plane.graphs.get(name)
    return None if model is None else [value.name for value in model.inputs]


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / MODELS / ENTRIES).iterdir())


async def _within(seconds: float, done: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


@pytest.mark.anyio
async def test_a_load_in_one_worker_is_served_by_the_other_when_it_is_answered(
    pair: list[Runtime], tmp_path: Path
) -> None:
    a, b = pair
    await _load(a, "xor", xor_model())
    # No wait: the load answers once every worker serves the model.
    assert _inputs(b, "xor") == ["a", "b"]
    assert b.unavailable_because("xor") is None
    assert _inputs(a, "xor") == ["a", "b"]
    assert _entries(tmp_path) == ["xor@1"]
    entry = tmp_path / MODELS / ENTRIES / "xor@1"
    assert sorted(p.name for p in entry.iterdir()) == ["config", "file%3A1%2Fmodel.onnx", "name"]
    assert (entry / "config").read_text() == CONFIG


@pytest.mark.anyio
async def test_an_unload_holds_on_the_other_at_its_next_lookup(
    pair: list[Runtime], tmp_path: Path
) -> None:
    a, b = pair
    await _load(a, "xor", xor_model())
    model_lifecycle.unload_model(a, "xor")
    # At once, not after the other's watcher looked: its lookup follows the store.
    assert b.plane.graphs.get("xor") is None
    assert a.plane.graphs.get("xor") is None
    assert _entries(tmp_path) == []  # a graph model only the store brought: no entry left
    with pytest.raises(OperatorNotFound):
        model_lifecycle.unload_model(b, "xor")  # 404 on every worker now


@pytest.mark.anyio
async def test_a_builtin_unload_and_reload_hold_on_every_worker(
    pair: list[Runtime], tmp_path: Path
) -> None:
    a, b = pair
    model_lifecycle.unload_model(b, NOT)
    assert not a.plane.models.is_loaded(NOT)
    assert a.unavailable_because(NOT) == "unloaded"
    assert _entries(tmp_path) == [f"{NOT}@1.unloaded"]
    await _load(a, NOT)
    assert b.plane.models.is_loaded(NOT)
    assert b.unavailable_because(NOT) is None
    assert _entries(tmp_path) == []  # loaded again: no entry
    await _load(a, NOT)  # loaded already: nothing written, nothing waited for
    assert (tmp_path / MODELS / GENERATION).read_bytes() == (2).to_bytes(8, "little")


@pytest.mark.anyio
async def test_a_new_file_replaces_the_model_on_every_worker(
    pair: list[Runtime], tmp_path: Path
) -> None:
    a, b = pair
    await _load(a, "m", xor_model())
    await _load(b, "m", or_model())
    assert _inputs(a, "m") == _inputs(b, "m") == ["p", "q"]
    assert _entries(tmp_path) == ["m@2"]  # the current state, not a journal
    await _load(a, "m", xor_model())
    assert _inputs(a, "m") == _inputs(b, "m") == ["a", "b"]
    assert _entries(tmp_path) == ["m@3"]


@pytest.mark.anyio
async def test_a_worker_that_starts_late_applies_everything(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    for name in ("folder_one", "folder_two"):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.json").write_text(CONFIG)
        (repository / name / "1" / "model.onnx").write_bytes(xor_model())
    folder = tmp_path / "workers"
    folder.mkdir()
    settings: dict[str, Any] = {"model_repository": repository}
    with _workers(folder, **settings) as (a, b):
        await _load(a, "kept", xor_model())
        await _load(b, "replaced", xor_model())
        await _load(a, "replaced", or_model())
        await _load(a, "gone", xor_model())
        model_lifecycle.unload_model(b, "gone")
        model_lifecycle.unload_model(a, NOT)
        model_lifecycle.unload_model(b, "folder_one")  # the folder's: a tombstone
        assert _entries(folder) == [
            f"{NOT}@6.unloaded", "folder_one@7.unloaded", "kept@1", "replaced@3"
        ]  # fmt: skip
        with _workers(folder, 1, **settings) as (late,):
            for runtime in (a, b, late):
                assert _inputs(runtime, "kept") == ["a", "b"]
                assert _inputs(runtime, "replaced") == ["p", "q"]
                assert runtime.plane.graphs.get("gone") is None
                assert runtime.plane.graphs.get("folder_one") is None
                assert _inputs(runtime, "folder_two") == ["a", "b"]
                assert not runtime.plane.models.is_loaded(NOT)
            # Each runtime publishes what it applied; the late one applied it all before it
            # could serve.
            assert late.store is not None
            assert late.store.behind(7) == []


@pytest.mark.anyio
async def test_a_corrupt_entry_is_logged_and_skipped(
    pair: list[Runtime], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = pair
    store = tmp_path / MODELS / ENTRIES
    broken = store / "broken@1"
    broken.mkdir()
    (broken / "config").write_text(CONFIG)
    (broken / "file%3A1%2Fmodel.onnx").write_bytes(b"not an ONNX file")
    (store / "noconfig@1").mkdir()
    (store / "junk@x").write_text("")  # not <key>@<generation>
    (store / "#00@1.unloaded").write_text("")  # hashed, but its name file is missing
    with caplog.at_level(logging.WARNING, "tensorbits.repository"):
        (store.parent / GENERATION).write_bytes((1).to_bytes(8, "little"))  # as a writer counts
        assert await _within(5, lambda: b.store is not None and b.store.behind(1) == [])
        await _load(a, "xor", xor_model())  # the watchers go on
    assert _inputs(b, "xor") == ["a", "b"]
    assert b.plane.graphs.get("broken") is None
    assert b.plane.graphs.get("noconfig") is None
    messages = [record.getMessage() for record in caplog.records]
    assert any("'broken'" in m and "could not be loaded by this one" in m for m in messages)
    assert any("'noconfig'" in m and "no configuration" in m for m in messages)
    assert any("junk@x skipped" in m for m in messages)
    assert any("#00@1.unloaded skipped" in m for m in messages)


NAMES = ["a/b", "..", ".", "a@1", "%2F", "#x", "ü-模型", "\U0001f600" * 256, "é" * 200]


@pytest.mark.parametrize("name", NAMES)
def test_any_name_is_one_file_name_and_comes_back(name: str) -> None:
    key = entry_key(name)
    assert "/" not in key
    assert "@" not in key
    entry = f"{key}@18446744073709551615.unloaded"  # the longest an entry's file name gets
    assert len(entry.encode()) <= 255
    if key.startswith("#"):  # hashed: the name is too long quoted, and kept in the entry
        assert len(key) <= MAX_KEY_CHARS < len(quote_name(name))
    else:
        assert unquote_key(key) == name


@pytest.mark.parametrize("name", ["a@1", "%2F", "#x", "ü-模型", "\U0001f600" * 256, "é" * 200])
@pytest.mark.anyio
async def test_graph_models_of_any_name_reach_the_other_worker(
    pair: list[Runtime], tmp_path: Path, name: str
) -> None:
    a, b = pair
    await _load(a, name, xor_model())
    assert _inputs(b, name) == ["a", "b"]
    model_lifecycle.unload_model(b, name)
    assert a.plane.graphs.get(name) is None
    await _load(b, name, or_model())
    assert _inputs(a, name) == ["p", "q"]
    assert len(_entries(tmp_path)) == 1


@pytest.mark.anyio
async def test_a_dead_worker_is_not_waited_for_and_a_live_one_is_until_the_timeout(
    pair: list[Runtime], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, _ = pair
    assert a.store is not None
    folder = tmp_path / MODELS / APPLIED
    dead = folder / "999999.0"
    dead.write_bytes(bytes(8))  # no process holds its lock
    started = time.monotonic()
    await _load(a, "xor", xor_model())
    assert time.monotonic() - started < 5
    assert not dead.exists()  # removed by the worker that found it dead
    stuck = folder / "888888.0"
    stuck.write_bytes(bytes(8))
    fd = os.open(stuck, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # alive, and never applies anything
        assert a.store.behind(1) == ["888888.0"]
        with caplog.at_level(logging.WARNING, "tensorbits.repository"):
            await a.store.served_everywhere(1, timeout=0.1)
        assert "888888.0 have not applied generation 1" in caplog.text
    finally:
        os.close(fd)
    assert a.store.behind(1) == []


@pytest.mark.anyio
async def test_a_lookup_costs_a_read_of_the_generation_while_nothing_changes(
    pair: list[Runtime],
) -> None:
    a, b = pair
    assert b.store is not None
    calls = []
    scan = b.store._scan

    def counted() -> None:
        calls.append(1)
        scan()

    b.store._scan = counted  # type: ignore[method-assign]
    for _ in range(100):
        b.plane.graphs.get("xor")
        b.plane.models.check_loaded(NOT)
    await asyncio.sleep(3 * FOLLOW_EVERY_S)
    assert calls == []
    await _load(a, "xor", xor_model())
    b.plane.graphs.get("xor")
    assert calls  # the change was read (by the lookup or the watcher), once
    count = len(calls)
    for _ in range(100):
        b.plane.graphs.get("xor")
    assert len(calls) == count


@pytest.mark.anyio
async def test_one_worker_has_no_store_and_plain_lookups() -> None:
    runtime = Runtime.start(_settings(workers=1))
    try:
        assert runtime.store is None
        assert type(runtime.plane.graphs) is GraphModels
        assert type(runtime.plane.models) is ModelStates
        await _load(runtime, "xor", xor_model())
        model_lifecycle.unload_model(runtime, "xor")
    finally:
        runtime.close()


def test_a_store_is_joined_on_the_event_loop_that_watches_it(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="event loop"):
        Runtime.start(_settings(), workers_folder=tmp_path)


def test_the_apps_of_two_workers_share_their_loads(tmp_path: Path) -> None:
    """Through the HTTP app, as a worker serves it: a load on one app, inferences on the other."""
    with ExitStack() as stack:
        clients = []
        for _ in range(2):
            observability.share_with_workers(tmp_path)  # as workers.run_worker does
            try:
                clients.append(stack.enter_context(app_client(workers=2)))
            finally:
                observability.share_with_workers(None)
        one, other = clients
        import base64

        body = {
            "parameters": {
                "config": CONFIG,
                MODEL_FILE: base64.b64encode(chain_model(np.dtype(np.uint8))).decode(),
            }
        }
        assert one.post("/v2/repository/models/chain/load", json=body).status_code == 200
        x = np.array([1, 2, 0xF0, 0xFF], np.uint8)
        y = np.array([3, 3, 0x0F, 0x01], np.uint8)
        request = {
            "inputs": [
                {"name": n, "shape": [4], "datatype": "UINT8", "data": v.tolist()}
                for n, v in (("x", x), ("y", y))
            ]
        }
        reply = other.post("/v2/models/chain/infer", json=request)
        assert reply.status_code == 200, reply.text
        want = ~(((x ^ y).astype(np.uint8) << 3).astype(np.uint8))
        assert reply.json()["outputs"][0]["data"] == want.tolist()
        assert one.post("/v2/repository/models/chain/unload").status_code == 200
        assert other.post("/v2/models/chain/infer", json=request).status_code == 404
        assert runtime_of(other).store is not None


# Names that are, or begin as, the store's own files' names: each is an entry like any other.
STORE_NAMES = ["applied.x", "applied.1.0", "tmp.1.2", "lock", "generation", "entries", "applied"]


@pytest.mark.parametrize("name", STORE_NAMES)
@pytest.mark.anyio
async def test_a_name_like_the_stores_own_files_is_a_model_like_any_other(
    pair: list[Runtime], tmp_path: Path, name: str
) -> None:
    a, b = pair
    await _load(a, name, xor_model())
    assert _inputs(b, name) == ["a", "b"]
    assert a.store is not None
    assert b.store is not None
    assert len(a.store.behind(1)) == 0  # every worker, none of them the model's entry
    await _load(b, "after", or_model())  # the loads after it are answered as well
    assert _inputs(a, "after") == ["p", "q"]
    model_lifecycle.unload_model(a, name)
    assert b.plane.graphs.get(name) is None
    assert _entries(tmp_path) == ["after@2"]


def _served(runtime: Runtime) -> set[str]:
    return {model.name for model in runtime.plane.graphs.models()}


@pytest.mark.anyio
async def test_loads_racing_for_the_last_place_are_one_served_everywhere_one_refused(
    tmp_path: Path,
) -> None:
    with _workers(tmp_path, max_loaded_models=2) as (a, b):
        await _load(a, "first", xor_model())
        for attempt in range(5):
            names = (f"one{attempt}", f"two{attempt}")
            results = await asyncio.gather(
                _load(a, names[0], xor_model()),
                _load(b, names[1], or_model()),
                return_exceptions=True,
            )
            refused = [r for r in results if isinstance(r, BaseException)]
            assert len(refused) == 1, results
            assert isinstance(refused[0], PayloadTooLarge)
            assert (refused[0].field, refused[0].rule) == ("model_name", "max_loaded_models")
            assert "TENSORBITS_MAX_LOADED_MODELS" in refused[0].message
            assert await _within(5, lambda: _served(a) == _served(b))
            assert len(_served(a)) == 2, _served(a)
            winner = names[0] if results[0] is None else names[1]
            assert _served(a) == _served(b) == {"first", winner}
            model_lifecycle.unload_model(b, winner)
            assert _served(a) == _served(b) == {"first"}


@pytest.mark.anyio
async def test_a_place_is_counted_for_every_worker(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    (repository / "folder_one" / "1").mkdir(parents=True)
    (repository / "folder_one" / "config.json").write_text(CONFIG)
    (repository / "folder_one" / "1" / "model.onnx").write_bytes(xor_model())
    folder = tmp_path / "workers"
    folder.mkdir()
    settings: dict[str, Any] = {"model_repository": repository, "max_loaded_models": 2}
    with _workers(folder, **settings) as (a, b):
        await _load(a, "second", xor_model())
        with pytest.raises(PayloadTooLarge) as refused:
            await _load(b, "third", xor_model())
        assert refused.value.rule == "max_loaded_models"
        await _load(b, "second", or_model())  # replaced: no place of its own
        model_lifecycle.unload_model(a, "folder_one")  # the folder's, unloaded: its place freed
        await _load(b, "third", xor_model())
        assert _served(a) == _served(b) == {"second", "third"}
