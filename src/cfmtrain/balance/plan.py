"""An epoch's batch plan: bins in CSR form, bin s*R + r being rank r's batch at step s.

Padding the DistributedSampler way (copies of graphs or bins) is allowed: a graph's first
occurrence carries weight 1 and every further copy weight 0, so no gradient counts twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Plan:
    """Bins `flat[offsets[k]:offsets[k+1]]`, grouped into steps of `num_ranks` consecutive bins."""

    flat: np.ndarray  # int64 graph indices
    offsets: np.ndarray  # int64, len = bins + 1
    num_ranks: int

    def __post_init__(self) -> None:
        if len(self.offsets) < 1 or self.offsets[0] != 0 or self.offsets[-1] != len(self.flat):
            raise ValueError("Plan: offsets must start at 0 and end at len(flat)")
        if (len(self.offsets) - 1) % self.num_ranks:
            raise ValueError(f"Plan: {len(self.offsets) - 1} bins is not a multiple of "
                             f"num_ranks={self.num_ranks}")

    @classmethod
    def from_bins(cls, bins: list, num_ranks: int) -> Plan:
        """A plan from a list of index arrays (already a multiple of `num_ranks`)."""
        counts = np.array([len(b) for b in bins], np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        flat = (np.concatenate([np.asarray(b, np.int64) for b in bins]) if bins
                else np.zeros(0, np.int64))
        return cls(flat, offsets, num_ranks)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_steps(self) -> int:
        return len(self) // self.num_ranks

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def bin(self, k: int) -> np.ndarray:
        return self.flat[self.offsets[k]:self.offsets[k + 1]]

    def bins(self) -> list[np.ndarray]:
        """The bins as a list of index arrays (views into `flat`)."""
        flat, bounds = self.flat, self.offsets.tolist()
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def loads(self, sizes: np.ndarray) -> np.ndarray:
        """Sum of `sizes` per bin (0 for an empty bin)."""
        cumulative = np.concatenate([[0], np.cumsum(np.asarray(sizes)[self.flat])])
        return cumulative[self.offsets[1:]] - cumulative[self.offsets[:-1]]

    def weights(self, num_graphs: int) -> np.ndarray:
        """Per flat position: 1.0 at a graph's first occurrence, 0.0 at its padding copies."""
        positions = np.arange(len(self.flat))
        first = np.full(num_graphs, len(self.flat), np.int64)
        first[self.flat[::-1]] = positions[::-1]  # the last write, the earliest position, wins
        return (first[self.flat] == positions).astype(np.float32)

    def reordered(self, bin_order: np.ndarray, num_ranks: int | None = None) -> Plan:
        """The bins listed in `bin_order` (bin numbers, repeats allowed), as a plan for
        `num_ranks` ranks (default: the same)."""
        bin_order = np.asarray(bin_order, np.int64)
        counts = self.counts[bin_order]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        shift = np.repeat(self.offsets[:-1][bin_order] - offsets[:-1], counts)
        return Plan(self.flat[np.arange(offsets[-1]) + shift], offsets,
                    num_ranks or self.num_ranks)

    def padded(self) -> tuple[Plan, int]:
        """Empty bins filled the DistributedSampler way: the j-th empty bin gets a copy of the
        j-th non-empty bin. Returns the plan and the number of bins filled with copies."""
        counts = self.counts
        empty, full = np.flatnonzero(counts == 0), np.flatnonzero(counts > 0)
        if not len(empty) or not len(full):
            return self, 0
        source = np.arange(len(self))
        source[empty] = full[np.arange(len(empty)) % len(full)]
        return self.reordered(source), len(empty)

    def shuffled_steps(self, rng: np.random.Generator) -> Plan:
        """Steps in random order and bins at random ranks within each step (loads unchanged)."""
        steps = rng.permutation(self.num_steps)
        within = rng.permuted(np.tile(np.arange(self.num_ranks), (self.num_steps, 1)), axis=1)
        return self.reordered((steps[:, None] * self.num_ranks + within).ravel())
