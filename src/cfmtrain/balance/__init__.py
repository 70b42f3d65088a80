"""Balanced mini-batches: the paper's Algorithm 1 (compiled), its peers, a DDP batch sampler.

`pack_bins(sizes, capacity, num_ranks)` gives bins whose consecutive groups of R are steps; it
adds our refinements (not the paper's) where Algorithm 1 misses a goal; `refine=False` omits them.
"""

from cfmtrain.balance.algorithm1 import algorithm1_reference
from cfmtrain.balance.costs import MEASURES, graph_costs
from cfmtrain.balance.metrics import (
    lower_bound_bins,
    plan_metrics,
    repeated_fraction,
    step_balance,
)
from cfmtrain.balance.pack import pack_bins, pack_plan
from cfmtrain.balance.plan import Plan
from cfmtrain.balance.strategies import STRATEGIES, get_strategy

__all__ = [
    "MEASURES",
    "STRATEGIES",
    "DistributedBinPackSampler",
    "PaddingWeightedDataset",
    "Plan",
    "algorithm1_reference",
    "get_strategy",
    "graph_costs",
    "lower_bound_bins",
    "pack_bins",
    "pack_plan",
    "plan_metrics",
    "repeated_fraction",
    "step_balance",
]


def __getattr__(name: str):
    """The sampler imports torch: load it only when asked for."""
    if name in ("DistributedBinPackSampler", "PaddingWeightedDataset"):
        from cfmtrain.balance import sampler  # lazy: torch

        return getattr(sampler, name)
    raise AttributeError(f"module 'cfmtrain.balance' has no attribute {name!r}")
