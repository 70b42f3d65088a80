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
from cfmtrain.train import fine_tune
from cfmtrain.train import model as model_mod
from cfmtrain.train.capacity import Capacity
from cfmtrain.train.config import OptimConfig, TrainConfig
from cfmtrain.train.metrics import ErrorSums
from cfmtrain.train.sampling import make_train_sampler
from cfmtrain.train.selection import Selection

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
    # the loss weights of the epoch training now (None: cfg.optim's; stage two's: selection)
    loss_weights: OptimConfig | None = None
    # the best model, early stopping and stage two (train.selection; saved in checkpoints)
    selection: Selection = dataclasses.field(default_factory=Selection)
    # the replay set's validation graphs (None without replay) and its errors before training
    replay_set: GraphDataset | None = None
    replay_before: dict | None = None
    replay_source: str = ""

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
               stats: dict | None, sources: dict[str, np.ndarray] | None = None,
               own: int | None = None) -> tuple[torch.nn.Module, model_mod.DataStats]:
    """A new ScaleShiftMACE from (saved or computed) statistics, or the user's model to
    fine-tune, checked against the data (`sources`: what -> store indices; default: every
    part) and given its E0s (train.fine_tune; `own`: the store's graphs below it are the
    data's, the others replay graphs)."""
    if cfg.model.init_model:
        return fine_tune_model(cfg, store, parts, env, sources, own)
    r_max = cfg.model.r_max or store.cutoff
    if r_max > store.cutoff + 1e-9:
        raise ValueError(f"config model.r_max {r_max} exceeds the store's cutoff "
                         f"{store.cutoff} ({store.path}); the edges were built for the cutoff")
    if stats is None:
        data_stats = training_stats(cfg, store, parts, env)
    else:
        data_stats = model_mod.DataStats(**stats)
    return model_mod.build_model(cfg.model, data_stats, r_max, cfg.seed), data_stats


def fine_tune_model(cfg: TrainConfig, store: GraphStore, parts: dict, env: DistEnv,
                    sources: dict[str, np.ndarray] | None = None, own: int | None = None
                    ) -> tuple[torch.nn.Module, model_mod.DataStats]:
    """config model.init_model loaded, its heads, cutoff and elements checked against the
    data (every part of `sources`: what -> store indices) and its E0s per model.init_e0s,
    estimated or fitted on the data's own training graphs (store indices below `own`)."""
    path = cfg.model.init_model
    model = model_mod.load_user_model(path, store.cutoff)
    fine_tune.check_heads(path, model)
    fine_tune.check_cutoff(path, model, store.cutoff)
    sources = sources or {f"{store.path}": np.concatenate(list(parts.values()))}
    found = {where: _union_over_ranks(model_mod.store_elements(
        store, np.asarray(idx)[env.rank::env.world_size]), env.world_size)
        for where, idx in sources.items()}
    fine_tune.check_elements(path, model, found)
    zs = sorted(set().union(*(set(z.tolist()) for z in found.values())))

    train = parts["train"] if own is None else parts["train"][parts["train"] < own]

    def fitted() -> dict[int, float]:
        stats = training_stats(dataclasses.replace(cfg, model=dataclasses.replace(
            cfg.model, e0s="fit" if cfg.model.e0s == "fit" else "average")), store,
            {**parts, "train": train}, env)
        present = set(_union_over_ranks(model_mod.store_elements(
            store, train[env.rank::env.world_size]), env.world_size).tolist())
        return {z: e for z, e in zip(stats.zs, stats.e0s, strict=True) if z in present}

    def estimated() -> dict[int, float]:
        model.to(DTYPES[cfg.model.dtype])
        with torch.no_grad():
            return fine_tune.estimate_e0s(model, store, train, env.rank, env.world_size,
                                          cfg.batch.valid_graphs_per_batch)

    method = fine_tune.fine_tune_e0s(path, model, cfg.model, zs, fitted, estimated)
    return model, dataclasses.replace(model_mod.stats_of(model), e0s_method=method)


def training_stats(cfg: TrainConfig, store: GraphStore, parts: dict,
                   env: DistEnv | None = None) -> model_mod.DataStats:
    """The training graphs' statistics (E0s, mean, scale, neighbours) for config `cfg`, with
    the elements of every other part (validation, test, a replay set's validation); each rank
    of `env` reads a share."""
    env = env or DistEnv()
    others = np.concatenate([idx for name, idx in parts.items() if name != "train"])
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


def data_identity(store: GraphStore, split_path: Path, replay_split: Path | None = None
                  ) -> dict[str, str]:
    """What a run trains on, for checkpoints: the store's fingerprint and the split's (with
    replay graphs: the joint store's, and the replay split's too)."""
    identity = {"store": store.fingerprint, "split": split_digest(read_split(split_path)[0])}
    if replay_split is not None:
        identity["replay_split"] = split_digest(read_split(replay_split)[0])
    return identity


