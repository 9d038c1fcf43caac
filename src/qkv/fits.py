"""Whether a value has the type a config field declares, for configs made in Python and read
from `config.json` alike."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from qkv.errors import ConfigError


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


def typed_section(section: Any, config: type, name: str) -> dict[str, Any]:
    """`section`, read from JSON, checked to be an object whose values fit the fields of the
    dataclass `config` (unknown keys are left to `config` to refuse); ConfigError otherwise."""
    if not isinstance(section, dict):
        raise ConfigError(f"'{name}' must be a JSON object, got {type(section).__name__}")
    hints = typing.get_type_hints(config) if dataclasses.is_dataclass(config) else {}
    for key, value in section.items():
        hint = hints.get(key)
        if hint is not None and not fits(value, hint):
            raise ConfigError(f"{name}.{key} is {value!r}, expected {type_name(hint)}")
    return section
