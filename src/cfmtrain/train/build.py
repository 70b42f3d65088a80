"""Everything one training run holds: data sets, model (fused by variant), DDP wrapper, Adam with
mace-torch's parameter groups, LR scheduler, EMA and the batch sampler.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch_ema import ExponentialMovingAverage

from cfmtrain.balance.pack import packing_backend
from cfmtrain.batches.assembly import assembly_backend
from cfmtrain.batches.data import GraphDataset, make_loader, nested_subset
from cfmtrain.batches.prefetch import BatchLoader
from cfmtrain.graphs.provenance import split_digest
from cfmtrain.graphs.split import check_split_for, read_split
from cfmtrain.graphs.store import GraphStore
from cfmtrain.kernels import fuse_model, kernel_backend
from cfmtrain.ranks.collectives import all_reduce_sum
from cfmtrain.ranks.distenv import LAUNCHED_AT, DistEnv
from cfmtrain.train import model as model_mod
from cfmtrain.train.capacity import Capacity
from cfmtrain.train.config import TrainConfig
from cfmtrain.train.metrics import ErrorSums
from cfmtrain.train.sampling import make_train_sampler

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclasses.dataclass
class Run:
    """The state of one training process (one rank)."""

    cfg: TrainConfig
    env: DistEnv
    device: torch.device
    out: Path
    store: GraphStore
    parts: dict[str, np.ndarray]  # store indices of train (nested subset), valid, test
    stats: model_mod.DataStats
    model: torch.nn.Module  # the trained module (fused kernels in kernel variants)
    ddp: torch.nn.Module  # DDP around model, or model itself on one rank
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: object
    ema: ExponentialMovingAverage | None
    sampler: object
    train_set: GraphDataset
    valid_set: GraphDataset
    test_set: GraphDataset
    kernel_backend: str
    capacity: Capacity
    data: dict = dataclasses.field(default_factory=dict)  # data_identity of store and split
    dataset: str = ""
    global_step: int = 0
    train_errors: ErrorSums = dataclasses.field(default_factory=ErrorSums)
    # start-up and per-epoch timings on this rank (seconds; `*_at` are Unix times)
    timeline: dict = dataclasses.field(default_factory=dict)
    # the code that trained the run since which step (resume.code_versions; set by runner.begin)
    code_versions: list[dict] = dataclasses.field(default_factory=list)
    # how the host assembles batches and packs them: compiled, or (no extension, a GPU) Python
    host_backend: dict = dataclasses.field(default_factory=dict)

    def make_loader(self, dataset: GraphDataset, batch_sampler) -> BatchLoader:
        """Batches assembled from the store's arrays, prefetched per the configured workers
        (auto from this rank's CPUs), for the run's device (page-locked for a CUDA one)."""
        return make_loader(dataset, batch_sampler, self.cfg.batch.num_workers,
                           self.cfg.batch.pin_memory, self.env.cpus_per_task, self.device)


def load_parts(store: GraphStore, split_path: Path, cfg: TrainConfig,
               main: bool = True) -> dict[str, np.ndarray]:
    """The shared split (checked to be this store's), with the training part cut to the nested
    `train_fraction` and the validation and test parts to the nested `eval_fraction` (each
    subset kept in proportion). An empty validation or test part is said on the `main` rank."""
    parts, meta = read_split(split_path)
    check_split_for(split_path, meta, store.fingerprint)
    for name, idx in parts.items():
        if len(idx) and (idx.min() < 0 or idx.max() >= len(store)):
            raise ValueError(f"{split_path}: {name} indices out of range for the {len(store)} "
                             f"graphs of {store.path}")
    if not len(parts["train"]):
        raise ValueError(f"{split_path}: the training split is empty")
    parts["train"] = nested_subset(parts["train"], store.subsets, cfg.train_fraction, cfg.seed)
    for name in ("valid", "test"):
        if len(parts[name]):
            parts[name] = nested_subset(parts[name], store.subsets, cfg.eval_fraction, cfg.seed)
        elif main:
            print(f"warning: {split_path} holds no {name} graphs (its {name} fraction is 0): "
                  f"the {name} MAEs are not measured (null in summary.json)", file=sys.stderr)
    return parts


def make_model(cfg: TrainConfig, store: GraphStore, parts: dict, env: DistEnv,
               stats: dict | None) -> tuple[torch.nn.Module, model_mod.DataStats]:
    """A new ScaleShiftMACE from (saved or computed) statistics, or the user's model."""
    if cfg.model.init_model:
        model = model_mod.load_user_model(cfg.model.init_model, store.cutoff)
        return model, model_mod.stats_of(model)
    r_max = cfg.model.r_max or store.cutoff
    if r_max > store.cutoff + 1e-9:
        raise ValueError(f"config model.r_max {r_max} exceeds the store's cutoff "
                         f"{store.cutoff} ({store.path}); the edges were built for the cutoff")
    if stats is None:
        data_stats = training_stats(cfg, store, parts, env)
    else:
        data_stats = model_mod.DataStats(**stats)
    return model_mod.build_model(cfg.model, data_stats, r_max, cfg.seed), data_stats


def training_stats(cfg: TrainConfig, store: GraphStore, parts: dict,
                   env: DistEnv | None = None) -> model_mod.DataStats:
    """The training graphs' statistics (E0s, mean, scale, neighbours) for config `cfg`, with
    the elements of the validation and test graphs; each rank of `env` reads a share."""
    env = env or DistEnv()
    others = np.concatenate([parts["valid"], parts["test"]])
    extra = model_mod.store_elements(store, others[env.rank::env.world_size])
    extra = _union_over_ranks(extra, env.world_size)
    fixed = model_mod.fixed_e0s(cfg.model.e0s_fixed) if cfg.model.e0s_fixed else None
    return model_mod.compute_stats(store, parts["train"], extra, env.rank, env.world_size,
                                   e0s=cfg.model.e0s, fixed=fixed)


def _union_over_ranks(zs: np.ndarray, world_size: int) -> np.ndarray:
    mask = torch.zeros(model_mod.MAX_Z, dtype=torch.float64)
    mask[torch.as_tensor(zs, dtype=torch.long)] = 1
    if world_size > 1:
        mask = all_reduce_sum(mask)
    return np.flatnonzero(mask.numpy() > 0)


def param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict]:
    """mace-torch's groups: weight decay on the interactions' linear weights and the products."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        interaction_linear = name.startswith("interactions.") and (
            "linear.weight" in name or "skip_tp_full.weight" in name)
        (decay if interaction_linear or name.startswith("products.") else no_decay).append(p)
    return [{"params": decay, "weight_decay": cfg.optim.weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def make_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer):
    """ReduceLROnPlateau on the validation loss (mace-torch's default), exponential, or none."""
    o = cfg.optim
    if o.scheduler == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=o.lr_factor,
                                                          patience=o.patience)
    gamma = o.gamma if o.scheduler == "exponential" else 1.0
    return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=gamma)


