"""The typed training configuration: dataclasses with the paper's defaults, validated overrides.

Unknown keys, values of the wrong type and values out of range are errors that name the key;
command-line values (`--set KEY=VALUE`) are read by the key's declared type. The config is saved
as plain data in every checkpoint and results folder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from cfmtrain import typed
from cfmtrain.paper import BASELINE, VARIANTS, variant
from cfmtrain.typed import ConfigError, apply

Variant = Literal[VARIANTS]  # Literal of a tuple: the same as Literal of its items


@dataclasses.dataclass
class ModelConfig:
    """ScaleShiftMACE hyper-parameters; the defaults are the paper's model."""

    num_interactions: int = 2  # message-passing layers
    hidden_irreps: str = "128x0e+128x1o"  # node features (e3nn irreps): channels and their l
    max_ell: int = 3  # highest l of the edges' spherical harmonics
    correlation: int = 3  # body order - 1 of the symmetric contraction
    num_bessel: int = 8  # radial Bessel functions per edge
    num_polynomial_cutoff: int = 5  # order of the smooth polynomial envelope at the cutoff
    mlp_irreps: str = "16x0e"  # hidden irreps of the last layer's readout MLP
    # hidden widths of the MLP from the radial basis to the per-edge weights
    radial_mlp: list[int] = dataclasses.field(default_factory=lambda: [64, 64, 64])
    use_reduced_cg: bool = False  # the reduced Clebsch-Gordan basis (cuequivariance's)
    r_max: float | None = None  # None: the graph store's cutoff
    init_model: str | None = None  # a mace-torch .model file to fine-tune (a pickle: runs code)
    # with init_model, the E0s: check (E0s the data gives, model.e0s a mapping or file, must be
    # the model's within 1 meV, else the run is refused naming both), foundation (keep the
    # model's: mace-torch's E0s=foundation), estimated (the model's shifted by a least-squares
    # fit of its energy errors on the training split: mace-torch's E0s=estimated), data (the
    # model's replaced by model.e0s: given, or fit on the training split's energies)
    init_e0s: Literal["check", "foundation", "estimated", "data"] = "check"
    dtype: Literal["float32", "float64"] = "float32"  # of the model's parameters and inputs
    # isolated-atom energies: fit (least squares over the training split), average (mace-torch's),
    # {element symbol or Z: eV}, or a JSON file of such a mapping (an own-data set's e0s.json)
    e0s: dict[str, float] | str = "fit"
    # with e0s fit: elements held at given values ({element: eV}, or JSON files of such
    # mappings: a union's members that give isolated-atom energies); the others are fitted
    e0s_fixed: dict[str, float] | list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class BatchConfig:
    """How graphs become batches: fixed count (baseline, kernel) or Algorithm 1 (balancer, both)."""

    graphs_per_batch: int = 8  # per rank, fixed-count variants (the paper used 6-8)
    # balancer bin capacity in units of `size`; auto: the baseline's steps per epoch (capacity.py)
    capacity: int | Literal["auto"] = "auto"
    size: Literal["atoms", "edges"] = "atoms"  # what a graph weighs in a bin
    valid_graphs_per_batch: int = 8  # per rank, validation and test
    num_workers: int | None = None  # None: auto, a prefetch thread (train.prefetch); N: processes
    pin_memory: bool = False  # page-locked batches, for faster copies to a GPU


