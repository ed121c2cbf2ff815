"""Shared between the tensorbits server and its client: the wire models, the data-type table,
the operator rule tables and the validation that reads them.

Nothing in here imports FastAPI or CuPy; the client installs with httpx, pydantic and NumPy only.
"""

from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import (
    InvalidRequest,
    OperatorNotFound,
    TensorbitsError,
)

__all__ = ["DataType", "InvalidRequest", "OperatorNotFound", "TensorbitsError"]
