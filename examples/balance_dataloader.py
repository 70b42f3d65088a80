"""Balanced batches for MACE training in a plain PyTorch DataLoader loop (cfmtrain's sampler).

mace-torch data (AtomicData, collated by mace's torch_geometric Collater) batched by
DistributedBinPackSampler: every rank gets bins of about `--capacity` atoms, the same work at
every step; padding copies (only when there are fewer graphs than bins) carry loss weight 0
through PaddingWeightedDataset, which scales AtomicData.weight, the per-graph weight of MACE's
losses. Structures are small Cu/Ni crystals labelled with ASE's EMT calculator.

    python examples/balance_dataloader.py --graphs 60 --capacity 300 --epochs 2
    torchrun --nproc-per-node 2 examples/balance_dataloader.py      # DDP over gloo
    python examples/balance_dataloader.py --num-replicas 4 --rank 3 # one rank's share, no DDP
"""

from __future__ import annotations

import argparse
import os

import mace  # noqa: F401  (import mace before e3nn: torch weights-only loading)
import numpy as np
import torch
from ase.build import bulk
from ase.calculators.emt import EMT
from e3nn import o3
from mace import data, modules, tools
from mace.tools.torch_geometric.dataloader import Collater
from torch.utils.data import DataLoader

from cfmtrain.balance import DistributedBinPackSampler, PaddingWeightedDataset

KEYS = data.KeySpecification(info_keys={"energy": "REF_energy"},
                             arrays_keys={"forces": "REF_forces"})


def structures(count: int, seed: int) -> list:
    """Rattled Cu/Ni fcc cells of 4 to 108 atoms with EMT energies and forces."""
    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(count):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(tuple(rng.integers(1, 4, 3)))
        atoms.numbers[rng.random(len(atoms)) < 0.3] = 28  # Ni
        atoms.rattle(0.05, seed=int(rng.integers(1 << 31)))
        atoms.calc = EMT()
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
        frames.append(atoms)
    return frames


def tiny_mace(z_table: tools.AtomicNumberTable, cutoff: float) -> torch.nn.Module:
    """A small MACE (2 layers, 8 channels) so the example runs in seconds on a CPU."""
    return modules.MACE(
        r_max=cutoff, num_bessel=8, num_polynomial_cutoff=5, max_ell=2,
        interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
        interaction_cls_first=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
        num_interactions=2, num_elements=len(z_table), hidden_irreps=o3.Irreps("8x0e+8x1o"),
        MLP_irreps=o3.Irreps("8x0e"), atomic_energies=np.zeros(len(z_table)),
        avg_num_neighbors=40.0, atomic_numbers=z_table.zs, correlation=2,
        gate=torch.nn.functional.silu, use_reduced_cg=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=60)
    parser.add_argument("--capacity", type=int, default=300, help="atoms per bin")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--cutoff", type=float, default=4.5)
    parser.add_argument("--num-replicas", type=int, default=None)
    parser.add_argument("--rank", type=int, default=None)
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        torch.distributed.init_process_group("gloo")
    torch.manual_seed(0)
    frames = structures(args.graphs, seed=0)  # identical on every rank
    z_table = tools.AtomicNumberTable([28, 29])
    dataset = [data.AtomicData.from_config(data.config_from_atoms(a, KEYS), z_table=z_table,
                                           cutoff=args.cutoff) for a in frames]
    sampler = DistributedBinPackSampler([len(a) for a in frames], args.capacity,
                                        args.num_replicas, args.rank, seed=0, with_weights=True)
    loader = DataLoader(PaddingWeightedDataset(dataset), batch_sampler=sampler,
                        collate_fn=Collater(follow_batch=[None], exclude_keys=[None]))
    model = tiny_mace(z_table, args.cutoff)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
    loss_fn = modules.WeightedEnergyForcesLoss(energy_weight=1.0, forces_weight=10.0)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new plan from (seed, epoch), the same on every rank
        for step, batch in enumerate(loader):
            out = model(batch.to_dict(), training=True, compute_force=True)
            loss = loss_fn(batch, out)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"rank {sampler.rank}/{sampler.num_replicas} epoch {epoch} step {step}: "
                  f"{batch.num_graphs} graphs, {int(batch.ptr[-1])} atoms, weights "
                  f"{batch.weight.tolist()}, loss {loss.item():.4f}", flush=True)
        # a checkpoint would store this (steps_done = steps trained, for a resume mid-epoch)
        print(f"rank {sampler.rank} sampler state: {sampler.state_dict(steps_done=step + 1)}")
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
