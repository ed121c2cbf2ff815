"""The floor of a grpcio asyncio server in Python: the gRPC analogue of the bare FastAPI ping.

A ``grpc.aio`` server (on uvloop, as ``tensorbits serve`` runs) whose ``ModelInfer`` does no
work: the answer to a request it has seen is a cached serialized ``ModelInferResponse`` (the
first answer to each distinct request is computed once, NumPy BIT_NOT on the raw input, so the
load generator's check passes), and ``ModelStatistics`` reports the successes counted. Its
handlers take and give bytes (no protobuf work per call). ``--stream-unary`` registers
``ModelInfer`` as a stream-unary handler reading its one message from the request iterator, as
``tensorbits.grpc.server`` does (to bound the wait for the message); the default is unary-unary.
Whatever a call costs here, every grpcio servicer in Python pays at least that.

    .venv/bin/python bench/_grpc_baseline.py PORT [--stream-unary]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

SERVICE = "inference.GRPCInferenceService"
CACHED = 16  # distinct requests remembered: a benchmark sends one or two


class Canned:
    """Answers by request bytes, and the count of calls answered."""

    def __init__(self) -> None:
        self.answers: dict[bytes, bytes] = {}
        self.served = 0

    def answer(self, data: bytes) -> bytes:
        self.served += 1
        found = self.answers.get(data)
        if found is None:
            found = self._compute(data)
            if len(self.answers) < CACHED:
                self.answers[data] = found
        return found

    @staticmethod
    def _compute(data: bytes) -> bytes:
        request = service_pb2.ModelInferRequest.FromString(data)
        response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=False):
            out = response.outputs.add(name="OutputTensor", datatype=tensor.datatype)
            out.shape.extend(tensor.shape)
            response.raw_output_contents.append(
                np.bitwise_not(np.frombuffer(raw, np.uint8)).tobytes()
            )
        data_out: bytes = response.SerializeToString()
        return data_out


def handlers(canned: Canned, stream_unary: bool) -> grpc.GenericRpcHandler:
    async def infer(data: bytes, context: Any) -> bytes:
        return canned.answer(data)

    async def infer_stream(requests: AsyncIterator[bytes], context: Any) -> bytes:
        return canned.answer(await anext(requests))

    async def statistics(request: service_pb2.ModelStatisticsRequest, context: Any) -> Any:
        stats = service_pb2.ModelStatisticsResponse()
        model = stats.model_stats.add(name=request.name, version="1")
        model.inference_stats.success.count = canned.served
        return stats

    infer_handler: grpc.RpcMethodHandler[Any, Any] = (
        grpc.stream_unary_rpc_method_handler(infer_stream)
        if stream_unary
        else grpc.unary_unary_rpc_method_handler(infer)
    )
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ModelInfer": infer_handler,
            "ModelStatistics": grpc.unary_unary_rpc_method_handler(
                statistics,
                request_deserializer=service_pb2.ModelStatisticsRequest.FromString,
                response_serializer=service_pb2.ModelStatisticsResponse.SerializeToString,
            ),
        },
    )


async def serve(port: int, stream_unary: bool) -> None:
    limit = 2**31 - 1
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ]
    )
    server.add_generic_rpc_handlers((handlers(Canned(), stream_unary),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:  # runs until killed (SIGTERM)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--stream-unary", action="store_true")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:  # the asyncio loop then; tensorbits serve needs uvloop, so it is there
        asyncio.run(serve(args.port, args.stream_unary))
    else:
        uvloop.run(serve(args.port, args.stream_unary))


if __name__ == "__main__":
    main()
