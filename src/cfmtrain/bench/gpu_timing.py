"""The training step of `cfmtrain bench gpu`: mace-torch's e3nn model against the same model with
both paper kernels on cuEquivariance, in paired rounds on one device.

The project's model (the paper's size by default) on a rattled Cu-Ni supercell (800 atoms): a
force-trained step (forward with forces, energy and force loss, backward, Adam), each timed from
a wait for the device to the next, the arms shuffled per round (measure.paired); the verdict is
the median of the per-round ratios with its 10-90% range.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from cfmtrain.bench import WARMUP_CALLS
from cfmtrain.bench.kernels_worker import make_batch, model_pass, paper_model, supercell
from cfmtrain.measure.paired import run_rounds
from cfmtrain.train.device import device_clock

REFERENCE, CANDIDATE = "e3nn", "cueq"


def _timed(step, device: torch.device):
    """An arm: one step, its seconds from a wait for the device to the next."""
    def arm() -> float:
        start = device_clock(device)
        step(False)
        return device_clock(device) - start
    return arm


def step_rows(device: torch.device, size: str, atoms: int, dtype: torch.dtype, rounds: int,
              seed: int) -> list[dict]:
    """One row: the paired speed-up of the cuEquivariance step over the e3nn one."""
    from cfmtrain.kernels import fuse_model

    batch = {k: v.to(device) for k, v in make_batch(supercell(atoms), dtype).items()}
    e3nn = paper_model(dtype, reduced_cg=False, size=size).to(device)
    cueq = fuse_model(copy.deepcopy(e3nn), backend="cueq")
    steps = {}
    for name, model in ((REFERENCE, e3nn), (CANDIDATE, cueq)):
        params = [p for _, p in sorted(model.named_parameters())]
        steps[name] = model_pass(model, batch, "train_step", params)
        for _ in range(WARMUP_CALLS):
            steps[name](False)
    result = run_rounds({name: _timed(step, device) for name, step in steps.items()}, rounds,
                        seed)
    ratio = result.ratio(REFERENCE, CANDIDATE)
    name = f"train step, {size} model, {atoms} atoms, {str(dtype).removeprefix('torch.')}"
    print(f"{name}: {CANDIDATE} {ratio.median:.2f}x {REFERENCE} ({ratio.p10:.2f}-"
          f"{ratio.p90:.2f} over {ratio.rounds} paired rounds)", flush=True)
    return [{"kind": "train_step", "check": name, "reference": REFERENCE,
             "candidate": CANDIDATE,
             "reference_s": float(np.median(result.times(REFERENCE))),
             "candidate_s": float(np.median(result.times(CANDIDATE))), **ratio.columns()}]
