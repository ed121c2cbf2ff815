"""Routes served ahead of the framework: the hot path skips FastAPI's per-request layers.

Between the server and a route, FastAPI puts an exception middleware (with a ``Request`` built
for it), an exit stack for dependencies, and the router's walk over every route; each wraps
``send`` again. For a small inference that is about a fifth of the server's time. The routes
given here are matched first, by this middleware, which sits inside the observability layer (so
they are counted, timed and logged like every other) and answers their errors with the app's own
handlers (``api/errors.py``). Whatever they do not fully match (another path, another method)
goes on to the app as usual.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tensorbits.api.errors import handler_for


class FastRoute(Route):
    """A route for ``FastPathMiddleware``: it records itself in the scope as FastAPI's routes do,
    so metrics and logs label its requests by the route template."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


class FastPathMiddleware:
    """Serves ``routes`` on a full match; passes everything else on to ``app``."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = tuple(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self.routes:
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child_scope)
                    await self._handle(route, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    @staticmethod
    async def _handle(route: BaseRoute, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await route.handle(scope, receive, send)
        except Exception as exc:
            # The routes send only once all their work is done (api/framed.py), so an error is
            # raised before any byte went out and can still be answered as a whole response.
            handler = handler_for(exc)
            if handler is None:
                raise
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)
