"""Shared between the tensorbits server and its client: the wire models, the data-type table,
the operator rule tables and the validation that reads them.

Its own distribution, ``tensorbits-protocol`` (protocol/), which the service and the client both
depend on. Nothing in here imports FastAPI or CuPy; it installs with pydantic, NumPy and jiter only.
"""

from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import (
    InvalidRequest,
    OperatorNotFound,
    TensorbitsError,
)

__all__ = ["DataType", "InvalidRequest", "OperatorNotFound", "TensorbitsError"]
