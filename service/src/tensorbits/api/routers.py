"""Every route the app serves, in two lists: the FastAPI routers, and the plain ASGI routes."""

from __future__ import annotations

from fastapi import APIRouter

from tensorbits.api import shared_memory, v1, v2, v2_infer
from tensorbits.api.fastpath import FastRoute

# v2 first: routes are matched in order.
ALL: list[APIRouter] = [v2.router, shared_memory.router, shared_memory.cuda_router, v1.router]
# The hot path, plain ASGI routes (api/fastpath.py), each registered once: matched ahead of the
# framework, listed in its route table (405s, documentation) behind it.
FAST_ROUTES: list[FastRoute] = [*v2_infer.ROUTES, *v1.ROUTES]