Replay = tuple[list[Path], Path]  # a replay set's graph folders and its split


def _folders(graphs: Path | list[Path]) -> list[Path]:
    return list(graphs) if isinstance(graphs, list | tuple) else [graphs]


def open_stores(graphs: Path | list[Path], cutoff: float | None, replay: Replay | None
                ) -> tuple[GraphStore, GraphStore | None]:
    """The data's store and the replay set's (None without replay; its split checked against
    it); their cutoffs must agree."""
    own = open_store(graphs, cutoff)
    if replay is None:
        return own, None
    folders, split = replay
    other = open_store(folders if len(folders) > 1 else folders[0], cutoff)
    if abs(other.cutoff - own.cutoff) > 1e-9:
        raise ValueError(f"{other.path}: replay graphs built at cutoff {other.cutoff} Å, the "
                         f"data's ({own.path}) at {own.cutoff} Å; build both at one cutoff")
    check_split_for(split, read_split(split)[1], other.fingerprint)
    return own, other


def data_of(graphs: Path | list[Path], split: Path, cutoff: float | None = None,
            replay: Replay | None = None) -> dict[str, str]:
    """data_identity of the run build_run would build on these graphs, split and replay set."""
    own, other = open_stores(graphs, cutoff, replay)
    store = own if other is None else GraphStore([*_folders(graphs), *replay[0]])
    return data_identity(store, split, replay[1] if replay else None)


def add_replay(parts: dict[str, np.ndarray], cfg: TrainConfig, own: int, other: GraphStore,
               split: Path, main: bool) -> None:
    """The replay set's training graphs (replay_ratio per training graph, a seeded draw) added
    to the training part, and its validation graphs (nested eval_fraction) as `replay_valid`;
    store indices of the joint store, whose first `own` graphs are the data's."""
    rparts = read_split(split)[0]
    chosen = fine_tune.replay_draw(rparts["train"], len(parts["train"]), cfg.replay_ratio,
                                   cfg.seed)
    valid = (nested_subset(rparts["valid"], other.subsets, cfg.eval_fraction, cfg.seed)
             if len(rparts["valid"]) else rparts["valid"])
    if main:
        print(f"replay: {len(chosen)} training graphs of {other.path} mixed into every epoch "
              f"beside the {len(parts['train'])} of the data (replay_ratio {cfg.replay_ratio:g}"
              f"{', all it holds' if len(chosen) == len(rparts['train']) else ''}); its "
              f"{len(valid)} validation graphs evaluated before and after", file=sys.stderr)
    parts["train"] = np.concatenate([parts["train"], chosen + own])
    parts["replay_valid"] = valid + own


def open_store(graphs: Path | list[Path], cutoff: float | None = None) -> GraphStore:
    """The graph store, checked to be built at `cutoff` (the config's) when given."""
    store = GraphStore(graphs)
    if cutoff is not None and abs(store.cutoff - cutoff) > 1e-9:
        raise ValueError(f"{store.path}: graphs built at cutoff {store.cutoff} A, the config "
                         f"asks for {cutoff} A; rebuild the graphs (snakemake: the graphs target)")
    return store


def build_run(cfg: TrainConfig, graphs: Path | list[Path], split: Path, out: Path, env: DistEnv,
              device: torch.device, stats: dict | None = None,
              cutoff: float | None = None, replay: Replay | None = None) -> Run:
    """Build every part of a run on this rank (collectives inside: call on every rank);
    `replay`: a replay set's graphs and split, mixed into the training graphs."""
    dtype = DTYPES[cfg.model.dtype]
    torch.set_default_dtype(dtype)
    t0 = time.perf_counter()
    timeline = {"build_at": time.time()}
    # `cfmtrain launch`'s clock for the process's first run (a later repeat's is its build)
    timeline["launched_at"] = float(os.environ.pop(LAUNCHED_AT, None) or timeline["build_at"])
    own, other = open_stores(graphs, cutoff, replay)
    timeline["open_s"] = time.perf_counter() - t0
    parts = load_parts(own, split, cfg, env.rank == 0)
    sources = {str(own.path): np.concatenate(list(parts.values()))}
    store = own
    if other is not None:  # one store, the data's graphs first: their indices are the split's
        store = GraphStore([*_folders(graphs), *replay[0]])
        add_replay(parts, cfg, len(own), other, replay[1], env.rank == 0)
        sources[f"the replay graphs of {other.path}"] = np.concatenate(
            [parts["train"][parts["train"] >= len(own)], parts["replay_valid"]])
    timeline["split_s"] = time.perf_counter() - t0 - timeline["open_s"]
    t1 = time.perf_counter()
    model, data_stats = make_model(cfg, store, parts, env, stats, sources, len(own))
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
               kernel_backend=backend, capacity=capacity,
               data=data_identity(store, split, replay[1] if replay else None),
               timeline=timeline, host_backend=host, replay_set=sets.get("replay_valid"),
               replay_source=str(other.path) if other is not None else "")
