"""The client distribution's version (kept in step with client/pyproject.toml)."""

__version__ = "0.1.0"
