"""One's own data (config `kind: files`): files of any format (cfmtrain.frames.formats) read as
frames for `cfmtrain convert NAME --own-data`, their labels found by the data set's keys.

Labels are found as cfmtrain.frames.keys describes; each frame keeps its own config_type
(frames without one get the data set's name), so the graph store's subsets are config_types.
Isolated-atom frames (config_type IsolatedAtom / isolated_atom) are never trained on; they give
the E0s when config `e0s` is `isolated` (cfmtrain.readers.e0s).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cfmtrain.frames.keys import FIELDS, LabelKeys, config_type_of, own_frame
from cfmtrain.frames.validate import InvalidFrameError, RawFrame
from cfmtrain.readers.e0s import Located
from cfmtrain.readers.options import Part
from cfmtrain.readers.read import read_part

ISOLATED_TYPES = ("IsolatedAtom", "isolated_atom")


def read_atoms(path: Path) -> Iterator[Located]:
    """(file, frame, atoms) of every frame of one file; an unreadable frame is an error."""
    for item in read_part(Part(path)):
        if isinstance(item, RawFrame):
            raise InvalidFrameError(item.source, item.index, *item.problem)
        yield item


@dataclass
class OwnReader:
    """Reads frames for training (shards.parts.PartReader); sets the isolated-atom frames
    aside and notes the elements (its summary)."""

    keys: LabelKeys
    isolated: list[Located] = field(default_factory=list)
    numbers: set[int] = field(default_factory=set)

    def frames(self, part: Part) -> Iterator[RawFrame]:
        """The part's frames to train on, in order."""
        for item in read_part(part):
            if isinstance(item, RawFrame):  # unreadable: no atoms to label
                yield item
                continue
            source, index, atoms = item
            if config_type_of(atoms, self.keys) in ISOLATED_TYPES:
                self.isolated.append((source, index, atoms))
                continue
            self.numbers.update(int(z) for z in atoms.numbers)
            yield own_frame(atoms, source, index, self.keys)

    def summary(self) -> dict:
        """The isolated-atom frames and elements seen since the last summary."""
        out = {"isolated": self.isolated, "numbers": self.numbers}
        self.isolated, self.numbers = [], set()
        return out


def parse_keys(pairs: Sequence[str]) -> LabelKeys:
    """`FIELD=NAME` pairs (`FIELD=` ignores the field) over the defaults."""
    keys: dict[str, str | None] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--key {pair!r}: expected FIELD=NAME with FIELD one of "
                             f"{', '.join(FIELDS)}")
        keys[name] = value or None
    return LabelKeys.from_mapping(keys)
