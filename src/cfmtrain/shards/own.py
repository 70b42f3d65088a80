"""One's own data's part of a conversion (config `kind: files`, `cfmtrain convert NAME
--own-data`): files only, labels by the data set's keys, the given E0s into `e0s.json`."""

from __future__ import annotations

import argparse
import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cfmtrain.frames.formats import FORMATS
from cfmtrain.frames.keys import FIELDS, LabelKeys
from cfmtrain.readers.e0s import (
    TRAINING_METHODS,
    E0s,
    check_covers,
    resolve_e0s,
    write_e0s,
)
from cfmtrain.readers.own import OwnReader, read_atoms
from cfmtrain.shards.sources import source_record


@dataclass
class OwnData:
    """An own data set (shards.convert.DataKind): its label keys and config `e0s`; frames keep
    their own config_type, the data set's name otherwise."""

    dataset: str
    keys: LabelKeys
    e0s: str = "fit"
    given: E0s | None = None  # found by `reader`, or from the frames by `finish`
    e0s_file: dict | None = None

    @property
    def config_type(self) -> str:
        return self.dataset

    def files(self, inputs: Sequence[str | os.PathLike]) -> list[Path]:
        """The files as given: a folder or a missing file is an error naming it (config
        `paths` lists files, so that the graphs depend on each)."""
        paths = [Path(f) for f in inputs]
        for path in paths:
            if path.is_dir():
                raise ValueError(f"{path}: is a folder; list its files or a glob such as "
                                 f"'{path}/*.xyz' ('**' recurses)")
            if not path.is_file():
                raise FileNotFoundError(f"{path}: " + ("matches no file"
                                                       if glob.has_magic(str(path))
                                                       else "no such file"))
        return paths

    def reader(self) -> OwnReader:
        """The reader, once a given E0s' mapping or file has been read: a bad one fails before
        any frame is read (`isolated` needs the frames first)."""
        e0s = self.e0s
        # an E0s file is an input too: recorded (before it is read) as the manifest's e0s_file
        self.e0s_file = (source_record(e0s) if e0s not in (*TRAINING_METHODS, "isolated")
                         and not e0s.lstrip().startswith("{") and Path(e0s).is_file() else None)
        self.given = None if e0s == "isolated" else resolve_e0s(e0s, [], self.keys, read_atoms)
        return OwnReader(self.keys)

    def head(self) -> dict:
        return {"dataset": self.dataset, "kind": "files", "default_config_type": self.dataset}

    def finish(self, staging: Path, summaries: list[dict]) -> dict:
        """The E0s (from the isolated-atom frames if so given), checked to cover every element
        and written to `staging`; the manifest's keys, E0s and isolated-atom count."""
        isolated = [frame for part in summaries for frame in part["isolated"]]
        given = self.given or resolve_e0s(self.e0s, isolated, self.keys, read_atoms)
        check_covers(given, set().union(*(part["numbers"] for part in summaries)))
        write_e0s(staging, given)
        return {"keys": self.keys.as_dict(), "e0s": given.record(),
                **({"e0s_file": self.e0s_file} if self.e0s_file else {}),
                "isolated_atoms": len(isolated)}

    def notes(self, manifest: dict) -> str:
        return (f"; {manifest['isolated_atoms']} isolated-atom frames; E0s "
                f"{manifest['e0s']['method']}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The own-data options of `cfmtrain convert`."""
    group = parser.add_argument_group("own data (config kind: files)")
    group.add_argument("--own-data", action="store_true",
                       help=f"read the --input files (by suffix: {', '.join(FORMATS)}) as own "
                       "data: labels by --key or the defaults, each frame's config_type kept")
    group.add_argument("--key", action="append", default=[], metavar="FIELD=NAME",
                       help=f"where a label is ({', '.join(FIELDS)}); FIELD= ignores it")
    group.add_argument("--e0s", default="fit", help="fit, average, isolated (frames marked "
                       "config_type=IsolatedAtom), a JSON mapping element->eV, or a file of "
                       "isolated-atom frames")
