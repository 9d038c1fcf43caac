"""Whether a value has the type a config field declares: for configs made in Python and for
the JSON that `config.json` holds alike."""

from __future__ import annotations

import types
import typing
from typing import Any


def fits(value: Any, annotation: Any) -> bool:
    """Whether `value` has the declared type (an int counts as a float, a bool as neither)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, option) for option in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is type(None):
        return value is None
    if origin is list:  # list[str]: a list of strings
        (item,) = typing.get_args(annotation)
        return isinstance(value, list) and all(fits(element, item) for element in value)
    return isinstance(value, origin or annotation)


def type_name(annotation: Any) -> str:
    """`int`, `int | None`, `Literal['relu', 'gelu']`: the annotation as a user reads it."""
    if typing.get_origin(annotation):
        return str(annotation).replace("typing.", "")
    return str(annotation.__name__)
