"""Every value of the workflow's config checked before any job runs (`snakemake -n` included).

The JSON schema (workflow/schemas/config.schema.yaml) checks keys and types; this module checks
what a schema cannot say, each by the code that will use the value: finite numbers, the cutoff's
range, split fractions and seeds, shard counts that shard names and a generated set's frames can
hold, the files a data set names (each glob matching a file of a known format), E0s element
symbols, registry entries, a union's members (each once, each a data set with graphs of its own),
every data set another section names, and the training settings (cfmtrain's typed config, an
r_max within the cutoff, the E0s files it names; with `library_checks`, the model settings by
cfmtrain.train.model_check's rules and a trial of the model on a tiny structure). Errors name
the key: what a job would only find later is refused before any job runs.
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

from ase.data import atomic_numbers

from cfmtrain.frames.formats import format_of
from cfmtrain.frames.neighbors import check_cutoff
from cfmtrain.graphs.split import SplitError, check_fractions
from cfmtrain.paper import VARIANTS
from cfmtrain.sources.registry import DATASETS as REGISTRY
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


def _check_dataset(name: str, cfg: dict, known: dict[str, str], split: dict) -> None:
    """ConfigError naming the key of data set `name` that its jobs would fail on; `known` maps
    every data set's name to its kind, `split` is config `split`."""
    key = f"datasets.{name}"
    if cfg.get("shards", 1) > MAX_SHARDS:
        raise ConfigError(f"config {key}.shards: {cfg['shards']} shards, more than shard names "
                          f"hold ({MAX_SHARDS})")
    kind = cfg["kind"]
    if kind == "union":
        _check_members(key, cfg["members"], known)
    elif kind == "generated":
        _check_generated(key, cfg, split)
    elif kind == "download" and cfg.get("registry", name) not in REGISTRY:
        raise ConfigError(f"config {key}.registry: {cfg.get('registry', name)!r} (the data set's "
                          "name unless given) is no entry of the registry, which `cfmtrain "
                          f"download` fetches from; known: {', '.join(sorted(REGISTRY))}")
    e0s = cfg.get("e0s")
    if isinstance(e0s, dict) and "file" in e0s:
        path = Path(os.path.expanduser(e0s["file"]))
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "no such file"
            raise ConfigError(f"config {key}.e0s.file: {e0s['file']}: {what} (the file of "
                              "isolated-atom frames to read the E0s from)")
        _check_format(f"{key}.e0s.file", path)
    elif isinstance(e0s, dict):
        unknown = [symbol for symbol in e0s if symbol not in atomic_numbers]
        if unknown:
            raise ConfigError(f"config {key}.e0s: {', '.join(map(repr, unknown))}: not element "
                              "symbols (H, He, ... Og)")
    for pattern in cfg.get("paths", []):
        _check_pattern(f"{key}.paths", pattern)


def _check_members(key: str, members: list[str], known: dict[str, str]) -> None:
    """A union's members: each listed once (a member twice would put copies of its test graphs
    into training), each a data set with graphs of its own."""
    for member in members:
        if members.count(member) > 1:
            raise ConfigError(f"config {key}.members: {member!r} is listed "
                              f"{members.count(member)} times; list each member once (its graphs "
                              "would be in the union twice, and the split would put copies of its "
                              "test graphs into training)")
        if member not in known:
            raise ConfigError(f"config {key}.members: {member!r} is not a data set of config "
                              f"`datasets` (known: {', '.join(sorted(known))})")
        if known[member] == "union":
            raise ConfigError(f"config {key}.members: {member!r} is a union; a member must be a "
                              "data set with graphs of its own (list its members instead)")


def _check_generated(key: str, cfg: dict, split: dict) -> None:
    """A generated set's frames fill its shards (an empty shard fails its graph job) and, with
    a validation or test part, give the split its 3 graphs."""
    shards = cfg.get("shards", 2)
    if cfg.get("preset", "mini") == "crystals":
        frames, what = cfg["graphs"], f"{key}.graphs"
    else:
        from cfmtrain.sources.mini import subset_counts  # lazy: ase's calculators (0.5 s)

        try:
            frames = sum(subset_counts(cfg.get("scale", 1.0)).values())
        except ValueError as err:
            raise ConfigError(f"config {key}.scale: {err}") from None
        what = f"{key}.scale ({cfg.get('scale', 1.0)})"
    if shards > frames:
        raise ConfigError(f"config {key}.shards: {shards} shards for the {frames} frames of "
                          f"{what}: a shard would be empty; give at most {frames}")
    if frames < 3 and (split["valid"] > 0 or split["test"] > 0):
        raise ConfigError(f"config {what}: {frames} graph(s) cannot be split into train, "
                          "validation and test (3 are needed); generate more, or set config "
                          "split.valid and split.test to 0")


def _check_format(key: str, path: Path) -> None:
    try:
        format_of(path)
    except ValueError as err:
        raise ConfigError(f"config {key}: {err}") from None