@dataclasses.dataclass
class OptimConfig:
    """Loss weights, Adam, EMA and the learning-rate schedule (mace-torch's defaults, lr 0.005)."""

    lr: float = 0.005  # Adam's learning rate
    weight_decay: float = 5e-7  # on the parameter groups mace-torch decays
    amsgrad: bool = True  # Adam's AMSGrad variant
    ema_decay: float = 0.99  # 0 disables the exponential moving average
    # learning rate: cut by lr_factor after `patience` validations without gain, times gamma
    # every epoch, or constant
    scheduler: Literal["plateau", "exponential", "none"] = "plateau"
    lr_factor: float = 0.8  # plateau: the factor of each cut
    patience: int = 50  # plateau: validations without gain before a cut
    gamma: float = 0.9993  # exponential: the factor per epoch
    clip_grad: float = 10.0  # 0 disables clipping
    energy_weight: float = 1.0  # of the energy per atom in the loss
    forces_weight: float = 100.0  # of the forces in the loss
    stress_weight: float = 0.0  # > 0 trains on stress where the data has it
    # what a step's loss is divided by: its own graph and atom counts (step: mace-torch's), or
    # the epoch's mean counts per step (epoch: every graph and atom weighs the same whichever
    # batch it lands in); auto: epoch for balanced batches, whose counts vary by design (a step
    # of two 128-atom cells would weigh each cell's energy 8x that of a molecule in a step of 16)
    loss_normalization: Literal["auto", "step", "epoch"] = "auto"


@dataclasses.dataclass
class StageTwoConfig:
    """mace-torch's Stage Two (`--stage_two`, formerly `--swa`): from `start_epoch` on, the loss
    weighs the energy more and the learning rate is lower, to converge the energies late in
    training. The plateau schedule stops there, and the best model (keep_best) and early
    stopping (patience) start afresh among the stage's epochs, as mace-torch's do."""

    enabled: bool = False  # switch to the stage's weights and lr at start_epoch
    start_epoch: int | None = None  # 0-based; null: mace-torch's, max(1, epochs // 4 * 3)
    lr: float = 1e-3  # the learning rate from start_epoch on (mace-torch's --stage_two_lr)
    energy_weight: float = 1000.0  # of the energy per atom (--stage_two_energy_weight)
    forces_weight: float = 100.0  # of the forces (--stage_two_forces_weight)
    # of the stress (--stage_two_stress_weight), where the run trains on it (optim.stress_weight
    # > 0); 0 otherwise
    stress_weight: float = 10.0


