"""Error sums (energy per atom and force MAE, loss terms) accumulated per rank and all-reduced,
and the per-step timing of one rank (its record, a row of steps.csv, is train.steps.StepRecord).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist

from cfmtrain.ranks.collectives import all_reduce_sum
from cfmtrain.train.config import OptimConfig
from cfmtrain.train.loss import combine

# Layout of an ErrorSums vector.
FIELDS = ("loss_e", "loss_f", "loss_s", "abs_e_per_atom", "abs_f", "graphs", "atoms")


def per_graph_errors(batch, pred: dict, use_stress: bool) -> torch.Tensor:
    """[graphs, len(FIELDS)] float64: each graph's weighted squared-error terms (as in
    loss.error_sums), absolute energy error per atom, summed absolute force error, 1, atoms."""
    n = (batch.ptr[1:] - batch.ptr[:-1]).double()
    w = (batch.weight).double()
    d_e = (batch.energy - pred["energy"]).double()
    d_f = (batch.forces - pred["forces"]).double()
    graph_of_atom = batch.batch
    f_sq = torch.zeros_like(n).index_add_(0, graph_of_atom, d_f.square().sum(-1))
    f_abs = torch.zeros_like(n).index_add_(0, graph_of_atom, d_f.abs().sum(-1))
    s_sq = torch.zeros_like(n)
    if use_stress:
        s_sq = (w * batch.stress_weight.double()) * (batch.stress - pred["stress"]).double(
        ).square().sum((-1, -2))
    real = (w > 0).double()  # padding copies (weight 0) are not counted in errors
    return torch.stack([w * batch.energy_weight.double() * (d_e / n).square(),
                        w * batch.forces_weight.double() * f_sq, s_sq, real * d_e.abs() / n,
                        real * f_abs, real, real * n], dim=1)


class NonFiniteMetricError(FloatingPointError):
    """A validation or test error that is NaN or infinite; the message names the graphs."""


FINITE = -2  # in ErrorSums' flags: the graph's errors were finite


class ErrorSums:
    """Sums of errors over graphs, one row per group (e.g. subset); `reduced()` sums ranks.
    `nonfinite` lists the store indices of graphs whose errors were NaN or infinite.

    A batch's errors are summed where its tensors are (a CUDA device: no copy to the host, no
    wait for the device per step); the graphs with non-finite errors are flagged there too, and
    named only by `reduced()`, which returns the sums on the host."""

    def __init__(self, groups: int = 1, values: torch.Tensor | None = None,
                 nonfinite: list[int] | None = None):
        self.values = (torch.zeros(groups, len(FIELDS), dtype=torch.float64) if values is None
                       else values)
        self.nonfinite: list[int] = list(nonfinite or [])
        self._flags: list[torch.Tensor] = []  # per batch: store index of a non-finite graph

    def add(self, batch, pred: dict, use_stress: bool, groups: torch.Tensor | None = None
            ) -> None:
        """Add one batch's errors; `groups` gives each graph's row (default row 0)."""
        with torch.no_grad():
            rows = per_graph_errors(batch, pred, use_stress)
            if self.values.device != rows.device:
                self.values = self.values.to(rows.device)
            ids = (batch.store_id if hasattr(batch, "store_id")
                   else torch.full((len(rows),), -1, device=rows.device))
            self._flags.append(torch.where(torch.isfinite(rows).all(1), FINITE, ids.to(
                rows.device)))
            if groups is None:
                groups = torch.zeros(len(rows), dtype=torch.long, device=rows.device)
            self.values.index_add_(0, groups.to(rows.device), rows)

    def _nonfinite(self) -> list[int]:
        """This rank's graphs with non-finite errors (read from the device once)."""
        if self._flags:
            flags = torch.cat(self._flags).cpu()
            self.nonfinite += [int(i) for i in flags[flags != FINITE].tolist()]
            self._flags = []
        return self.nonfinite

    def reduced(self) -> ErrorSums:
        """The sums over all ranks on the host (a collective: every rank must call it), with
        every rank's non-finite graphs when the sums are not finite (the same on every rank)."""
        values, nonfinite = all_reduce_sum(self.values.clone()).cpu(), self._nonfinite()
        if dist.is_initialized() and dist.get_world_size() > 1:
            if not torch.isfinite(values).all():
                parts: list = [None] * dist.get_world_size()
                dist.all_gather_object(parts, self.nonfinite)
                nonfinite = [i for part in parts for i in part]
        return ErrorSums(values=values, nonfinite=sorted(nonfinite))

    def finite_dict(self, cfg: OptimConfig, what: str) -> dict[str, float]:
        """`as_dict(cfg)`, raising NonFiniteMetricError (naming `what` and the graphs) if the
        loss or an MAE over a non-empty set is NaN or infinite, instead of writing null."""
        errors = self.as_dict(cfg)
        keys = ("loss", "mae_energy_per_atom", "mae_forces")
        if errors["graphs"] and not all(math.isfinite(errors[k]) for k in keys):
            bad = self.nonfinite
            named = (f"; graphs with non-finite errors, store indices {bad[:20]}"
                     f"{f' and {len(bad) - 20} more' if len(bad) > 20 else ''}" if bad else "")
            raise NonFiniteMetricError(
                f"{what}: non-finite errors over {errors['graphs']} graphs (MAE energy "
                f"{errors['mae_energy_per_atom']} eV/atom, forces {errors['mae_forces']} eV/Å, "
                f"loss {errors['loss']}){named}: the graph store holds NaN or infinite values "
                "there, or the model diverged; the run is not finished")
        return errors

    def as_dict(self, cfg: OptimConfig, row: int | None = None) -> dict[str, float]:
        """loss (mace-torch's), mae_energy_per_atom (eV/atom), mae_forces (eV/Å), graphs; for
        one group row, or over all rows."""
        values = self.values.sum(0) if row is None else self.values[row]
        v = dict(zip(FIELDS, values.tolist(), strict=True))
        if v["graphs"] == 0:
            return {"loss": float("nan"), "mae_energy_per_atom": float("nan"),
                    "mae_forces": float("nan"), "graphs": 0}
        loss = combine(values[:3], v["graphs"], v["atoms"], cfg)
        return {"loss": float(loss), "mae_energy_per_atom": v["abs_e_per_atom"] / v["graphs"],
                "mae_forces": v["abs_f"] / (3 * v["atoms"]), "graphs": int(v["graphs"])}


@dataclasses.dataclass
class StepTimes:
    """One rank's timing of one step, in seconds; wait/allreduce are measured only in
    measurement mode (NaN otherwise, where DDP overlaps the all-reduce with backward). cpu_s and
    compute_cpu_s are the training thread's CPU time (`time.thread_time`) over the whole step
    and over its compute, beside the wall times step_s and compute_s (see train.contention)."""

    data_s: float = 0.0
    compute_s: float = 0.0
    wait_s: float = float("nan")
    allreduce_s: float = float("nan")
    optim_s: float = 0.0
    cpu_s: float = 0.0
    compute_cpu_s: float = 0.0

    @property
    def step_s(self) -> float:
        """The whole step: data wait, compute, straggler wait, all-reduce, optimiser."""
        parts = (self.data_s, self.compute_s, self.wait_s, self.allreduce_s, self.optim_s)
        return sum(p for p in parts if p == p)
