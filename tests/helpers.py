"""Helpers shared by the test modules (no tests here): small EMT-labelled graph stores and a
one-rank `cfmtrain train` for the training tests, ports and environments for several ranks,
small mace-torch models and batches for the kernel tests, and written-by-hand result folders for
the simulator, figure and goals tests.

Test modules import them with `from helpers import ...` (pytest puts tests/ on sys.path; a test
module run as a script, as tests/ranks/test_train_dist.py's ranks are, has tests/ there too).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import mace  # noqa: F401  (import mace before e3nn)
import numpy as np
import pandas as pd
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule
from ase.calculators.emt import EMT
from e3nn import o3
from mace import data, modules, tools
from mace.modules.irreps_tools import tp_out_irreps_with_instructions
from mace.modules.wrapper_ops import TensorProduct
from mace.tools import torch_geometric

from cfmtrain.graphs.build import atoms_to_graph
from cfmtrain.graphs.split import split_indices
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.measure.group_tables import PairedRecord, RoundRecord, paired_rows, round_rows
from cfmtrain.measure.paired import Rounds
from cfmtrain.simulate.records import StrongRow
from cfmtrain.tables import write_table
from cfmtrain.train import cli
from cfmtrain.train.epochs import EpochRecord
from cfmtrain.train.steps import StepRecord

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# training: a small EMT-labelled store, a tiny model, `cfmtrain train` in this process

CUTOFF = 4.0
TINY = ["model.hidden_irreps=8x0e+8x1o", "model.max_ell=2", "model.correlation=2",
        "model.radial_mlp=[8, 8]", "model.num_bessel=4", "progress=false", "threads=1"]
COMMON = [*TINY, "epochs=2", "batch.graphs_per_batch=3", "measure_straggler=false"]


def emt_frames(n: int, seed: int = 0) -> list[Atoms]:
    """Cu/Ni crystals, alloys (with stress) and non-periodic clusters (without), EMT-labelled."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            atoms, subset = bulk("Cu", "fcc", a=3.6).repeat((1 + i % 2, 1, 1)), "bulk"
        elif kind == 1:
            atoms, subset = bulk("Ni", "fcc", a=3.52, cubic=True), "alloy"
            atoms.numbers[rng.random(len(atoms)) < 0.5] = 29
        else:
            atoms, subset = molecule("CH4"), "cluster"
            atoms.numbers[:] = [29, 28, 28, 28, 28]
            atoms.positions *= 1.8
        atoms.rattle(0.05, seed=seed * 1000 + i)
        atoms.calc = EMT()
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        if atoms.pbc.all():
            atoms.info["REF_stress"] = atoms.get_stress(voigt=False)
        atoms.info["config_type"] = subset
        atoms.calc = None
        frames.append(atoms)
    return frames


def make_store(folder: Path, n: int = 30, seed: int = 0) -> tuple[Path, Path, list[Atoms]]:
    """A one-shard store of `n` EMT frames and its split; returns (store, split, frames)."""
    frames = emt_frames(n, seed)
    graphs = []
    for i, atoms in enumerate(frames):
        graph = atoms_to_graph(atoms, CUTOFF)
        graph["source_index"] = i
        graphs.append(graph)
    folder.mkdir(parents=True, exist_ok=True)
    write_shard(folder / "shard_0000.h5", graphs, cutoff=CUTOFF)
    parts = split_indices(GraphStore(folder).subsets, (0.15, 0.15), 0)
    np.savez(folder / "split.npz", seed=0, **parts)
    return folder, folder / "split.npz", frames


