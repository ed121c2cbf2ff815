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

        body_sent = False

        async def send_head(message: Message) -> None:
            nonlocal body_sent
            if message["type"] == "http.response.body":
                if body_sent:
                    return  # the one empty body message ended the response
                body_sent = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_head)
