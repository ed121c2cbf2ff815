"""Every router the app mounts, in one list."""

from __future__ import annotations

from fastapi import APIRouter

from tensorbits.api import v1, v2

ALL: list[APIRouter] = [v2.router, v1.router]
