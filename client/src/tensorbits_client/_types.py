"""The ``NotGiven`` sentinel and the type aliases of the public signatures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias, TypeVar, final

import httpx
import numpy as np
import numpy.typing as npt

from tensorbits_protocol.validation import ParameterValue  # one definition, the protocol's

__all__ = [
    "NOT_GIVEN",
    "Array",
    "Headers",
    "Inputs",
    "NotGiven",
    "ParameterValue",
    "Parameters",
    "TimeoutTypes",
]


@final
class NotGiven:
    """Marks an argument the caller did not pass, as opposed to one passed as ``None``.

    ``timeout=None`` means "no timeout"; ``timeout=NOT_GIVEN`` (the default) means "the client's".
    """

    _instance: NotGiven | None = None

    def __new__(cls) -> NotGiven:
        # One instance, so ``is NOT_GIVEN`` and ``isinstance`` agree everywhere.
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Final = NotGiven()

T = TypeVar("T")

#: Any NumPy array; results keep the exact dtype and shape the server declared.
Array: TypeAlias = npt.NDArray[Any]
TimeoutTypes: TypeAlias = float | httpx.Timeout | None
Headers: TypeAlias = Mapping[str, str]
Parameters: TypeAlias = Mapping[str, ParameterValue]
#: Inputs of one call: by tensor name, or in the operator's input order.
Inputs: TypeAlias = Mapping[str, npt.ArrayLike] | Sequence[npt.ArrayLike]


def given(value: T | NotGiven, default: T) -> T:
    """``value`` unless it is ``NOT_GIVEN``, else ``default``."""
    return default if isinstance(value, NotGiven) else value


def as_array(value: npt.ArrayLike) -> Array:
    """``value`` as an ndarray, without a copy when it already is one."""
    return value if isinstance(value, np.ndarray) else np.asarray(value)
