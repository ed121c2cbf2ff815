"""The baselines the service is measured against: a bare FastAPI app that echoes the request body
and answers a ping, served by the same uvicorn settings as tensorbits (bench/http.py starts it)."""

from fastapi import FastAPI, Request, Response

app = FastAPI()


@app.post("/echo")
async def echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/octet-stream")


@app.get("/ping")
async def ping() -> Response:
    return Response(b"", media_type="text/plain")


@app.post("/ping")
async def ping_post(request: Request) -> Response:
    await request.body()
    return Response(b"", media_type="text/plain")
