"""The workflow config's sections that are a command's settings, and their dataclasses.

The schema (workflow/schemas/config.schema.yaml) gives such a section's keys their types, ranges
and descriptions but no defaults: those are the dataclass's, filled into the config when the
workflow is parsed (`fill`), passed to the command as one `--settings` (`option`) and written
into the generated reference (`with_defaults`). A section's other keys (which data set, which
variants) are the workflow's own, with their defaults in the schema.
"""

from __future__ import annotations

import copy
import dataclasses
import typing

from cfmtrain import settings, typed
from cfmtrain.bench.accuracy_settings import AccuracySettings
from cfmtrain.bench.scale_settings import ScaleSettings
from cfmtrain.bench.settings import BenchSettings
from cfmtrain.simulate.settings import SimulateSettings
from cfmtrain.sweep.settings import SweepSettings

# config key -> the settings of its command
SECTIONS: dict[str, type] = {
    "simulate": SimulateSettings,  # cfmtrain simulate
    "sweep": SweepSettings,  # cfmtrain sweep batch|capacity (calibrate: preset, threads)
    "accuracy": AccuracySettings,  # cfmtrain bench accuracy
    "scale": ScaleSettings,  # cfmtrain bench scale (and the `scale` target's data and training)
    "bench": BenchSettings,  # cfmtrain bench graphs|balance|loader (their settings extend it)
}


def own(name: str, section: dict) -> dict:
    """The keys of `section` (config section `name`) that are its command's settings."""
    fields = {f.name for f in dataclasses.fields(SECTIONS[name])}
    return {k: v for k, v in section.items() if k in fields}


def fill(config: dict) -> None:
    """Each settings section of `config` (after its schema) with every setting, those left out
    at their defaults; a wrong value is a ConfigError naming `section.key`."""
    for name, cls in SECTIONS.items():
        section = config.setdefault(name, {})
        obj = cls()
        typed.apply(obj, own(name, section), f"{name}.")
        section.update(dataclasses.asdict(obj))


def option(config: dict, name: str, **values: object) -> list[str]:
    """`--settings JSON` of section `name` of a filled `config`, `values` (a rule's wildcards)
    over it."""
    return settings.option({**own(name, config[name]), **values})


def with_defaults(schema: dict) -> dict:
    """A copy of the config schema with the settings sections' defaults written in from their
    dataclasses (the generated reference's default column)."""
    out = copy.deepcopy(schema)
    for name, cls in SECTIONS.items():
        _write_defaults(out["properties"][name], cls)
    return out


def _write_defaults(node: dict, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        prop = node.get("properties", {}).get(field.name)
        if prop is None:  # a command-only setting
            continue
        if dataclasses.is_dataclass(hints[field.name]):  # each of its keys at its default
            prop["default"] = {}
            _write_defaults(prop, hints[field.name])
        else:
            prop["default"] = getattr(cls(), field.name)
