"""The setting the default target's benchmarks share (config section `bench`): their preset,
declared once; each benchmark's own settings extend it (cfmtrain.bench.graphs, balance, loader,
kernels)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Literal

from cfmtrain.settings import setting

PRESET = "quick"  # the default target's preset (kernels' own presets extend the choices)
# presets renamed after 0.1.0 (command -> new name), the old names accepted for one release
RENAMED = {"goals": {"kernels": "paper-model", "md": "paper-model", "accuracy": "medium"}}


def preset_name(command: str):
    """argparse `type` of a benchmark's --preset: a renamed preset's old name gives its new
    name, with a note on stderr."""
    def read(name: str) -> str:
        new = RENAMED.get(name, {}).get(command)
        if new is None:
            return name
        print(f"note: cfmtrain bench {command}: preset `{name}` is now called `{new}`; the old "
              "name will be refused from the next release", file=sys.stderr)
        return new
    return read


@dataclasses.dataclass
class BenchSettings:
    """The preset of the default target's benchmarks (graphs, balance, kernels, loader)."""

    preset: Literal["quick", "full"] = setting(PRESET, "quick: minutes, in the default target; "
                                               "full: on demand")
