"""``GET /metrics``: Prometheus text exposition of the server's metrics, tensorbits' own and
Triton's per-model ones (``observability.Metrics.exposition``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

router = APIRouter(tags=["operations"])


@router.get("/metrics", response_class=Response, summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    runtime = getattr(request.app.state, "runtime", None)
    return Response(request.app.state.metrics.exposition(runtime), media_type=CONTENT_TYPE_LATEST)
