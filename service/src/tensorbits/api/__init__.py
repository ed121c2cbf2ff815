"""The HTTP layer: thin handlers that decode, validate, run and encode."""
