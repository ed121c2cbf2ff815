"""Coverage-guided fuzz target: a gRPC ``ModelInfer`` message, as the server receives it.

The input is the serialized ``ModelInferRequest`` itself (the corpus holds valid ones of every
kind: raw and typed contents, parameters, outputs, broadcast), mutated by libFuzzer, handed to
``InferenceService.model_infer`` in process (the gRPC service's own handler: the wire split, the
protobuf parse, the REST model's checks, planning, the plan cache, admission, the kernel), under
the small limits every fuzz target uses.

The property: the handler returns bytes that protobuf reads as a ``ModelInferResponse`` whose
raw output has exactly its tensor's size, or raises a ``TensorbitsError`` (which the service turns
into a gRPC status); nothing else, and the admission holds no request or byte afterwards.

By hand::

    .venv/bin/python tests/fuzz/target_grpc.py -max_total_time=600 tests/fuzz/corpus_grpc
"""

from __future__ import annotations

import asyncio
import atexit
import math

from harness import SMALL_LIMITS, fuzz, instrumented

with instrumented(__name__, "tensorbits", "tensorbits_protocol"):
    from tensorbits.config.settings import Settings
    from tensorbits.grpc import inference_pb2 as pb
    from tensorbits.grpc.service import InferenceService
    from tensorbits.runtime import Runtime
    from tensorbits_protocol.dtypes import BY_NAME, itemsize
    from tensorbits_protocol.errors import TensorbitsError

RUNTIME = Runtime.start(Settings(**SMALL_LIMITS, grpc_port=0))
SERVICE = InferenceService(RUNTIME)
LOOP = asyncio.new_event_loop()  # one for every input: a loop per call would cost more than it
atexit.register(LOOP.close)
atexit.register(RUNTIME.close)


def TestOneInput(data: bytes) -> None:  # noqa: N802 (the name atheris and libFuzzer use)
    if len(data) > RUNTIME.settings.max_body_bytes:  # grpcio refuses it before the handler
        return
    try:
        answer = LOOP.run_until_complete(SERVICE.model_infer(data))
    except TensorbitsError:
        answer = None
    admission = RUNTIME.plane.admission
    assert admission.requests_in_flight == 0
    assert admission.bytes_in_flight == 0
    if answer is None:
        return
    response = pb.ModelInferResponse.FromString(answer)
    (output,) = response.outputs
    (raw,) = response.raw_output_contents
    assert len(raw) == math.prod(output.shape) * itemsize(BY_NAME[output.datatype])


if __name__ == "__main__":
    fuzz(TestOneInput)
