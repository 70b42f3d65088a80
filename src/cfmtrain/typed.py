"""Values read and checked by their declared type: the typed dataclass configs' common reader.

A dataclass field's type hint says what its value may be (int, float, bool, str, Literal, lists,
mappings, unions with None, nested dataclasses); `check_value` checks a value against it and
`from_text` reads command-line text by it. Errors are ConfigErrors that name the key.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A configuration key or value that is not allowed; the message names the key."""


# YAML 1.2's finite numbers (PyYAML, a YAML 1.1 reader, leaves 1e-3 and 5e-07 as strings)
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INT = re.compile(r"[-+]?[0-9]+")
_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_NULLS = {"", "~", "null", "Null", "NULL", "none", "None"}
# command-line text -> value (None: not of that type), and what was expected
_SCALARS: dict[type, tuple[Callable[[str], Any], str]] = {
    int: (lambda t: int(t) if _INT.fullmatch(t) else None, "an integer"),
    float: (lambda t: float(t) if _FLOAT.fullmatch(t) else None, "a finite number"),
    bool: (lambda t: _BOOLS.get(t.lower()), "true or false"),
}


def check_value(value: Any, hint: Any, key: str) -> Any:
    """`value` as type `hint` (ints and number strings such as '5e-07' may become floats), else
    a ConfigError naming the key."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return check_value(value, arg, key)
            except ConfigError as err:
                errors.append(str(err).removeprefix(f"config {key}: "))
        raise ConfigError(f"config {key}: {value!r} fits none of its types: " + "; ".join(errors))
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config {key}: {value!r} is not one of {list(args)}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config {key}: expected a list, got {value!r}")
        return [check_value(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config {key}: expected a mapping, got {value!r}")
        return {str(k): check_value(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if hint is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            value = float(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, float) or not math.isfinite(value):
            raise ConfigError(f"config {key}: expected a finite number, got {value!r}")
        return value
    if hint is str and isinstance(value, Path):
        return str(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"config {key}: expected {hint.__name__}, got {value!r}")
    return value


def field_hint(cls: type, keys: list[str]) -> Any:
    """The declared type of the dotted key `keys` of dataclass `cls`; None if there is none."""
    hint: Any = cls
    for name in keys:
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            return None
        hint = typing.get_type_hints(hint).get(name)
    return hint


def _unquote(text: str) -> str:
    """`text` without one pair of enclosing YAML/JSON quotes ('"a b"' -> 'a b'), else as is."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            return text
        return value if isinstance(value, str) else text
    return text


def from_text(text: str, hint: Any, key: str) -> Any:
    """A command-line value read by its key's declared type `hint`: ints in decimal, floats as
    YAML 1.2 numbers (1e-3, 5e-07), bools as true/false/yes/no/on/off, null/none/~ for optional
    keys, strings as typed (one pair of quotes removed), lists and mappings as YAML."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    stripped = text.strip()
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and stripped in _NULLS:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):  # the first type that reads it
            try:
                return check_value(from_text(text, arg, key), arg, key)
            except ConfigError as err:
                errors.append(str(err).removeprefix(f"config {key}: "))
        raise ConfigError(f"config {key}: {text!r} fits none of its types: " + "; ".join(errors))
    if hint is str or origin is Literal:
        return _unquote(text)
    if hint in _SCALARS:
        parse, expected = _SCALARS[hint]
        value = parse(stripped)
        if value is None:
            raise ConfigError(f"config {key}: expected {expected}, got {text!r}")
        return value
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or err
        raise ConfigError(f"config {key}: {text!r} is not a YAML value ({problem})") from None


def apply(obj: Any, updates: dict, prefix: str = "") -> None:
    """Set the keys of `updates` (nested mappings for nested dataclasses) on dataclass `obj`,
    each checked against its declared type; an unknown key is an error listing the known."""
    hints = typing.get_type_hints(type(obj))
    for name, value in updates.items():
        key = f"{prefix}{name}"
        if name not in hints:
            known = ", ".join(f"{prefix}{k}" for k in hints)
            raise ConfigError(f"config: unknown key {key!r}; known keys: {known}")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"config {key}: expected a mapping, got {value!r}")
            apply(current, value, f"{key}.")
        else:
            setattr(obj, name, check_value(value, hints[name], key))


def parse_override(text: str, cls: type) -> tuple[list[str], Any]:
    """`optim.lr=1e-3` -> (['optim', 'lr'], 0.001); the value is read by the key's declared
    type in dataclass `cls` (see from_text), or as YAML for a mapping or an unknown key
    (refused when applied)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. optim.lr=0.01")
    keys = key.strip().split(".")
    return keys, from_text(value, field_hint(cls, keys), ".".join(keys))


def nested(keys: list[str], value: Any) -> dict:
    """(['optim', 'lr'], 0.1) -> {'optim': {'lr': 0.1}}."""
    out: dict = {keys[-1]: value}
    for k in reversed(keys[:-1]):
        out = {k: out}
    return out
