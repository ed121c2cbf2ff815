"""The gRPC front end: the Open Inference Protocol's ``GRPCInferenceService`` (Triton's, the
superset of KServe's) and the standard health service, on ``TENSORBITS_GRPC_PORT``.

``inference.proto``: the messages (``make proto`` generates ``inference_pb2``); ``wire``: the
tensors' bytes, handled without protobuf copies; ``messages``: ``ModelInferRequest`` to the
protocol-neutral ``InferRequest`` and a plan to ``ModelInferResponse``; ``pools``: the call
pools and which RPC takes a slot of which; ``status``: a refusal as a gRPC status; ``streams``:
the ModelStreamInfer stream; ``service``: the RPCs; ``server``: the grpcio server, its bounds and
its health service. Nothing here is imported unless gRPC serves (``TENSORBITS_GRPC_PORT`` not 0).
"""
