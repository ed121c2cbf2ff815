"""The model repository extension over real sockets, with the stock ``tritonclient.http``: unload
a model, see it not ready, UNAVAILABLE in the index and its inference refused with our words;
load it, and it is ready and infers again. A server of its own: the unload is that server's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from support.live import serve
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
AND = "onnx.BitwiseAnd-18"
UNLOADED = (
    f"model '{NOT}' is unloaded (state UNAVAILABLE): load it again with "
    f"POST /v2/repository/models/{NOT}/load"
)
DATA = np.array([[0, 1, 0x0F, 0xFF]], dtype=np.uint8)


@pytest.fixture(scope="module")
def client() -> Iterator[triton.InferenceServerClient]:
    with serve() as server:
        c = triton.InferenceServerClient(server.url, network_timeout=30)
        yield c
        c.close()


def _infer_not(client: triton.InferenceServerClient, *, binary: bool) -> Any:
    tensor = triton.InferInput("InputTensor", list(DATA.shape), "UINT8")
    tensor.set_data_from_numpy(DATA, binary_data=binary)
    output = triton.InferRequestedOutput("OutputTensor", binary_data=binary)
    return client.infer(NOT, [tensor], outputs=[output])


def _states(client: triton.InferenceServerClient) -> dict[str, tuple[str, str | None]]:
    index: list[dict[str, str]] = client.get_model_repository_index()
    return {entry["name"]: (entry["state"], entry.get("reason")) for entry in index}


def test_unload_then_load_as_a_triton_client_sees_it(
    client: triton.InferenceServerClient,
) -> None:
    assert client.is_model_ready(NOT)

    client.unload_model(NOT)
    assert not client.is_model_ready(NOT)
    assert not client.is_model_ready(NOT, "1")
    assert client.is_model_ready(AND)
    assert client.is_server_ready()
    states = _states(client)
    assert states[NOT] == ("UNAVAILABLE", "unloaded")
    assert {state for name, state in states.items() if name != NOT} == {("READY", None)}
    for binary in (False, True):
        with pytest.raises(InferenceServerException) as refused:
            _infer_not(client, binary=binary)
        assert refused.value.message() == UNLOADED
        assert refused.value.status() == "400"

    client.load_model(NOT)
    assert client.is_model_ready(NOT)
    assert {state for state, _ in _states(client).values()} == {"READY"}
    for binary in (False, True):
        result = _infer_not(client, binary=binary)
        np.testing.assert_array_equal(result.as_numpy("OutputTensor"), ~DATA)


def test_unknown_model_load_and_unload_are_errors(client: triton.InferenceServerClient) -> None:
    for action in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as refused:
            action("nope")
        assert refused.value.status() == "404"
        assert "unknown model or operator 'nope'" in str(refused.value.message())