@dataclasses.dataclass
class TrainConfig:
    """One training run."""

    variant: Variant = BASELINE.name
    seed: int = 0  # model initialisation, batch order and the nested train/eval subsets
    epochs: int = 2  # passes over the training graphs
    max_steps: int = 0  # stop (with a checkpoint) after this many steps in all; 0 = no limit
    train_fraction: float = 1.0  # nested prefix of the training split (mini_s = 0.25, ...)
    # nested share of the validation and test splits evaluated (timing cells evaluate less)
    eval_fraction: float = 1.0
    # validate after every eval_interval-th epoch and after the last (mace-torch's --eval_interval)
    eval_interval: int = 1
    checkpoint_every: int = 0  # steps between checkpoints; 0 = only at the end
    measure_straggler: bool = True  # barrier after local backward to time the straggler cost
    # one forward and backward on each rank's largest batch before the epochs (train.warmup)
    warm_up: bool = True
    threads: int = 0  # torch threads per rank; 0 = from the allocation
    timeout_s: float = 600.0  # collective timeout: a dead or hung rank fails the others
    progress: bool = True  # a progress bar per epoch on rank 0
    # keep the model of the lowest validation loss (EMA weights) as best.model beside
    # final.model; the test set, test_mae.csv and summary.json are then that model's
    keep_best: bool = False
    # early stopping: stop after this many validations without a lower validation loss (0:
    # never; mace-torch's --patience); with stage_two not yet started, start it instead
    patience: int = 0
    # with replay graphs (`cfmtrain train --replay-graphs`): replay graphs mixed into every
    # epoch per graph of the training split (a fixed, seeded draw from the replay set's training
    # split; all of them if it holds fewer)
    replay_ratio: float = 1.0
    # sample the host's load and a speed probe at the start and end (summary.json's `host`:
    # the ablation's contention measures)
    probe_host: bool = True
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    batch: BatchConfig = dataclasses.field(default_factory=BatchConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    stage_two: StageTwoConfig = dataclasses.field(default_factory=StageTwoConfig)

    @property
    def fused(self) -> bool:
        """True for the variants that swap in the fused CPU kernels."""
        return variant(self.variant).fused

    @property
    def balanced(self) -> bool:
        """True for the variants batched by Algorithm 1."""
        return variant(self.variant).balanced

    @property
    def epoch_normalized(self) -> bool:
        """True if each step's loss is divided by the epoch's mean counts (optim.loss_normalization
        epoch, or auto with balanced batches), False for the step's own (mace-torch's)."""
        mode = self.optim.loss_normalization
        return mode == "epoch" or (mode == "auto" and self.balanced)


# Range of every numeric key: (test, what the value must be). Lists are checked per entry;
# None (model.r_max: the store's cutoff) is not a number and passes.
RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "seed": (lambda v: v >= 0, ">= 0"),
    "epochs": (lambda v: v >= 1, ">= 1"),
    "max_steps": (lambda v: v >= 0, ">= 0"),
    "train_fraction": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "eval_fraction": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "checkpoint_every": (lambda v: v >= 0, ">= 0"),
    "eval_interval": (lambda v: v >= 1, ">= 1"),
    "threads": (lambda v: v >= 0, ">= 0"),
    "timeout_s": (lambda v: v > 0, "> 0"),
    "model.num_interactions": (lambda v: v >= 1, ">= 1"),
    "model.max_ell": (lambda v: v >= 0, ">= 0"),
    "model.correlation": (lambda v: v >= 1, ">= 1"),
    "model.num_bessel": (lambda v: v >= 1, ">= 1"),
    "model.num_polynomial_cutoff": (lambda v: v >= 1, ">= 1"),
    "model.radial_mlp": (lambda v: v >= 1, ">= 1 (each entry)"),
    "model.r_max": (lambda v: v > 0, "> 0"),
    "batch.graphs_per_batch": (lambda v: v >= 1, ">= 1"),
    "batch.capacity": (lambda v: v >= 1, ">= 1"),
    "batch.valid_graphs_per_batch": (lambda v: v >= 1, ">= 1"),
    "batch.num_workers": (lambda v: v >= 0, ">= 0"),
    "optim.lr": (lambda v: v > 0, "> 0"),
    "optim.weight_decay": (lambda v: v >= 0, ">= 0"),
    "optim.ema_decay": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "optim.lr_factor": (lambda v: 0 < v < 1, "in (0, 1)"),
    "optim.patience": (lambda v: v >= 0, ">= 0"),
    "optim.gamma": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "optim.clip_grad": (lambda v: v >= 0, ">= 0"),
    "optim.energy_weight": (lambda v: v >= 0, ">= 0"),
    "optim.forces_weight": (lambda v: v >= 0, ">= 0"),
    "optim.stress_weight": (lambda v: v >= 0, ">= 0"),
    "patience": (lambda v: v >= 0, ">= 0"),
    "replay_ratio": (lambda v: v > 0, "> 0"),
    "stage_two.start_epoch": (lambda v: v >= 0, ">= 0"),
    "stage_two.lr": (lambda v: v > 0, "> 0"),
    "stage_two.energy_weight": (lambda v: v >= 0, ">= 0"),
    "stage_two.forces_weight": (lambda v: v >= 0, ">= 0"),
    "stage_two.stress_weight": (lambda v: v >= 0, ">= 0"),
}


def _get(cfg: TrainConfig, key: str) -> Any:
    """The value of dotted `key` in cfg."""
    value: Any = cfg
    for name in key.split("."):
        value = getattr(value, name)
    return value


