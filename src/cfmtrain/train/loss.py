"""mace-torch's weighted energy + forces (+ stress) loss, normalised by all-reduced counts.

With counts summed over all ranks and DDP averaging gradients, R ranks give exactly the gradient
of one process over the union of their batches, whatever the size of each rank's batch.
"""

from __future__ import annotations

import torch

from cfmtrain.train.config import OptimConfig


def error_sums(batch, pred: dict, use_stress: bool) -> torch.Tensor:
    """Per-batch sums [energy term, forces term, stress term] of mace-torch's weighted squared
    errors (energy per atom, force components, stress components), not yet normalised."""
    num_atoms = (batch.ptr[1:] - batch.ptr[:-1]).to(pred["energy"].dtype)
    energy = (batch.weight * batch.energy_weight
              * torch.square((batch.energy - pred["energy"]) / num_atoms)).sum()
    atom_weight = torch.repeat_interleave(batch.weight * batch.forces_weight,
                                          batch.ptr[1:] - batch.ptr[:-1]).unsqueeze(-1)
    forces = (atom_weight * torch.square(batch.forces - pred["forces"])).sum()
    stress = energy.new_zeros(())
    if use_stress:
        weight = (batch.weight * batch.stress_weight).view(-1, 1, 1)
        stress = (weight * torch.square(batch.stress - pred["stress"])).sum()
    return torch.stack([energy, forces, stress])


def combine(sums: torch.Tensor, graphs: float, atoms: float, cfg: OptimConfig) -> torch.Tensor:
    """The loss from error sums over `graphs` graphs holding `atoms` atoms (mace-torch's means:
    energy over graphs, forces over 3*atoms components, stress over 9*graphs components)."""
    return (cfg.energy_weight * sums[0] / graphs + cfg.forces_weight * sums[1] / (3 * atoms)
            + cfg.stress_weight * sums[2] / (9 * graphs))


def distributed_loss(batch, pred: dict, global_graphs: float, global_atoms: float,
                     world_size: int, cfg: OptimConfig) -> torch.Tensor:
    """This rank's share of the global loss, times world_size because DDP averages gradients:
    the averaged gradient is then the gradient of the loss over all ranks' graphs."""
    sums = error_sums(batch, pred, cfg.stress_weight > 0)
    return world_size * combine(sums, global_graphs, global_atoms, cfg)
