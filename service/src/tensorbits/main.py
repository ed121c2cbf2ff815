"""``app`` for ``uvicorn tensorbits.main:app``; settings come from the environment."""

from tensorbits.app import create_app

app = create_app()
