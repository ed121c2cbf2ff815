"""What the hardened HTTP protocol costs per request, in process (no sockets, no app).

Feeds one small keep-alive POST (the size of bench/http_service.py (b)'s request) to uvicorn's
own ``HttpToolsProtocol`` and to ``GuardedHttpProtocol`` (head bounded in bytes and time, JSON
refusals in order), alternately, and prints the microseconds each spends parsing it and building
its request cycle; the app is never run. Usage::

    .venv/bin/python bench/http_protocol.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from tensorbits.config import Settings
from tensorbits.guarded_protocol import guarded_protocol

REQUEST = (
    b"POST /v2/models/DML_OPERATOR_ELEMENT_WISE_BIT_NOT/infer HTTP/1.1\r\n"
    b"Host: 127.0.0.1:8000\r\nUser-Agent: wrk\r\nAccept: */*\r\n"
    b"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: 120\r\n"
    b"Content-Length: 136\r\n\r\n" + b"x" * 136
)


async def _app(scope: Any, receive: Any, send: Any) -> None:  # never called
    raise AssertionError


class _Transport(asyncio.Transport):
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def per_request_us(cls: Callable[..., HttpToolsProtocol], requests: int) -> float:
    loop = asyncio.new_event_loop()
    config = Config(app=_app, loop="none", log_config=None)
    config.load()
    protocol = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    protocol.connection_made(_Transport())

    def complete(cycle: Any, app: Any) -> None:  # the request's response, at once
        cycle.response_complete = True

    protocol._start_asgi_task = complete  # type: ignore[method-assign]
    began = time.perf_counter()
    for _ in range(requests):
        protocol.data_received(REQUEST)
    elapsed = time.perf_counter() - began
    protocol.connection_lost(None)
    loop.close()
    return elapsed / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"uvicorn": [], "guarded": []}
    guarded = guarded_protocol(Settings())  # as serve builds it: the limits from the environment
    for _ in range(args.rounds):
        times["uvicorn"].append(per_request_us(HttpToolsProtocol, 20_000))
        times["guarded"].append(per_request_us(guarded, 20_000))
    best = {name: min(values) for name, values in times.items()}
    print(
        f"uvicorn HttpToolsProtocol   {best['uvicorn']:.2f} us per request (best of {args.rounds})"
    )
    print(f"GuardedHttpProtocol         {best['guarded']:.2f} us per request")
    print(f"difference                  {best['guarded'] - best['uvicorn']:+.2f} us")


if __name__ == "__main__":
    main()
