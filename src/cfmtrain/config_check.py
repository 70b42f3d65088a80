"""Every value of the workflow's config checked before any job runs (`snakemake -n` included).

The JSON schema (workflow/schemas/config.schema.yaml) checks keys and types; this module checks
what a schema cannot say, each by the code that will use the value: finite numbers, the cutoff's
range, split fractions and seeds, shard counts that shard names can hold, the files a data set
names, and the training settings (cfmtrain's typed config; with `library_checks`, the irreps
strings and harmonics order by e3nn, as the model will read them). Errors name the key.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

from cfmtrain.frames.neighbors import check_cutoff
from cfmtrain.graphs.split import SplitError, check_fractions
from cfmtrain.paper import VARIANTS
from cfmtrain.train.config import ConfigError, load_config

MAX_SHARDS = 10_000  # shard names are four digits (frames_0000 ... shard_9999)


def _numbers(value: object, key: str) -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every float inside `value`."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{key}[{i}]")
    elif isinstance(value, float):
        yield key, value


def _check_dataset(name: str, cfg: dict) -> None:
    key = f"datasets.{name}"
    if cfg.get("shards", 1) > MAX_SHARDS:
        raise ConfigError(f"config {key}.shards: {cfg['shards']} shards, more than shard names "
                          f"hold ({MAX_SHARDS})")
    e0s = cfg.get("e0s")
    if isinstance(e0s, dict) and "file" in e0s:
        path = Path(os.path.expanduser(e0s["file"]))
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "no such file"
            raise ConfigError(f"config {key}.e0s.file: {e0s['file']}: {what} (the file of "
                              "isolated-atom frames to read the E0s from)")
    for pattern in cfg.get("paths", []):
        if os.path.isdir(os.path.expanduser(pattern)):
            raise ConfigError(f"config {key}.paths: {pattern!r} is a folder; list its files or "
                              f"a glob such as '{pattern.rstrip('/')}/*.xyz' ('**' recurses)")
        if not glob.has_magic(pattern) and not os.path.exists(os.path.expanduser(pattern)):
            raise ConfigError(f"config {key}.paths: {pattern}: no such file")


PER_CELL = ("variant", "train_fraction")  # TrainConfig keys that each cell sets itself


def _check_variants(config: dict) -> None:
    """Every variant list of the config names variants of cfmtrain.paper.VARIANTS."""
    lists = [(f"train.matrix[{i}].variants", block.get("variants", []))
             for i, block in enumerate(config.get("train", {}).get("matrix", []))]
    for section in ("figures", "simulate"):
        found = config.get(section, {})
        for key, value in (found.items() if isinstance(found, dict) else []):
            if key == "variants":
                lists.append((f"{section}.variants", value))
            elif isinstance(value, dict) and "variants" in value:
                lists.append((f"{section}.{key}.variants", value["variants"]))
    for key, variants in lists:
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            raise ConfigError(f"config {key}: unknown variant(s) {unknown}; known: "
                              f"{', '.join(VARIANTS)}")


def check_workflow_config(config: dict, library_checks: bool = True,
                          passed: Path | None = None) -> None:
    """ConfigError naming the first key of `config` (the workflow's, after its schema) whose
    value cannot work; `library_checks` adds the checks that import e3nn (seconds), skipped for
    model settings that passed them before (recorded in the folder `passed`, if given)."""
    for key, value in _numbers(config, ""):
        if not math.isfinite(value):
            raise ConfigError(f"config {key}: {value} is not a finite number")
    try:
        check_cutoff(config["cutoff"])
    except ValueError as err:
        raise ConfigError(f"config cutoff: {err}") from None
    split = config["split"]
    if split["valid"] + split["test"] >= 1:
        raise ConfigError(f"config split: valid ({split['valid']}) + test ({split['test']}) "
                          "must be < 1, or no graph is left to train on")
    try:
        check_fractions(split["valid"], split["test"])
    except SplitError as err:
        raise ConfigError(f"config split: {err}") from None
    if split["seed"] < 0:
        raise ConfigError(f"config split.seed: {split['seed']} is negative (seeds are >= 0)")
    for name, cfg in config["datasets"].items():
        _check_dataset(name, cfg)
    _check_variants(config)
    settings = config.get("train", {}).get("settings", {})
    for key in PER_CELL:
        if key in settings:
            raise ConfigError(f"config train.settings.{key}: not a setting - each cell's {key} "
                              "comes from its matrix block and size suffix")
    try:
        cfg = load_config(base=settings)
    except ConfigError as err:
        raise ConfigError(f"config train.settings: {err}") from None
    stamp = None
    if passed is not None:
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(cfg.model), sort_keys=True)
                                .encode()).hexdigest()
        stamp = Path(passed) / f"model-{digest[:24]}"
    if library_checks and not (stamp and stamp.exists()):
        from cfmtrain.train.model import check_model_config  # lazy: mace, e3nn (seconds)

        try:
            check_model_config(cfg.model)
        except ConfigError as err:
            raise ConfigError(f"config train.settings: {err}") from None
        if stamp:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()
