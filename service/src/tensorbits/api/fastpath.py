"""Routes served ahead of the framework: the hot path skips FastAPI's per-request layers.

Between the server and a route, FastAPI puts an exception middleware (with a ``Request`` built
for it), an exit stack for dependencies, and the router's walk over every route; each wraps
``send`` again. For a small inference that is about a fifth of the server's time. The routes
given here are matched first, by this middleware, which sits inside the observability layer (so
they are counted, timed and logged like every other) and answers their errors with the app's own
handlers (``api/errors.py``). Whatever they do not fully match (another path, another method)
goes on to the app as usual.

Each route is registered once: the app lists the same ``FastRoute`` in its own route table too,
where the framework answers a wrong method (405 with ``Allow``) or a trailing slash as it does on
any route, and where ``api/openapi_doc.py`` finds the route's ``Operation`` to document it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tensorbits.api.errors import handler_for


@dataclass(frozen=True, kw_only=True)
class Operation:
    """What the OpenAPI document says of a ``FastRoute`` (FastAPI documents only its own routes;
    ``api/openapi_doc.py`` writes this out beside them), in the terms of a FastAPI route's
    decorator: ``responses`` where a ``"model"`` entry is a JSON body of that model,
    ``response_model`` the 200's JSON body, ``openapi_extra`` the rest of the operation
    (``parameters``, ``requestBody``) as OpenAPI writes it, the description of each of the
    path's parameters by name, and what their schemas add (an ``enum``), as ``Path``'s
    ``json_schema_extra`` adds it."""

    operation_id: str
    summary: str
    tags: Sequence[str]
    responses: Mapping[int | str, Mapping[str, Any]]
    response_model: type[BaseModel] | None = None
    path_parameters: Mapping[str, str] = field(default_factory=dict)
    path_parameter_schemas: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    openapi_extra: Mapping[str, Any] = field(default_factory=dict)


class FastRoute(Route):
    """A route for ``FastPathMiddleware``: it records itself in the scope as FastAPI's routes do,
    so metrics and logs label its requests by the route template, and carries what the OpenAPI
    document says of it."""

    def __init__(
        self, path: str, endpoint: ASGIApp, *, methods: Sequence[str], operation: Operation
    ) -> None:
        super().__init__(path, endpoint, methods=list(methods), name=operation.operation_id)
        self.operation = operation

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


class FastPathMiddleware:
    """Serves ``routes`` on a full match; passes everything else on to ``app``."""

    def __init__(self, app: ASGIApp, routes: Sequence[Route]) -> None:
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
    async def _handle(route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            # The route's app itself: a full match is of a method it serves, the one thing its
            # ``handle`` would check again (a coroutine more per request).
            await route.app(scope, receive, send)
        except Exception as exc:
            # The routes send only once all their work is done (api/admitted.py), so an error is
            # raised before any byte went out and can still be answered as a whole response.
            handler = handler_for(exc)
            if handler is None:
                raise
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)


def install(app: Starlette, routes: Sequence[FastRoute]) -> None:
    """Register ``routes`` with ``app``, once: served ahead of the framework by the middleware
    (added here, so call this where it belongs among the app's middleware), and listed in the
    framework's route table behind it. A request the middleware passes on because of its method
    (a GET, or a HEAD as ``api/head.py`` hands it on) reaches them there and gets the framework's
    answer, 405 with ``Allow``; so does a path with a trailing slash (the redirect); and an app
    without the middleware serves them there in full."""
    app.router.routes.extend(routes)
    app.add_middleware(FastPathMiddleware, routes=routes)
