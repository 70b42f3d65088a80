"""All-reduce cost models (ring and tree, alpha-beta) with A100/Slingshot-class defaults.

Times are per gradient all-reduce of `nbytes` over `ranks` participants; one rank costs nothing.
"""

from __future__ import annotations

import dataclasses
import math

# Defaults for an A100 node on an HPE Slingshot-11 dragonfly (the paper's 4xA100 + EPYC 7763 nodes,
# "3-hop dragonfly": NERSC Perlmutter class). Public figures, not fitted to the paper's results:
#  - bandwidth: Slingshot-11 NICs run at 200 Gb/s = 25 GB/s per direction, one NIC per GPU on
#    Perlmutter GPU nodes (HPE Slingshot data sheet; NERSC "Perlmutter architecture" page).
#  - latency: about 2 us MPI point-to-point latency on Slingshot (De Sensi et al., "An In-Depth
#    Analysis of the Slingshot Interconnect", SC20) plus NCCL's per-step software overhead of a
#    few microseconds: 5 us per message in all.
SLINGSHOT_ALPHA_S = 5e-6
SLINGSHOT_BETA_BYTES_PER_S = 25e9
FLOAT32_BYTES = 4


@dataclasses.dataclass(frozen=True)
class Network:
    """Alpha-beta parameters of the interconnect and the all-reduce algorithm NCCL would pick."""

    alpha_s: float = SLINGSHOT_ALPHA_S
    beta_bytes_per_s: float = SLINGSHOT_BETA_BYTES_PER_S
    algorithm: str = "ring"

    def __post_init__(self) -> None:
        if self.alpha_s < 0 or self.beta_bytes_per_s <= 0:
            raise ValueError(f"network: alpha must be >= 0 and beta > 0, got {self}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"network: algorithm {self.algorithm!r} is not one of "
                             f"{sorted(ALGORITHMS)}")

    def allreduce_s(self, ranks: int, nbytes: float) -> float:
        """Seconds for one all-reduce of `nbytes` over `ranks`."""
        return ALGORITHMS[self.algorithm](ranks, nbytes, self.alpha_s, self.beta_bytes_per_s)


def _check(ranks: int, nbytes: float) -> None:
    if ranks < 1 or nbytes < 0:
        raise ValueError(f"all-reduce: ranks must be >= 1 and bytes >= 0, got {ranks}, {nbytes}")


def ring_allreduce_s(ranks: int, nbytes: float, alpha_s: float, beta: float) -> float:
    """Ring (reduce-scatter + all-gather): 2(R-1)·alpha + 2(R-1)/R · bytes/beta."""
    _check(ranks, nbytes)
    return 2 * (ranks - 1) * alpha_s + 2 * (ranks - 1) / ranks * nbytes / beta


def tree_allreduce_s(ranks: int, nbytes: float, alpha_s: float, beta: float) -> float:
    """Binary tree (reduce then broadcast): 2·log2(R)·(alpha + bytes/beta)."""
    _check(ranks, nbytes)
    return 2 * math.log2(ranks) * (alpha_s + nbytes / beta)


ALGORITHMS = {"ring": ring_allreduce_s, "tree": tree_allreduce_s}
