"""The training settings of a model to publish (config section `model`, target `model`),
declared once: MODEL over TrainConfig's defaults, FINE_TUNE over MODEL when the run fine-tunes a
model (`model.init_model`), then the user's `model.settings` over both. docs/tutorial.md's table
of them is generated from here (`cfmtrain docs`).

MODEL is mace-torch's medium-sized model (128x0e+128x1o, max_ell 3, correlation 3, two
interactions) with mace-torch's recipe: validation after every epoch on the whole validation
split, EMA 0.99, the plateau schedule, Stage Two over the last quarter of the epochs, early
stopping, and the model of the lowest validation loss kept; trained by the variant `both`
(Algorithm 1's batches, fused kernels) without the ablation's measurements.
"""

from __future__ import annotations

import copy

from cfmtrain.paper import BOTH

# Every value names its TrainConfig key (nested as in train.settings); a test checks that each
# is a key, and that a run's config holds them.
MODEL: dict = {
    "variant": BOTH.name,  # Algorithm 1 and the fused kernels
    "model": {"hidden_irreps": "128x0e+128x1o", "max_ell": 3, "correlation": 3,
              "num_interactions": 2},  # mace-torch's medium
    "epochs": 200,
    "eval_interval": 1, "eval_fraction": 1.0,  # every epoch, the whole validation split
    "keep_best": True,  # best.model: the lowest validation loss
    "patience": 30,  # early stopping (mace-torch's --patience), scaled to 200 epochs
    "optim": {"ema_decay": 0.99, "scheduler": "plateau", "lr_factor": 0.8,
              "patience": 10,  # the plateau's patience (--scheduler_patience), scaled alike
              "stress_weight": 1.0},  # stress where the data has it (--loss stress)
    "stage_two": {"enabled": True},  # from epoch 150: energy weight 1000, stress 10, lr 1e-3
    # no benchmark harness: DDP overlaps the all-reduce, no host probes
    "measure_straggler": False, "probe_host": False,
}

# Fine-tuning: a lower learning rate and fewer epochs, its stage two lower still.
FINE_TUNE: dict = {
    "epochs": 50,
    "patience": 10,
    "optim": {"lr": 1e-3, "patience": 5},
    "stage_two": {"lr": 1e-4},
}


def merged(base: dict, over: dict) -> dict:
    """`over` on `base`, nested mappings merged key by key (neither is changed)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def model_settings(settings: dict, fine_tune: bool = False) -> dict:
    """The training settings of a `model` run: MODEL, FINE_TUNE when fine-tuning, then the
    user's `settings` (config model.settings)."""
    base = merged(MODEL, FINE_TUNE) if fine_tune else MODEL
    return merged(base, settings or {})


def flat(settings: dict, prefix: str = "") -> dict:
    """Nested settings as {dotted key: value}."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict) and key not in ("e0s", "e0s_fixed"):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