def data_identity(store: GraphStore, split_path: Path) -> dict[str, str]:
    """What a run trains on, for checkpoints: the store's fingerprint and the split's."""
    return {"store": store.fingerprint, "split": split_digest(read_split(split_path)[0])}


def open_store(graphs: Path | list[Path], cutoff: float | None = None) -> GraphStore:
    """The graph store, checked to be built at `cutoff` (the config's) when given."""
    store = GraphStore(graphs)
    if cutoff is not None and abs(store.cutoff - cutoff) > 1e-9:
        raise ValueError(f"{store.path}: graphs built at cutoff {store.cutoff} A, the config "
                         f"asks for {cutoff} A; rebuild the graphs (snakemake: the graphs target)")
    return store


def build_run(cfg: TrainConfig, graphs: Path | list[Path], split: Path, out: Path, env: DistEnv,
              device: torch.device, stats: dict | None = None,
              cutoff: float | None = None) -> Run:
    """Build every part of a run on this rank (collectives inside: call on every rank)."""
    dtype = DTYPES[cfg.model.dtype]
    torch.set_default_dtype(dtype)
    t0 = time.perf_counter()
    timeline = {"build_at": time.time()}
    # `cfmtrain launch`'s clock for the process's first run (a later repeat's is its build)
    timeline["launched_at"] = float(os.environ.pop(LAUNCHED_AT, None) or timeline["build_at"])
    store = open_store(graphs, cutoff)
    timeline["open_s"] = time.perf_counter() - t0
    parts = load_parts(store, split, cfg, env.rank == 0)
    timeline["split_s"] = time.perf_counter() - t0 - timeline["open_s"]
    t1 = time.perf_counter()
    model, data_stats = make_model(cfg, store, parts, env, stats)
    timeline["statistics_s"] = time.perf_counter() - t1  # and the model's construction
    model = model.to(dtype).to(device)
    backend = "e3nn (mace-torch)"
    if cfg.fused:  # after the move: fuse_model picks the backend from the model's device
        model = fuse_model(model)
        backend = ", ".join(f"{k}={v}" for k, v in kernel_backend(model).items())
    ddp = model
    if env.world_size > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(param_groups(model, cfg), lr=cfg.optim.lr,
                                 amsgrad=cfg.optim.amsgrad)
    ema = (ExponentialMovingAverage(params, decay=cfg.optim.ema_decay)
           if cfg.optim.ema_decay > 0 else None)
    z_table = model_mod.z_table_of(model)
    r_max = float(model.r_max)
    use_stress = cfg.optim.stress_weight > 0
    sets = {name: GraphDataset(store, idx, z_table, r_max, dtype, use_stress)
            for name, idx in parts.items()}
    # compiled where built; a GPU run without the extension: the Python twins (said once)
    host = {"batch_assembly": assembly_backend(device), "packing": packing_backend(device)}
    sampler, capacity = make_train_sampler(cfg, sets["train"].num_atoms,
                                           sets["train"].num_edges, env.rank, env.world_size)
    timeline["build_s"] = time.perf_counter() - t0
    return Run(cfg=cfg, env=env, device=device, out=out, store=store, parts=parts,
               stats=data_stats, model=model, ddp=ddp, params=params, optimizer=optimizer,
               scheduler=make_scheduler(cfg, optimizer), ema=ema, sampler=sampler,
               train_set=sets["train"], valid_set=sets["valid"], test_set=sets["test"],
               kernel_backend=backend, capacity=capacity, data=data_identity(store, split),
               timeline=timeline, host_backend=host)
