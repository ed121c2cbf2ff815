"""``app`` for ``uvicorn tensorbits.server.main:app``; settings come from the environment."""

from tensorbits.server.app import create_app

app = create_app()
