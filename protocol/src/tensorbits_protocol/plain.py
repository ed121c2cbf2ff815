"""A wire model's schema read into plain dicts: derived from the model, never written twice.

pydantic builds a dict about a third faster than a model instance, and a /v1 batch header of 100
small dispatches holds about 900 objects (0.31 ms as dicts instead of 0.41 ms as models). Where
that matters, ``dict_reader(Model)`` reads the model's schema into dicts: a ``TypedDict`` is
made for each model, field for field, with the same annotations, constraints, defaults and
config, nested models replaced by their own ``TypedDict``. The tests hold each reader to its
model (the same JSON Schema, the same documents accepted, equal values read).
"""

from __future__ import annotations

import typing
from functools import cache
from types import GenericAlias, UnionType
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.fields import FieldInfo
from typing_extensions import TypedDict  # pydantic reads typing's TypedDict only from 3.12 on

PlainDict = dict[str, Any]
_make_typed_dict: Any = TypedDict  # its functional form, with names known only at run time


def dict_reader(model: type[BaseModel]) -> TypeAdapter[PlainDict]:
    """A reader of ``model``'s schema into plain dicts (defaults filled in, as the model's
    ``model_dump()`` would give them)."""
    adapter: TypeAdapter[PlainDict] = TypeAdapter(typed_dict(model))
    return adapter


@cache
def typed_dict(model: type[BaseModel]) -> Any:
    """The ``TypedDict`` of ``model``: one per model, nested models replaced by theirs."""
    fields = {name: _field(info) for name, info in model.model_fields.items()}
    derived: Any = _make_typed_dict(f"{model.__name__}Data", fields)
    config = model.model_config
    derived.__pydantic_config__ = ConfigDict(
        strict=config.get("strict", False), extra=config.get("extra", "ignore")
    )
    return derived


def _field(info: FieldInfo) -> Any:
    annotation = _plain(info.annotation)
    metadata = list(info.metadata)
    if not info.is_required():
        if info.default_factory is not None:
            metadata.append(Field(default_factory=info.default_factory))
        else:
            metadata.append(Field(default=info.default))
    return Annotated[(annotation, *metadata)] if metadata else annotation


def _plain(annotation: Any) -> Any:
    """``annotation`` with every model in it replaced by its TypedDict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return typed_dict(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if not args:
        return annotation
    if origin is Annotated:
        return Annotated[(_plain(args[0]), *annotation.__metadata__)]
    if origin in (typing.Union, UnionType):
        return typing.Union[tuple(_plain(arg) for arg in args)]  # noqa: UP007 (built from a tuple)
    if origin in (list, dict, tuple):
        return GenericAlias(origin, tuple(_plain(arg) for arg in args))
    return annotation  # Literal and the like: no model inside
