"""The settings of `cfmtrain simulate` (config section `simulate`): types, defaults and help,
declared once; the command's flags and the workflow config's defaults follow from them."""

from __future__ import annotations

import dataclasses
from typing import Literal

from cfmtrain import paper
from cfmtrain.paper import CAPACITY, PAPER_GRAPHS, PAPER_PARAMETERS, PAPER_RANKS
from cfmtrain.settings import setting
from cfmtrain.simulate.allreduce import (
    ALGORITHMS,
    SLINGSHOT_ALPHA_S,
    SLINGSHOT_BETA_BYTES_PER_S,
)

DEFAULT_RANKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, PAPER_RANKS, 1024)
# gloo all-reduce between 2 processes over loopback on this project's 2-core host (measured with
# torchrun and 10 all-reduces per size, machine under load): ~6 ms at 4 B, ~7 ms at 4 MB,
# ~107 ms at 40 MB. Used only to predict measured multi-rank runs.
LOCAL_ALPHA_S = 3e-3
LOCAL_BETA_BYTES_PER_S = 4e8
# The paper's Figure 11 (A100, float32): time per step flat up to about 800 atoms.
A100_SATURATION_ATOMS = 800

Algorithm = Literal[tuple(ALGORITHMS)]  # Literal of a tuple: the same as Literal of its items


@dataclasses.dataclass
class NetworkSettings:
    """The all-reduce at the simulated scale; defaults are Slingshot-11-class public figures."""

    algorithm: Algorithm = setting("ring", "all-reduce algorithm: ring 2(R-1)a + 2(R-1)/R b/B, "
                                   "tree 2 log2(R)(a + b/B)")
    alpha_s: float = setting(SLINGSHOT_ALPHA_S, "latency per message (s)")
    beta_bytes_per_s: float = setting(SLINGSHOT_BETA_BYTES_PER_S, "bandwidth per rank (bytes/s)")


@dataclasses.dataclass
class SimulateSettings:
    """Cost models, their validation and the simulated scale."""

    distribution: Literal["table3", "dataset"] = setting(
        "table3", "table3: the paper's Table 3 mixture drawn at total_graphs; dataset: the "
        "store's own graphs")
    total_graphs: int = setting(PAPER_GRAPHS, "graphs of the Table 3 mixture")
    ranks: list[int] = setting(list(DEFAULT_RANKS), "simulated rank counts (strong scaling)")
    weak: list[str] = setting([f"{g}:{r}" for g, r in paper.WEAK_SCALING],
                              "weak-scaling points GRAPHS:RANKS (GRAPHS <= 1 is a fraction of "
                              "the distribution)")
    graphs_per_batch: int = setting(8, "fixed-count variants: graphs per rank and step")
    capacity: int = setting(CAPACITY, "Algorithm 1 bin capacity (atoms)")
    strategies: list[str] = setting(["algorithm1"], "packing strategies of cfmtrain.balance "
                                    "simulated besides the fixed count")
    parameters: float = setting(PAPER_PARAMETERS, "model parameters all-reduced per step at the "
                                "simulated scale (float32)")
    saturation_atoms: float = setting(A100_SATURATION_ATOMS, "accelerator case: a batch below "
                                      "this many atoms costs as much as this many")
    min_r2: float = setting(0.95, "a variant whose calibration fit has a lower R² is unsupported")
    held_out: str = setting("", "the group (data set/r<ranks>) predicted from the others alone "
                            "('': the last group given, the matrix's last)")
    max_held_out_error: float = setting(0.10, "the held-out group's speed-ups may be off their "
                                        "paired medians by at most this (relative)")
    ratio_widen: float = setting(0.05, "an in-sample speed-up may lie this far (relative) "
                                 "outside its paired 10-90% range")
    validation_parameters: float | None = setting(None, "parameters of the measured runs' model "
                                                  "(null: counted from each run's config)")
    validation_alpha: float = setting(LOCAL_ALPHA_S, "latency per message (s) of the measured "
                                      "runs' all-reduce")
    validation_beta: float = setting(LOCAL_BETA_BYTES_PER_S, "bandwidth (bytes/s) of the "
                                     "measured runs' all-reduce")
    seed: int = setting(0, "seed of the drawn sizes and shuffles")
    network: NetworkSettings = setting(NetworkSettings(), "the all-reduce at the simulated scale")
