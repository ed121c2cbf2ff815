"""Every router the app mounts, in one list."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.routing import BaseRoute

from tensorbits.api import v1, v2, v2_infer

# v2 first: routes are matched in order, and v2 inference is the hot path.
ALL: list[APIRouter] = [v2.router, v1.router]
# Plain ASGI routes matched ahead of the framework: the hot path (api/fastpath.py, v2_infer).
FAST_ROUTES: list[BaseRoute] = [*v2_infer.ROUTES, *v1.ROUTES]
