"""`key=value` overrides from the command line, applied to typed config dataclasses."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable
from typing import Any, TypeVar, Union, get_args, get_origin

from qkv.errors import ConfigError

T = TypeVar("T")
U = TypeVar("U")
V = TypeVar("V")


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """["lr=1e-3", "d_model=256"] -> {"lr": "1e-3", "d_model": "256"}; the last of a key wins,
    as the last of an option does."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _convert(name: str, text: str, annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        if text.lower() in ("none", "null"):
            return None
        return _convert(name, text, options[0])
    if origin is list:  # comma-separated: labels=neg,pos
        (item,) = get_args(annotation)
        return [_convert(name, part.strip(), item) for part in text.split(",") if part.strip()]
    if origin is typing.Literal:
        if text not in get_args(annotation):
            choices = ", ".join(map(str, get_args(annotation)))
            raise ConfigError(f"{name}: {text!r} is not one of {choices}")
        return text
    try:
        if annotation is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
        if annotation in (int, float, str):
            return annotation(text)
    except ValueError:
        raise ConfigError(f"{name}: cannot read {text!r} as {annotation.__name__}") from None
    return text


def apply(config: T, values: dict[str, str]) -> tuple[T, dict[str, str]]:
    """Applies the overrides that name fields of `config`; returns it and the rest."""
    assert dataclasses.is_dataclass(config) and not isinstance(config, type)
    hints = typing.get_type_hints(type(config))
    names = {f.name for f in dataclasses.fields(config)}
    mine = {k: _convert(k, v, hints[k]) for k, v in values.items() if k in names}
    rest = {k: v for k, v in values.items() if k not in names}
    return dataclasses.replace(config, **mine), rest


def apply_all(data: T, model: U, train: V, values: dict[str, str]) -> tuple[T, U, V]:
    """Applies overrides to the data, model and training configs; unknown keys raise ConfigError."""
    data, rest = apply(data, values)
    model, rest = apply(model, rest)
    train, rest = apply(train, rest)
    if rest:
        raise unknown_settings(rest, [*vars(data), *vars(model), *vars(train)])
    return data, model, train


FLAGS = ("out", "preset", "resume")
"""`qkv train`'s options, given by mistake as settings (`out=RUN`)."""


def unknown_settings(unknown: Iterable[str], known: Iterable[str]) -> ConfigError:
    """The error for settings no config has, each with the known name it is likely a typo of:
    "unknown setting(s): d_modle (did you mean d_model?)"."""
    known = list(known)
    named = []
    for key in sorted(unknown):
        near = [f"--{key}"] if key in FLAGS else difflib.get_close_matches(key, known, n=1)
        named.append(f"{key} (did you mean {near[0]}?)" if near else key)
    return ConfigError(f"unknown setting(s): {', '.join(named)}")
