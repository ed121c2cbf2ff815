"""Typed Python client for the tensorbits service."""

__version__ = "0.1.0"

__all__ = ["__version__"]