def train(store: Path, split: Path, out: Path, *overrides: str, resume: str | None = None,
          cutoff: float | None = None) -> int:
    """`cfmtrain train` in this process (one rank), restoring global state afterwards;
    `cutoff` is passed as --cutoff (the one the graphs must have been built at)."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--graphs", str(store), "--split", str(split), "--output", str(out),
            *(["--cutoff", str(cutoff)] if cutoff else [])]
    for o in (*COMMON, *overrides):
        argv += ["--set", o]
    if resume:
        argv += ["--resume", resume]
    handler, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    try:
        return cli.run(parser.parse_args(argv))
    finally:
        signal.signal(signal.SIGTERM, handler)
        torch.set_num_threads(threads)
        torch.set_default_dtype(torch.float32)


# ---------------------------------------------------------------------------------------------
# several ranks on this machine

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_"))}
    return {**env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


# ---------------------------------------------------------------------------------------------
# kernels: small mace-torch models, batches and tensor products

Z = [29, 28]


@pytest.fixture(autouse=True, scope="module")
def small_and_serial():
    """Tiny problems: one thread (OpenMP spin-waits cost seconds on a shared 2-core machine) and
    no TorchScript compilation of e3nn's generated code (numerically the same modules).

    Autouse in each module that imports it (`from helpers import small_and_serial`), only there.
    """
    import e3nn

    threads, options = torch.get_num_threads(), e3nn.get_optimization_defaults()
    torch.set_num_threads(1)
    e3nn.set_optimization_defaults(jit_script_fx=False)
    yield
    torch.set_num_threads(threads)
    e3nn.set_optimization_defaults(**options)


def make_tp(hidden: str, lmax: int) -> torch.nn.Module:
    """The conv_tp MACE builds for node features `hidden` and spherical harmonics up to lmax."""
    irreps_in, sh = o3.Irreps(hidden), o3.Irreps.spherical_harmonics(lmax)
    target = sh.sort()[0].simplify()
    mid, instructions = tp_out_irreps_with_instructions(irreps_in, sh, target)
    return TensorProduct(irreps_in, sh, mid, instructions=instructions, shared_weights=False,
                         internal_weights=False)


def small_model(cls=modules.MACE, reduced=False, hidden="8x0e+8x1o", max_ell=2, seed=0):
    """A small 2-layer, correlation-3 model in float64 with perturbed (non-initial) weights."""
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        kwargs = dict(
            r_max=4.5, num_bessel=8, num_polynomial_cutoff=5, max_ell=max_ell,
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            num_interactions=2, num_elements=len(Z), hidden_irreps=o3.Irreps(hidden),
            MLP_irreps=o3.Irreps("16x0e"), atomic_energies=np.array([-1.0, -2.0]),
            avg_num_neighbors=8.0, atomic_numbers=Z, correlation=3,
            gate=torch.nn.functional.silu, use_reduced_cg=reduced)
        if cls is modules.ScaleShiftMACE:
            kwargs.update(atomic_inter_scale=1.3, atomic_inter_shift=0.1)
        model = cls(**kwargs)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p))
    return model


def atoms(num_cells=(2, 2, 2)):
    structure = bulk("Cu", "fcc", a=3.6, cubic=True) * num_cells
    structure.numbers[::3] = 28
    structure.rattle(0.1, seed=1)
    return structure


def batch_dict(structure, dtype=torch.float64, zs=Z):
    config = data.config_from_atoms(structure)
    item = data.AtomicData.from_config(config, z_table=tools.AtomicNumberTable(zs), cutoff=4.5)
    batch = next(iter(torch_geometric.dataloader.DataLoader([item], batch_size=1)))
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.to_dict().items()}


def energy_forces_grads(model, batch):
    """Energy, forces and the parameter gradients of an energy+forces loss (double backward)."""
    out = model(dict(batch), training=True, compute_force=True)
    loss = out["energy"].pow(2).sum() + out["forces"].pow(2).sum()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]
    return [out["energy"].detach(), out["forces"].detach(), *grads]


def assert_swap_exact_and_round_trips(swap, unswap, attr: str, cls: type, tol: float):
    """`swap` puts `cls` at every interaction's `attr` of a small model: same state_dict keys,
    energy, forces and parameter gradients within `tol` of mace-torch's, also after torch.save
    and torch.load; `unswap` gives the original modules back."""
    model = small_model()
    batch = batch_dict(atoms())
    expected = energy_forces_grads(model, batch)
    keys = list(model.state_dict())
    originals = [getattr(block, attr) for block in model.interactions]
    assert swap(model) == len(originals) == 2
    assert list(model.state_dict()) == keys
    for got, want in zip(energy_forces_grads(model, batch), expected, strict=True):
        assert rel_err(got, want) < tol
    buffer = io.BytesIO()
    torch.save(model, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert all(isinstance(getattr(b, attr), cls) for b in loaded.interactions)
    for got, want in zip(energy_forces_grads(loaded, batch), expected, strict=True):
        assert rel_err(got, want) < tol
    unswap(model)
    assert [getattr(block, attr) for block in model.interactions] == originals
    assert list(model.state_dict()) == keys


def rel_err(a, b):
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


# ---------------------------------------------------------------------------------------------
# downloads

FAST = {"retries": 3, "backoff": 0.0, "timeout": 10.0, "progress": False}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def workflow_clone(folder: Path) -> Path:
    """A stand-in for a fresh clone at the new `folder`, for Snakemake runs: the workflow,
    profiles and default config linked in, a config folder of its own."""
    folder.mkdir(parents=True)
    for name in ("Snakefile", "workflow", "profiles"):
        (folder / name).symlink_to(REPO / name)
    (folder / "config").mkdir()
    (folder / "config/config.yaml").symlink_to(REPO / "config/config.yaml")
    return folder


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size: str):
    """A really small disk: a tmpfs of `size` (mount's words, "1m") at the new `folder`,
    unmounted after; the test is skipped where mounting needs privileges it lacks."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill `disk` but for about `leave` bytes; the filler file."""
    filler = disk / "filler"
    info = os.statvfs(disk)
    with open(filler, "wb") as f:
        f.write(b"\0" * max(info.f_bavail * info.f_frsize - leave, 0))
    return filler


# ---------------------------------------------------------------------------------------------
# result folders written by hand: training runs, cell summaries, simulator tables, goals

# steps.csv's columns without the CPU times (an older version's: readers take NaN)
STEP_FIELDS = [c for c in StepRecord.columns() if c not in StepRecord.OPTIONAL]


def write_run(root: Path, dataset: str, variant: str, ranks: int, *, cost=(0.05, 2e-3, 1e-4),
              epochs: int = 3, steps_per_epoch: int = 6, noise: float = 0.0, seed: int = 0,
              allreduce_s: float = 0.01, data_s: float = 0.002, optim_s: float = 0.0,
              balanced: bool = False) -> Path:
    """A run folder results/train/<dataset>/<variant>/r<ranks> under root in the format
    `cfmtrain train` writes (summary.json, steps.csv, epochs.csv), with step times from a known
    linear cost, for the simulator and figure tests; returns the folder."""
    rng = np.random.default_rng(seed)
    folder = root / "results" / "train" / dataset / variant / f"r{ranks}"
    folder.mkdir(parents=True, exist_ok=True)
    rows, epoch_rows, step = [], [], 0
    for epoch in range(epochs):
        wall = 0.0
        for _ in range(steps_per_epoch):
            graphs = np.full(ranks, 8)
            atoms = (np.full(ranks, 600) + rng.integers(-20, 20, ranks) if balanced
                     else rng.integers(50, 1200, ranks))
            edges = np.rint(atoms * rng.uniform(20, 40, ranks)).astype(np.int64)
            work = cost[0] + cost[1] * atoms + cost[2] * edges
            work = work * (1 + noise * rng.standard_normal(ranks))
            compute = work - optim_s
            own = data_s + work
            wait = own.max() - own
            for r in range(ranks):
                rows.append({"epoch": epoch, "step": step, "rank": r, "graphs": graphs[r],
                             "atoms": atoms[r], "edges": int(edges[r]), "data_s": data_s,
                             "compute_s": compute[r], "wait_s": wait[r] if ranks > 1 else 0.0,
                             "allreduce_s": allreduce_s if ranks > 1 else 0.0,
                             "optim_s": optim_s,
                             "step_s": own.max() + (allreduce_s if ranks > 1 else 0.0),
                             "loss": 10.0 / (1 + step)})
            wall += own.max() + (allreduce_s if ranks > 1 else 0.0)
            step += 1
        epoch_rows.append({"epoch": epoch, "wall_s": wall, "train_loss": 5.0 / (1 + epoch),
                           "valid_loss": 6.0 / (1 + epoch)})
    pd.DataFrame(rows, columns=STEP_FIELDS).to_csv(folder / "steps.csv", index=False)
    pd.DataFrame(epoch_rows, columns=EpochRecord.columns()).to_csv(folder / "epochs.csv",
                                                                   index=False)
    times = [e["wall_s"] for e in epoch_rows]
    summary = {"variant": variant, "ranks": ranks, "epochs": epochs,
               "epoch_time_s": float(np.mean(times[1:] if len(times) > 1 else times)),
               "final_train_loss": epoch_rows[-1]["train_loss"],
               "provenance": {"threads": 1, "dtype": "float32"}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def write_group(root: Path, dataset: str, ranks: int, costs: dict[str, tuple], *,
                shift: float = 1.0, balanced: tuple[str, ...] = (), seed: int = 0,
                **run_kwargs) -> Path:
    """A group folder results/train/<dataset>/r<ranks> under root as `cfmtrain rounds` writes
    it: a run per variant of `costs` (write_run's known cost laws, the data set in its
    summary) and paired.csv, each variant's ratio to the first one that of their mean epochs
    times `shift`, with a 3% range; returns the folder."""
    import shutil

    group = root / "results" / "train" / dataset / f"r{ranks}"
    times = {}
    for k, (variant, cost) in enumerate(costs.items()):
        run = write_run(root / "runs", dataset, variant, ranks, cost=cost, seed=seed + k,
                        balanced=variant in balanced, **run_kwargs)
        shutil.move(run, group / variant)
        summary = json.loads((group / variant / "summary.json").read_text())
        (group / variant / "summary.json").write_text(json.dumps({**summary,
                                                                  "dataset": dataset}))
        times[variant] = pd.read_csv(group / variant / "epochs.csv").wall_s.to_numpy()[1:]
    reference = next(iter(costs))
    rows = []
    for variant in costs:
        ratio = (1.0 if variant == reference else  # a group replays one plan: epochs alike
                 float(np.mean(times[reference]) / np.mean(times[variant])) * shift)
        rows.append(PairedRecord(dataset, ranks, variant, reference,
                                 float(np.median(times[variant])), ratio, ratio * 0.97,
                                 ratio * 1.03, len(times[variant]), 0.06, 0))
    write_table(group / "paired.csv", rows, PairedRecord)
    return group


def write_store(path: Path, graphs_per_subset: int = 3, seed: int = 0) -> Path:
    """A small graph store (one shard) with a few graphs in each of mini's subsets. Positions
    and labels are placeholders: only the per-graph size table matters to its users."""
    from cfmtrain.sources.mini import SUBSETS

    rng = np.random.default_rng(seed)
    graphs = []
    for name in SUBSETS:
        for k in range(graphs_per_subset):
            n = int(rng.integers(1, 40))
            e = int(n * rng.uniform(5, 40))
            graphs.append({"positions": rng.normal(size=(n, 3)), "numbers": np.full(n, 29),
                           "forces": np.zeros((n, 3)), "unit_shifts": np.zeros((e, 3), int),
                           "edge_index": rng.integers(0, n, (2, e)), "cell": np.eye(3) * 10,
                           "pbc": np.array([True] * 3), "energy": -1.0 * n, "subset": name,
                           "source_index": k})
    path.mkdir(parents=True, exist_ok=True)
    write_shard(path / "shard_0000.h5", graphs, cutoff=4.5)
    return path


def summary(root, dataset: str, variant: str, ranks: int, median: float,
            spread: tuple[float, float] | None = None, contended: bool = False):
    """A cell's summary.json: with `spread` the format of `cfmtrain cell` (three repeats whose
    median is `median`, min and max `spread`), without it a single run's older format."""
    folder = root / "results" / "train" / dataset / variant / f"r{ranks}"
    folder.mkdir(parents=True, exist_ok=True)
    data = {"variant": variant, "ranks": ranks, "epoch_time_s": median}
    if spread is not None:
        times = [spread[0], median, spread[1]]
        data.update(epoch_time_min_s=spread[0], epoch_time_max_s=spread[1], contended=contended,
                    repeats=[{"repeat": k + 1, "epoch_time_s": t, "contended": contended and k == 2}
                             for k, t in enumerate(times)])
    (folder / "summary.json").write_text(json.dumps(data))
    return folder / "summary.json"


def write_simulated(path, supported=None, reason="", band=True):
    rows = []
    for variant, base in (("baseline", 100.0), ("both", 20.0)):
        for ranks, share in ((16, 1.0), (740, 0.05)):
            t = base * share
            row = {"run": variant, "variant": variant, "ranks": ranks, "epoch_s": t,
                   "strategy": "x"}
            if band:
                row.update(epoch_s_low=0.9 * t if variant == "baseline" else 0.75 * t,
                           epoch_s_high=1.1 * t if variant == "baseline" else 1.5 * t)
            if supported is not None:
                row.update(supported=supported, unsupported_reason=reason)
            rows.append(row)
    rows.append({**rows[-1], "run": "lpt (both cost)"})  # an extra strategy row: left out
    # the other columns empty; a table from before the band or the verdict lacks those
    left_out = (() if band else ("epoch_s_low", "epoch_s_high")) + (
        () if supported is not None else ("case", "supported", "unsupported_reason"))
    columns = [c for c in StrongRow.columns() if c not in left_out]
    pd.DataFrame(rows, columns=columns).to_csv(path, index=False)
    return path


# median epoch seconds per (data set, ranks, variant): the order and >= 3x hold
GOOD = {("mini_s", 1): {"baseline": 12.0, "balancer": 11.5, "kernel": 3.4, "both": 3.5},
        ("mini_s", 2): {"baseline": 9.0, "balancer": 7.0, "kernel": 2.8, "both": 2.1},
        ("mini_m", 2): {"baseline": 18.0, "balancer": 12.5, "kernel": 5.9, "both": 3.9}}
DRIFT = (1.0, 1.3, 0.8, 1.5, 1.1)  # the host's speed per round: cancels in every ratio
NOISE = (-1.0, -0.5, 0.0, 0.5, 1.0)  # a variant's own wobble per round, times its width


def goal_rounds(times: dict[str, float], width: float = 0.02, widths=None):
    """Paired rounds of one group (measure.paired.Rounds): in round r the k-th variant's epoch
    time is its median times the round's host drift times (1 + NOISE[(r + k) % 5] * its
    width; the baseline's width 0), so each ratio over the baseline has median exactly
    median_b / median_v, and the other ratios wobble too."""
    names = tuple(times)
    seconds = np.array([[times[v] * drift * (1 + NOISE[(r + k) % len(NOISE)] * (
        0.0 if v == "baseline" else (widths or {}).get(v, width)))
        for k, v in enumerate(names)] for r, drift in enumerate(DRIFT)])
    order = np.tile(np.arange(len(names)), (len(DRIFT), 1))
    return Rounds(names, seconds, seconds, seconds, order, seed=0)


def write_goal_run(root, times=GOOD, width=0.02, widths=None):
    """One run's results folder for `cfmtrain goals`: per group of `times`, the paired.csv and
    rounds.csv that `cfmtrain rounds` writes for goal_rounds; `widths` maps (data set, ranks)
    to per-variant widths."""
    for (dataset, ranks), variants in times.items():
        rounds = goal_rounds(variants, width, (widths or {}).get((dataset, ranks)))
        folder = root / "train" / dataset / f"r{ranks}"
        folder.mkdir(parents=True, exist_ok=True)
        write_table(folder / "rounds.csv", round_rows(rounds), RoundRecord)
        write_table(folder / "paired.csv", paired_rows(rounds, dataset, ranks), PairedRecord)
    return root