def _check_pattern(key: str, pattern: str) -> None:
    """A file or glob of a files set: a file (or glob matching files) of a known format."""
    expanded = os.path.expanduser(pattern)
    if os.path.isdir(expanded):
        raise ConfigError(f"config {key}: {pattern!r} is a folder; list its files or "
                          f"a glob such as '{pattern.rstrip('/')}/*.xyz' ('**' recurses)")
    if not glob.has_magic(pattern):
        if not os.path.exists(expanded):
            raise ConfigError(f"config {key}: {pattern}: no such file")
        _check_format(key, Path(expanded))
        return
    files = [p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p)]
    if not files:
        raise ConfigError(f"config {key}: {pattern!r} matches no file (relative paths are read "
                          "from the working directory, the clone's root)")
    for file in sorted(files):
        _check_format(key, Path(file))


PER_CELL = ("variant", "train_fraction")  # TrainConfig keys that each cell sets itself


def _dataset_references(config: dict) -> Iterator[tuple[str, str, bool]]:
    """(key, name, whether a size suffix is allowed) of every data set the config's sections
    name besides `targets`: trainsets (a data set, or one with a `train.sizes` suffix) where the
    training cells are read, plain data sets where a data set's own split is."""
    train, figures = config.get("train", {}), config.get("figures", {})
    for i, block in enumerate(train.get("matrix", [])):
        for j, name in enumerate(block.get("datasets", [])):
            yield f"train.matrix[{i}].datasets[{j}]", name, True
    for i, name in enumerate(train.get("baseline_check", [])):
        yield f"train.baseline_check[{i}]", name, True
    if "dataset" in figures:
        yield "figures.dataset", figures["dataset"], True
    for i, pair in enumerate(figures.get("sizes", [])):
        yield f"figures.sizes[{i}].dataset", pair["dataset"], True
    if "dataset" in config.get("simulate", {}):
        yield "simulate.dataset", config["simulate"]["dataset"], True
    if "dataset" in config.get("sweep", {}):
        yield "sweep.dataset", config["sweep"]["dataset"], False
    for i, name in enumerate(config.get("accuracy", {}).get("datasets", [])):
        yield f"accuracy.datasets[{i}]", name, False
    model = config.get("model", {})
    for i, name in enumerate(model.get("datasets", [])):
        yield f"model.datasets[{i}]", name, False
    if model.get("replay") is not None:
        yield "model.replay", model["replay"], False


def _check_references(config: dict, known: dict[str, str]) -> None:
    """Every data set a section names is one of config `datasets` (with a size suffix of
    `train.sizes` where cells are trained on a nested part of its training split)."""
    sizes = config.get("train", {}).get("sizes", {})
    for key, name, sized in _dataset_references(config):
        base, _, suffix = name.rpartition("_")
        if name in known or (sized and base in known and suffix in sizes):
            continue
        also = (f" nor one with a size suffix of config train.sizes "
                f"({', '.join(f'_{s}' for s in sizes)})" if sized else "")
        raise ConfigError(f"config {key}: {name!r} is not a data set of config `datasets`{also}; "
                          f"known: {', '.join(sorted(known))}")


def _check_settings_files(cfg, cutoff: float, section: str = "train.settings") -> None:
    """The training settings (of config `section`) that a job would refuse against the rest of
    the config: an r_max beyond the graphs' cutoff, an E0s file that is not there."""
    r_max = cfg.model.r_max
    if r_max is not None and r_max > cutoff + 1e-9:
        raise ConfigError(f"config {section}.model.r_max: {r_max} Å exceeds config cutoff "
                          f"({cutoff} Å), the radius the graphs are built at; set r_max <= "
                          f"{cutoff}, or leave it out (the cutoff)")
    e0s, fixed = cfg.model.e0s, cfg.model.e0s_fixed
    files = [("model.e0s", e0s)] if isinstance(e0s, str) and e0s.endswith(".json") else []
    if isinstance(fixed, list):
        files += [(f"model.e0s_fixed[{i}]", f) for i, f in enumerate(fixed)]
    for key, file in files:
        path = Path(os.path.expanduser(file))
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "no such file"
            raise ConfigError(f"config {section}.{key}: {file}: {what} (a JSON mapping of "
                              "element to E0 in eV)")


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
    known = {name: cfg["kind"] for name, cfg in config["datasets"].items()}
    known |= {f"scale_{n}": "generated" for n in config.get("scale", {}).get("graphs", [])}
    for name, cfg in config["datasets"].items():
        _check_dataset(name, cfg, known, split)
    _check_variants(config)
    _check_references(config, known)
    _check_model_section(config, library_checks, passed)
    settings = config.get("train", {}).get("settings", {})
    for key in PER_CELL:
        if key in settings:
            raise ConfigError(f"config train.settings.{key}: not a setting - each cell's {key} "
                              "comes from its matrix block and size suffix")
    try:
        cfg = load_config(base=settings)
    except ConfigError as err:
        raise ConfigError(f"config train.settings: {err}") from None
    _check_settings_files(cfg, config["cutoff"])
    if library_checks:
        _try_model(cfg, config["cutoff"], "train.settings", passed)


