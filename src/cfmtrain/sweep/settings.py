"""The settings of `cfmtrain sweep` (config section `sweep`): types, defaults and help, declared
once; the command's flags and the workflow config's defaults follow from them."""

from __future__ import annotations

import dataclasses
from typing import Literal

from cfmtrain.settings import setting

Preset = Literal["quick", "full"]  # the keys of cfmtrain.sweep.cli.PRESETS


@dataclasses.dataclass
class SweepSettings:
    """What a sweep times and how."""

    preset: Preset = setting("quick", "quick: a reduced model and few points; full: the paper's "
                             "model (calibrate: the number of batch sizes)")
    dtypes: list[Literal["float32", "float64"]] = setting(
        ["float32", "float64"], "batch, capacity: floating-point types swept")
    small_subset: str = setting("water_clusters", "subset whose graphs are the 'small molecules'")
    large_subset: str = setting("cuni", "subset whose graphs are the 'large molecules'")
    memory_budget_mb: int = setting(0, "memory a step may use beyond the loaded model (0: no "
                                    "limit); stands in for an accelerator's memory")
    threads: int = setting(0, "torch threads (0: torch's default; calibrate: the cells' "
                           "threads setting first)")
    tolerance: float = setting(0.1, "capacity: throughput within this fraction of the best "
                               "counts as saturated")
