"""Every router the app mounts, in one list."""

from __future__ import annotations

from fastapi import APIRouter

ALL: list[APIRouter] = []
