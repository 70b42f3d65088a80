"""The settings a derived output records of its making, beside those a config asks for: a frames
folder's (its manifest: shard count, a generated set's preset, seed and size), a graph shard's
(its cutoff) and a split's (its fractions and seed).

The workflow compares them before it plans a job (workflow/rules/common.smk): a results folder
that two clones or configs share holds the outputs of whichever wrote last, and Snakemake's own
record of the settings (its params) is per clone, so another clone's outputs look current.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from cfmtrain.shards.writer import MANIFEST


def frames_settings(folder: str | os.PathLike) -> dict | None:
    """The settings a frames folder's manifest records (None without a readable manifest)."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    found = {"shards": manifest.get("num_shards")}
    if "generator_version" in manifest:  # `cfmtrain generate`'s
        preset = manifest.get("preset", "mini")
        found |= {"preset": preset, "seed": manifest.get("seed")}
        found |= ({"graphs": manifest.get("total_frames")} if preset == "crystals"
                  else {"scale": manifest.get("scale")})
    return found


def frames_wanted(cfg: dict) -> dict:
    """What a data set's config (with the schema's defaults) asks of its frames."""
    wanted = {"shards": cfg["shards"]}
    if cfg["kind"] == "generated":
        preset = cfg.get("preset", "mini")
        wanted |= {"preset": preset, "seed": cfg["seed"]}
        wanted |= ({"graphs": cfg["graphs"]} if preset == "crystals" else {"scale": cfg["scale"]})
    return wanted


def shard_settings(path: str | os.PathLike) -> dict | None:
    """The cutoff a graph shard was built at (None if it cannot be read: its readers say why)."""
    import h5py  # lazy: the workflow reads these only where shards exist

    try:
        with h5py.File(path, "r") as f:
            return {"cutoff": float(f.attrs["cutoff"])}
    except (OSError, KeyError, ValueError):
        return None


def split_settings(path: str | os.PathLike) -> dict | None:
    """The fractions and seed a split was made with (None if unreadable or not recorded)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            valid, test = (float(x) for x in data["requested"])
            return {"valid": valid, "test": test, "seed": int(data["seed"])}
    except (OSError, KeyError, ValueError, EOFError):
        return None


def differences(recorded: dict | None, wanted: dict) -> list[str]:
    """'key recorded (config: wanted)' for each setting both hold that differs."""
    found = []
    for key, want in wanted.items():
        have = (recorded or {}).get(key)
        if have is None:
            continue
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (have, want))
        same = math.isclose(have, want, rel_tol=1e-12) if numbers else have == want
        if not same:
            found.append(f"{key} {have} (this config: {want})")
    return found
