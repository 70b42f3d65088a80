"""The trainings of `cfmtrain bench gpu`: the ablation's four variants (baseline, balancer,
kernel, both) on the embedded `mini` data, on one device, in paired rounds.

A small `mini` store is built here with the package's own functions (generated frames, radius
graphs, one shard, a seeded split) unless the work folder holds it from the same settings. The
group trains as `cfmtrain rounds` trains one (measure.rounds.train_group, its device passed in):
the first epoch is the warm-up round, every later one a round of all four, their steps
interleaved; each variant's speed-up over the baseline is the median of its per-round ratios.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from cfmtrain.graphs.build import atoms_to_graph
from cfmtrain.graphs.split import split_indices
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.measure import rounds as group
from cfmtrain.paper import ABLATION, BASELINE, CUTOFF
from cfmtrain.ranks.distenv import DistEnv
from cfmtrain.sources.mini import iter_mini_frames
from cfmtrain.train.loop import StopFlag

REFERENCE = BASELINE.name
FRACTIONS = (0.1, 0.1)  # validation and test shares of the split


def mini_store(folder: Path, scale: float, seed: int) -> tuple[Path, Path]:
    """(store folder, split file) of `mini` at `scale`, built unless already there."""
    settings = {"scale": scale, "seed": seed, "cutoff": CUTOFF, "fractions": list(FRACTIONS)}
    stamp, split = folder / "settings.json", folder / "split.npz"
    if split.exists() and stamp.exists() and json.loads(stamp.read_text()) == settings:
        return folder, split
    folder.mkdir(parents=True, exist_ok=True)
    graphs = []
    for i, atoms in enumerate(iter_mini_frames(scale, seed)):
        graph = atoms_to_graph(atoms, CUTOFF)
        graph["source_index"] = i
        graphs.append(graph)
    write_shard(folder / "shard_0000.h5", graphs, cutoff=CUTOFF)
    parts = split_indices(GraphStore(folder).subsets, FRACTIONS, seed)
    np.savez(split, seed=seed, **parts)
    stamp.write_text(json.dumps(settings))
    print(f"mini at scale {scale}: {len(graphs)} graphs in {folder}", flush=True)
    return folder, split


def training_rows(device: torch.device, work: Path, scale: float, epochs: int,
                  overrides: list[str], seed: int,
                  data: tuple[Path, Path] | None = None) -> list[dict]:
    """One row per variant but the baseline: its paired speed-up over the baseline's epochs, on
    mini at `scale` (or on `data`: a store folder and its split)."""
    store, split = data or mini_store(work / "mini", scale, seed)
    args = argparse.Namespace(graphs=[store], split=split, output=work / "group",
                              variants=list(ABLATION), seed=seed, config=None,
                              overrides=[f"epochs={epochs}", *overrides],
                              dataset="mini" if data is None else store.name, cutoff=None)
    cfgs = group.configs(args)
    result = group.train_group(args, cfgs, DistEnv(), device, StopFlag())
    rows = []
    for variant in result.names:
        if variant == REFERENCE:
            continue
        ratio = result.ratio(REFERENCE, variant)
        name = f"{args.dataset} training, {epochs} epochs, {variant}"
        print(f"{name}: {ratio.median:.2f}x {REFERENCE} ({ratio.p10:.2f}-{ratio.p90:.2f} over "
              f"{ratio.rounds} paired rounds)", flush=True)
        rows.append({"kind": "training", "check": name, "reference": REFERENCE,
                     "candidate": variant,
                     "reference_s": float(np.median(result.times(REFERENCE))),
                     "candidate_s": float(np.median(result.times(variant))),
                     **ratio.columns()})
    return rows
