"""The setting the default target's benchmarks share (config section `bench`): their preset,
declared once; each benchmark's own settings extend it (cfmtrain.bench.graphs, balance, loader,
kernels)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from cfmtrain.settings import setting

PRESET = "quick"  # the default target's preset (kernels' own presets extend the choices)


@dataclasses.dataclass
class BenchSettings:
    """The preset of the default target's benchmarks (graphs, balance, kernels, loader)."""

    preset: Literal["quick", "full"] = setting(PRESET, "quick: minutes, in the default target; "
                                               "full: on demand")
