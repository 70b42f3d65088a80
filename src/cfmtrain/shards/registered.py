"""A registered data set's part of a conversion (config `kind: download` or `manual`): files or
folders of them, labels under the registry's key names (cfmtrain.readers.registered)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cfmtrain.frames.formats import FORMATS, is_known
from cfmtrain.readers.options import ReadOptions
from cfmtrain.readers.registered import RegistryReader
from cfmtrain.sources.registry import DATASETS, SourceKeys


@dataclass(frozen=True)
class Registered:
    """A registered data set (shards.convert.DataKind): its read options, and the config_type
    of every frame (a file's own is kept as source_config_type)."""

    dataset: str
    opts: ReadOptions
    config_type: str

    def files(self, inputs: Sequence[str | os.PathLike]) -> list[Path]:
        _ = self.opts.stress_factor  # an unknown unit fails before any file is read
        return expand_inputs(inputs)

    def reader(self) -> RegistryReader:
        return RegistryReader(self.opts)

    def head(self) -> dict:
        return {"dataset": self.dataset, "config_type": self.config_type}

    def finish(self, staging: Path, summaries: list[dict]) -> dict:
        """The manifest's read options."""
        opts = self.opts
        return {"read_options": {"energy_key": opts.energy_key, "forces_key": opts.forces_key,
                                 "stress_key": opts.stress_key, "stress_unit": opts.stress_unit}}

    def notes(self, manifest: dict) -> str:
        return ""


def expand_inputs(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Files as given, folders replaced by the files in them of a known format (sorted);
    errors if none."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(p for p in item.rglob("*") if p.is_file() and is_known(p))
            if not found:
                raise FileNotFoundError(f"{item}: no {'/'.join(FORMATS)} files found")
            files.extend(found)
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"{item}: no such file or folder")
    return files


def default_options(name: str) -> ReadOptions:
    """The registry's read options for data set `name` (MACE's REF_* keys if unregistered)."""
    keys = DATASETS[name].keys if name in DATASETS else SourceKeys()
    return ReadOptions(keys.energy, keys.forces, keys.stress, keys.stress_unit)
