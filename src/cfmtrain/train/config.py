"""The typed training configuration: dataclasses with the paper's defaults, validated overrides.

Unknown keys and values of the wrong type are errors that name the key; the config is saved as
plain data in every checkpoint and results folder.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

VARIANTS = ("baseline", "balancer", "kernel", "both", "matched")
Variant = Literal["baseline", "balancer", "kernel", "both", "matched"]


class ConfigError(ValueError):
    """A configuration key or value that is not allowed; the message names the key."""


@dataclasses.dataclass
class ModelConfig:
    """ScaleShiftMACE hyper-parameters (paper defaults, SPEC 'Facts from the paper')."""

    num_interactions: int = 2
    hidden_irreps: str = "128x0e+128x1o"
    max_ell: int = 3
    correlation: int = 3
    num_bessel: int = 8
    num_polynomial_cutoff: int = 5
    mlp_irreps: str = "16x0e"
    radial_mlp: list[int] = dataclasses.field(default_factory=lambda: [64, 64, 64])
    use_reduced_cg: bool = False
    r_max: float | None = None  # None: the graph store's cutoff
    init_model: str | None = None  # a mace-torch .model file to fine-tune (a pickle: runs code)
    dtype: Literal["float32", "float64"] = "float32"


@dataclasses.dataclass
class BatchConfig:
    """How graphs become batches: fixed count (baseline, kernel) or Algorithm 1 (balancer, both)."""

    graphs_per_batch: int = 8  # per rank, fixed-count variants (the paper used 6-8)
    capacity: int = 3072  # balancer bin capacity, in units of `size`
    size: Literal["atoms", "edges"] = "atoms"
    valid_graphs_per_batch: int = 8
    num_workers: int = 0
    pin_memory: bool = False


@dataclasses.dataclass
class OptimConfig:
    """Loss weights, Adam, EMA and the learning-rate schedule (mace-torch's defaults, lr 0.005)."""

    lr: float = 0.005
    weight_decay: float = 5e-7
    amsgrad: bool = True
    ema_decay: float = 0.99  # 0 disables the exponential moving average
    scheduler: Literal["plateau", "exponential", "none"] = "plateau"
    lr_factor: float = 0.8
    patience: int = 50
    gamma: float = 0.9993
    clip_grad: float = 10.0  # 0 disables clipping
    energy_weight: float = 1.0
    forces_weight: float = 100.0
    stress_weight: float = 0.0  # > 0 trains on stress where the data has it


@dataclasses.dataclass
class TrainConfig:
    """One training run."""

    variant: Variant = "baseline"
    seed: int = 0
    epochs: int = 2
    max_steps: int = 0  # stop (with a checkpoint) after this many steps in all; 0 = no limit
    train_fraction: float = 1.0  # nested prefix of the training split (mini_s = 0.25, ...)
    checkpoint_every: int = 0  # steps between checkpoints; 0 = only at the end
    measure_straggler: bool = True  # barrier after local backward to time the straggler cost
    threads: int = 0  # torch threads per rank; 0 = from the allocation
    timeout_s: float = 600.0  # collective timeout: a dead or hung rank fails the others
    progress: bool = True
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    batch: BatchConfig = dataclasses.field(default_factory=BatchConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)

    @property
    def fused(self) -> bool:
        """True for the variants that swap in the fused CPU kernels."""
        return self.variant in ("kernel", "both")

    @property
    def balanced(self) -> bool:
        """True for the variants batched by Algorithm 1."""
        return self.variant in ("balancer", "both")


def _check_value(value: Any, hint: Any, key: str) -> Any:
    """`value` as type `hint` (ints may become floats), else a ConfigError naming the key."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _check_value(value, next(a for a in args if a is not type(None)), key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config {key}: {value!r} is not one of {list(args)}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config {key}: expected a list, got {value!r}")
        return [_check_value(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is str and isinstance(value, Path):
        return str(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"config {key}: expected {hint.__name__}, got {value!r}")
    return value


def _apply(obj: Any, updates: dict, prefix: str = "") -> None:
    hints = typing.get_type_hints(type(obj))
    for name, value in updates.items():
        key = f"{prefix}{name}"
        if name not in hints:
            known = ", ".join(f"{prefix}{k}" for k in hints)
            raise ConfigError(f"config: unknown key {key!r}; known keys: {known}")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"config {key}: expected a mapping, got {value!r}")
            _apply(current, value, f"{key}.")
        else:
            setattr(obj, name, _check_value(value, hints[name], key))


def validate(cfg: TrainConfig) -> TrainConfig:
    """Range checks that types cannot express; returns cfg."""
    checks = [
        (cfg.epochs >= 1, "epochs must be >= 1"),
        (0 < cfg.train_fraction <= 1, "train_fraction must be in (0, 1]"),
        (cfg.batch.graphs_per_batch >= 1, "batch.graphs_per_batch must be >= 1"),
        (cfg.batch.capacity >= 1, "batch.capacity must be >= 1"),
        (cfg.optim.lr > 0, "optim.lr must be > 0"),
        (0 <= cfg.optim.ema_decay < 1, "optim.ema_decay must be in [0, 1)"),
        (cfg.timeout_s > 0, "timeout_s must be > 0"),
        (min(cfg.max_steps, cfg.checkpoint_every, cfg.threads) >= 0,
         "max_steps, checkpoint_every and threads must be >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"config: {message}")
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """`optim.lr=0.01` -> (['optim', 'lr'], 0.01); the value is read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. optim.lr=0.01")
    return key.strip().split("."), yaml.safe_load(value)


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                base: dict | None = None) -> TrainConfig:
    """Defaults, then `base` (a saved config dict), then a YAML file, then KEY=VALUE overrides."""
    cfg = TrainConfig()
    if base:
        _apply(cfg, base)
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a training config must be a YAML mapping")
        try:
            _apply(cfg, data)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
    for text in overrides:
        keys, value = parse_override(text)
        nested: dict = {keys[-1]: value}
        for k in reversed(keys[:-1]):
            nested = {k: nested}
        _apply(cfg, nested)
    return validate(cfg)


def to_dict(cfg: TrainConfig) -> dict:
    """Plain nested dict (str, int, float, bool, None, lists) for checkpoints and results."""
    return dataclasses.asdict(cfg)
