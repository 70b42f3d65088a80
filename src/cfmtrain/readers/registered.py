"""Registered data sets' frames (config `kind: download` or `manual`): labels under the key
names and stress unit of ReadOptions, the registry's or the command line's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from cfmtrain.frames.validate import RawFrame, raw_from_atoms
from cfmtrain.readers.options import Part, ReadOptions
from cfmtrain.readers.read import read_part


@dataclass(frozen=True)
class RegistryReader:
    """Reads the parts of a registered data set's files (shards.parts.PartReader)."""

    opts: ReadOptions

    def frames(self, part: Part) -> Iterator[RawFrame]:
        """The part's frames in order, each with its source file and index."""
        opts = self.opts
        for item in read_part(part, opts):
            if isinstance(item, RawFrame):  # labelled by its reader, or unreadable
                yield item
                continue
            source, index, atoms = item
            yield raw_from_atoms(atoms, source, index, opts.energy_key, opts.forces_key,
                                 opts.stress_key, opts.stress_factor)

    def summary(self) -> dict:
        return {}