def _stamp(passed: Path | None, kind: str, facts: dict) -> Path | None:
    """The file that records a library check of `facts` passed (under `passed`), or None."""
    if passed is None:
        return None
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
    return Path(passed) / f"{kind}-{digest[:24]}"


def _try_model(cfg, cutoff: float, section: str, passed: Path | None) -> None:
    """The model of the training settings `cfg` (config `section`) built and run once on a
    tiny cell (cfmtrain.train.model_check.try_model), unless it passed before."""
    stamp = _stamp(passed, "model", {**dataclasses.asdict(cfg.model), "cutoff": cutoff})
    if stamp and stamp.exists():
        return
    from cfmtrain.train.model_check import try_model  # lazy: mace, e3nn (seconds)

    try:
        try_model(cfg.model, cfg.model.r_max or cutoff)
    except ConfigError as err:
        raise ConfigError(f"config {section}: {err}") from None
    if stamp:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()


def model_outputs(name: str) -> set[str]:
    """The files the `model` target writes for data set `name` that a config might name."""
    return {os.path.normpath(f"results/model/{name}/{f}") for f in ("best.model", "final.model")}


def _check_model_section(config: dict, library_checks: bool, passed: Path | None) -> None:
    """Config `model`: each data set once, replay only with init_model and not one of them,
    the training settings (the model preset, fine-tuning's, then model.settings) loaded as a
    job loads them, their files present, the model tried on a tiny cell; init_model a file
    that no data set of the section trains, and with `library_checks` loaded and checked
    against the config: one head, r_max within the cutoff, the E0s the data sets give."""
    from cfmtrain.train.presets import model_settings  # lazy: only where a section is set

    section = config.get("model") or {}
    names = section.get("datasets", [])
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"config model.datasets: {name!r} is listed {names.count(name)} "
                              "times; list each data set once")
    init, replay = section.get("init_model"), section.get("replay")
    if replay is not None and init is None:
        raise ConfigError(f"config model.replay: {replay!r} replays part of a fine-tuned "
                          "model's training data; set model.init_model (the model to fine-tune)"
                          ", or leave model.replay null")
    if replay is not None and replay in names:
        raise ConfigError(f"config model.replay: {replay!r} is also one of model.datasets; "
                          "replay another data set (one the model was trained on)")
    try:
        cfg = load_config(base=model_settings(section.get("settings") or {},
                                              fine_tune=init is not None))
    except ConfigError as err:
        raise ConfigError(f"config model.settings: {err}") from None
    if cfg.model.init_model is not None:
        raise ConfigError("config model.settings.model.init_model: give the model to fine-tune "
                          "as config model.init_model (an input of the training jobs)")
    _check_settings_files(cfg, config["cutoff"], "model.settings")
    if init is not None:
        _check_init_model(config, init, cfg, names, library_checks, passed)
    elif library_checks and names:
        _try_model(cfg, config["cutoff"], "model.settings", passed)


def _check_init_model(config: dict, init: str, cfg, names: list[str], library_checks: bool,
                      passed: Path | None) -> None:
    """config model.init_model: a file no data set of the section trains; with
    `library_checks` its heads, r_max and the E0s the data sets give (the mappings of
    datasets.<name>.e0s; files are read by the job) checked as the job will."""
    path = Path(os.path.expanduser(init))
    trained = {n for n in names if os.path.normpath(init) in model_outputs(n)}
    if trained:
        raise ConfigError(f"config model.init_model: {init} is the model this config trains on "
                          f"{', '.join(sorted(trained))}; fine-tune it in a second run, with "
                          "that data set out of model.datasets")
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "no such file"
        raise ConfigError(f"config model.init_model: {init}: {what} (a mace-torch .model file "
                          "to fine-tune)")
    if not library_checks:
        return
    given = {n: config["datasets"][n].get("e0s") for n in names}
    given = {n: e for n, e in given.items() if isinstance(e, dict) and "file" not in e}
    info = path.stat()
    stamp = _stamp(passed, "init", {"path": str(path.resolve()), "size": info.st_size,
                                    "mtime": info.st_mtime_ns, "cutoff": config["cutoff"],
                                    "e0s": given, "init_e0s": cfg.model.init_e0s})
    if stamp and stamp.exists():
        return
    from cfmtrain.train import fine_tune  # lazy: torch, mace (seconds)
    from cfmtrain.train.model import load_user_model, read_e0s

    try:
        model = load_user_model(path, math.inf)
        fine_tune.check_heads(init, model)
        fine_tune.check_cutoff(init, model, config["cutoff"])
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"config model.init_model: {err}") from None
    if cfg.model.init_e0s == "check":
        mine = fine_tune.model_e0s(model)
        for name, e0s in given.items():
            differ = fine_tune.e0_differences(mine, read_e0s(e0s), read_e0s(e0s))
            if differ:
                raise ConfigError(
                    f"config model.init_model: {init}: its E0s differ from those config "
                    f"datasets.{name}.e0s gives ({'; '.join(differ)}); set "
                    "model.settings.model.init_e0s: foundation to keep the model's (the same "
                    "DFT settings), or data to take the data's (another reference)")
    if stamp:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