def validate(cfg: TrainConfig) -> TrainConfig:
    """Range checks that types cannot express (RANGES, and some loss weight > 0); returns cfg."""
    for key, (ok, expected) in RANGES.items():
        value = _get(cfg, key)
        numbers = [v for v in (value if isinstance(value, list) else [value])
                   if isinstance(v, int | float)]
        if not all(ok(v) for v in numbers):
            raise ConfigError(f"config {key}: {value!r} must be {expected}")
    e0s = cfg.model.e0s
    if isinstance(e0s, str) and e0s not in ("fit", "average") and not e0s.endswith(".json"):
        raise ConfigError(f"config model.e0s: {e0s!r} must be fit, average, a mapping of element "
                          "to eV or a .json file of one")
    fixed = cfg.model.e0s_fixed
    if fixed and e0s != "fit":
        raise ConfigError(f"config model.e0s_fixed: holds elements fixed for a fit of the others, "
                          f"but model.e0s is {e0s!r}; set model.e0s fit or leave e0s_fixed empty")
    if isinstance(fixed, list) and not all(f.endswith(".json") for f in fixed):
        raise ConfigError(f"config model.e0s_fixed: {fixed!r} must be a mapping of element to eV "
                          "or a list of .json files of such mappings")
    o = cfg.optim
    if o.energy_weight == o.forces_weight == o.stress_weight == 0:
        raise ConfigError("config optim.energy_weight, optim.forces_weight, optim.stress_weight: "
                          "all 0, nothing to train on; set one > 0")
    two = cfg.stage_two
    if two.enabled and two.energy_weight == two.forces_weight == 0 and (
            two.stress_weight == 0 or o.stress_weight == 0):
        raise ConfigError("config stage_two.energy_weight, stage_two.forces_weight, "
                          "stage_two.stress_weight: nothing to train on in stage two; set one > 0")
    if two.enabled and two.start_epoch is not None and two.start_epoch >= cfg.epochs:
        raise ConfigError(f"config stage_two.start_epoch: {two.start_epoch} is not within the "
                          f"run's epochs ({cfg.epochs}: 0 to {cfg.epochs - 1}); start it earlier, "
                          "train more epochs, or set stage_two.enabled false")
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """`optim.lr=1e-3` -> (['optim', 'lr'], 0.001); the value is read by the key's declared
    type (cfmtrain.typed.from_text), or as YAML for a mapping or an unknown key (refused
    later)."""
    return typed.parse_override(text, TrainConfig)


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                base: dict | None = None) -> TrainConfig:
    """Defaults, then `base` (a saved config dict), then a YAML file, then KEY=VALUE overrides."""
    cfg = TrainConfig()
    if base:
        apply(cfg, base)
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a training config must be a YAML mapping")
        try:
            apply(cfg, data)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
    for text in overrides:
        apply(cfg, typed.nested(*parse_override(text)))
    return validate(cfg)


# Settings of one call of `cfmtrain train`, not of the run it trains: where the call stops, what
# it prints and writes along the way, how its processes run. None changes the trained weights, so
# they are no part of a run's identity: a resumed run takes them from the call that resumes it
# (its file, --set or the defaults), never from the checkpoint, and they may differ between calls.
PER_CALL = ("max_steps", "checkpoint_every", "progress", "timeout_s", "threads",
            "measure_straggler", "warm_up", "probe_host", "batch.num_workers",
            "batch.pin_memory")


def run_settings(saved: dict) -> dict:
    """A saved config dict (a checkpoint's) without its PER_CALL keys: the base a resumed call's
    own settings go on top of (load_config), so that those keys are the call's."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
    for key in PER_CALL:
        *parents, name = key.split(".")
        node = out
        for parent in parents:
            node = node.get(parent, {})
        node.pop(name, None)
    return out


def to_dict(cfg: TrainConfig) -> dict:
    """Plain nested dict (str, int, float, bool, None, lists) for checkpoints and results."""
    return dataclasses.asdict(cfg)


def typed_settings(settings: dict) -> dict:
    """`settings` (config keys as a workflow config gives them, nested) with each value as its
    key's declared type reads it: YAML 1.2 number text that PyYAML leaves as a string (1e-4,
    5e-07) becomes the float it is. Errors name the key (load_config)."""
    cfg = load_config(base=settings)

    def typed(node: dict, obj: object) -> dict:
        return {k: typed(v, getattr(obj, k))
                if isinstance(v, dict) and dataclasses.is_dataclass(getattr(obj, k))
                else getattr(obj, k) for k, v in node.items()}

    return typed(settings, cfg)
