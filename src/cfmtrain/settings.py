"""A command's settings: one typed dataclass, declared beside its command, holds each setting's
type, default and one line of help; the command's flags, its `--settings` option and the
workflow config's defaults of its section follow from it.

    @dataclasses.dataclass
    class SimulateSettings:
        ranks: list[int] = setting([1, 2, 740], "simulated rank counts")

    add_settings(parser, SimulateSettings)   # --ranks 1 2 740, --settings JSON|KEY=VALUE
    s = from_args(SimulateSettings, args)    # defaults, then --settings in order, then flags

A nested dataclass gives dotted keys (`network.alpha_s`, flag `--network-alpha-s`). Values are
read and checked by their declared type (cfmtrain.typed); a wrong one is an argparse error that
names the key.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import typing
from collections.abc import Iterator
from typing import Any, Literal

from cfmtrain import typed
from cfmtrain.typed import ConfigError

HELP = "help"  # a settings field's metadata key of its one line of help
DEST = "setting:"  # argparse dest of a setting's flag: this + its dotted key
OPTION = "--settings"  # the option of JSON mappings and KEY=VALUE pairs
UPDATES = "settings:"  # its argparse dest (a command's own --settings or --set may be `settings`)


def setting(default: Any, help: str) -> Any:
    """A settings field with its default (a list, mapping or dataclass is copied for each
    instance) and one line of help."""
    metadata = {HELP: help}
    if isinstance(default, list | dict) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default),
                                 metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, Any, dataclasses.Field]]:
    """(dotted key, declared type, field) of every setting of `cls`, nested ones flattened."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            yield from leaves(hint, f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}", hint, field


def defaults(cls: type) -> dict:
    """Every setting of `cls` with its default, as plain nested data."""
    return dataclasses.asdict(cls())


def flag(key: str) -> str:
    """The command-line flag of dotted key `key`: network.alpha_s -> --network-alpha-s."""
    return "--" + key.replace(".", "-").replace("_", "-")


def _reader(hint: Any, key: str):
    """argparse `type` reading one word by `hint`; a wrong value is an argparse error."""
    def read(text: str) -> Any:
        try:
            return typed.check_value(typed.from_text(text, hint, key), hint, key)
        except ConfigError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return read


def _updates(cls: type):
    """argparse `type` of --settings: a JSON mapping or KEY=VALUE, as a nested mapping checked
    against `cls`."""
    def read(text: str) -> dict:
        try:
            if text.lstrip().startswith("{"):
                value = json.loads(text)
            else:
                value = typed.nested(*typed.parse_override(text, cls))
            typed.apply(cls(), value)
        except (ConfigError, json.JSONDecodeError) as err:
            raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
        return value
    return read


def _text(value: Any) -> str:
    return json.dumps(value).replace("%", "%%")


def add_settings(parser: argparse.ArgumentParser, cls: type) -> None:
    """`--settings` and one flag per setting of `cls`, each with its help and default."""
    group = parser.add_argument_group(
        "settings", f"{cls.__name__}; a flag wins over --settings, a later --settings over an "
        "earlier one")
    group.add_argument(OPTION, dest=UPDATES, action="append", default=[], type=_updates(cls),
                       metavar="JSON|KEY=VALUE",
                       help="settings as a JSON mapping (nested for dotted keys) or one "
                            "KEY=VALUE (YAML value; dotted KEY), repeatable")
    for key, hint, field in leaves(cls):
        default = _default(field)
        text = field.metadata[HELP].replace("%", "%%")  # argparse formats help with %
        options: dict[str, Any] = {"dest": DEST + key, "default": argparse.SUPPRESS,
                                   "help": f"{text} (default: {_text(default)})"}
        item = _item(hint)
        if hint is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = _reader(item, key)
            options["metavar"] = key.rsplit(".", 1)[-1].upper()
            if typing.get_origin(item) is Literal:
                options["choices"] = typing.get_args(item)
                options["metavar"] = "{" + ",".join(map(str, typing.get_args(item))) + "}"
            if item is not hint:
                options["nargs"] = "*"
        group.add_argument(flag(key), **options)


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def _item(hint: Any) -> Any:
    """The item type of a list type, else the type itself."""
    if typing.get_origin(hint) is list:
        return typing.get_args(hint)[0]
    return hint


def given(args: argparse.Namespace) -> set[str]:
    """Dotted keys set on the command line, by a flag or by --settings."""
    keys = {name.removeprefix(DEST) for name in vars(args) if name.startswith(DEST)}
    for update in getattr(args, UPDATES, []):
        keys |= set(_dotted(update))
    return keys


def _dotted(update: dict, prefix: str = "") -> Iterator[str]:
    for name, value in update.items():
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{name}.")
        yield f"{prefix}{name}"


def from_args(cls: type, args: argparse.Namespace) -> Any:
    """The settings of one call: defaults, then each --settings in order, then the flags given."""
    obj = cls()
    for update in getattr(args, UPDATES, []):
        typed.apply(obj, update)
    for name, value in vars(args).items():
        if name.startswith(DEST):
            typed.apply(obj, typed.nested(name.removeprefix(DEST).split("."), value))
    return obj


def load(cls: type, values: dict) -> Any:
    """`cls` with the settings of `values` (nested plain data) over its defaults; an unknown
    key or a wrong value is a ConfigError naming the key."""
    obj = cls()
    typed.apply(obj, values)
    return obj


def option(values: dict) -> list[str]:
    """The words that pass `values` (nested plain data) to a command: --settings and JSON."""
    return [OPTION, json.dumps(values, ensure_ascii=False, separators=(",", ":"))]
