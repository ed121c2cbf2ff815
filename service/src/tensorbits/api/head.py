"""HEAD wherever GET is served (RFC 9110 §9.3.2): the GET's status and headers, no content.

Neither FastAPI's routes nor the fast path list HEAD, so without this every GET route answers
HEAD with 405. Here a HEAD request is handed to the app as a GET (in a copy of the scope: the
server's own scope keeps saying HEAD) and the body of its answer is dropped, its Content-Length
kept. A route that serves no GET still answers 405 (with the methods it allows).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGetMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_head(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {"type": "http.response.body", "body": b"", "more_body": False}
                if sent_last:
                    return
                sent_last.append(True)
            await send(message)

        sent_last: list[bool] = []
        await self.app({**scope, "method": "GET"}, receive, send_head)
