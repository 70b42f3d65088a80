"""The settings of `cfmtrain bench accuracy` (config section `accuracy`): types, defaults and
help, declared once; the command's flags and the workflow config's defaults follow from them."""

from __future__ import annotations

import dataclasses
from typing import Literal

from cfmtrain.settings import setting

# the keys of cfmtrain.bench.accuracy.PRESETS, and `model`: the model preset with the settings
# of --model-settings (config model.settings) over it
Preset = Literal["quick", "medium", "model", "goals"]  # goals: medium's former name


@dataclasses.dataclass
class AccuracySettings:
    """The runs' model, epochs, ranks, threads and seeds."""

    preset: Preset = setting("medium", "model and epochs: medium = 32x0e+32x1o, lmax 2, "
                             "correlation 3, 2 epochs; quick = 8x0e+8x1o, lmax 1, correlation "
                             "2, 5 epochs; model = the model target's settings (the model "
                             "preset, --model-settings over it), early stopping off; goals: "
                             "medium's former name, accepted for one release")
    epochs: int = setting(0, "epochs of every run (0: the preset's)")
    extra_epochs: int = setting(2, "at most this many more epochs for a cfmtrain run that has "
                                "not reached mace_run_train's final force MAE after `epochs` "
                                "(resumed from its checkpoint, one at a time; the equal-epoch "
                                "comparison is unchanged)")
    hidden_irreps: str | None = setting(None, "model.hidden_irreps (null: the preset's)")
    max_ell: int | None = setting(None, "model.max_ell (null: the preset's)")
    correlation: int | None = setting(None, "model.correlation (null: the preset's)")
    ranks: int = setting(2, "ranks of the cfmtrain runs")
    threads: int = setting(0, "threads in all (0: the CPUs available); cfmtrain: threads / "
                           "ranks per rank, mace_run_train: all")
    graphs_per_batch: int | None = setting(None, "graphs per batch and rank (null: the training "
                                           "config's); mace_run_train's batch is ranks x this")
    seeds: list[int] = setting([0], "seeds; each trains all three runs, and the goals are "
                               "judged on the medians over the seeds")
