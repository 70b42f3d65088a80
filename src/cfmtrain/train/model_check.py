"""Model settings checked before a model is built: what mace-torch would fail on only inside the
build or the first step (an IndexError, an activation refusing a vector), or take hours and
tens of GB to build, refused naming the key; and a trial of the settings on a tiny structure,
for what no rule here foresees (run once per setting by the workflow's config check).
"""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn: mace sets up torch.load for e3nn's constants)
import torch
from e3nn import o3

from cfmtrain.train.config import ConfigError, ModelConfig

SCALAR = o3.Irrep(0, 1)  # 0e
# the largest correlation that builds in minutes at each max_ell (mace-torch computes the
# symmetric contraction's coupling tensors at build time: on one core, correlation 4 at max_ell 3
# took 100 s and 6 GB, 6 at max_ell 1 40 s; 5 at max_ell 2, 7 at max_ell 1 and 3 at max_ell 4
# or 5 did not finish in minutes, some taking over 15 GB)
MAX_CORRELATION = {1: 6, 2: 4, 3: 4}
MAX_CORRELATION_HIGH_ELL = 2  # max_ell 4 and above (2 at max_ell 6: 6 s)


def _irreps(cfg: ModelConfig, key: str) -> o3.Irreps:
    text = getattr(cfg, key)
    try:
        return o3.Irreps(text)
    except (ValueError, AssertionError, TypeError) as err:
        raise ConfigError(f"config model.{key}: {text!r} is not an irreps string such as "
                          f"16x0e+16x1o ({err})") from None


def check_hidden(cfg: ModelConfig, irreps: o3.Irreps) -> None:
    """The node features: scalars (0e), each irrep once, one channel count for all."""
    text = cfg.hidden_irreps
    if irreps.count(SCALAR) == 0:
        raise ConfigError(f"config model.hidden_irreps: {text!r} has no scalar (0e) channels; "
                          "MACE counts its channels there (e.g. 16x0e+16x1o)")
    listed = [ir for _, ir in irreps]
    twice = sorted({str(ir) for ir in listed if listed.count(ir) > 1})
    if twice:
        raise ConfigError(f"config model.hidden_irreps: {text!r} lists {', '.join(twice)} more "
                          "than once; give each irrep once, all with one channel count (e.g. "
                          "32x0e+32x1o)")
    counts = sorted({mul for mul, _ in irreps})
    if len(counts) > 1:
        raise ConfigError(f"config model.hidden_irreps: {text!r} mixes channel counts "
                          f"({', '.join(map(str, counts))}); MACE needs one count for every "
                          f"irrep, e.g. {'+'.join(f'{counts[-1]}x{ir}' for _, ir in irreps)}")


def check_mlp(cfg: ModelConfig, irreps: o3.Irreps) -> None:
    """The readout MLP's hidden irreps: even scalars only (its activation takes scalars)."""
    text = cfg.mlp_irreps
    other = sorted({str(ir) for mul, ir in irreps if ir != SCALAR and mul > 0})
    if other:
        raise ConfigError(f"config model.mlp_irreps: {text!r} holds {', '.join(other)}; the "
                          "readout MLP's activation takes even scalars only: give NNx0e, e.g. "
                          "16x0e")
    if irreps.dim == 0:
        raise ConfigError(f"config model.mlp_irreps: {text!r} has no channels; give NNx0e with "
                          "NN >= 1, e.g. 16x0e")


def check_orders(cfg: ModelConfig) -> None:
    """max_ell: >= 1 (the interactions need vectors) and implemented by e3nn; correlation:
    within what builds in minutes at that max_ell (MAX_CORRELATION)."""
    if cfg.max_ell < 1:
        raise ConfigError(f"config model.max_ell: {cfg.max_ell} must be >= 1 (MACE's "
                          "interactions and forces need the l=1 edge harmonics)")
    try:
        o3.spherical_harmonics(cfg.max_ell, torch.zeros(1, 3), normalize=True)
    except NotImplementedError as err:
        raise ConfigError(f"config model.max_ell: {cfg.max_ell} is beyond the spherical "
                          f"harmonics e3nn implements ({err})") from None
    limit = MAX_CORRELATION.get(cfg.max_ell, MAX_CORRELATION_HIGH_ELL)
    if cfg.correlation > limit:
        raise ConfigError(f"config model.correlation: {cfg.correlation} with model.max_ell "
                          f"{cfg.max_ell}: the symmetric contraction's coupling tensors take "
                          "hours and tens of GB to build; at this max_ell use correlation <= "
                          f"{limit} (mace-torch's default: 3)")


def check_model_config(cfg: ModelConfig) -> None:
    """ConfigError naming the key of a model setting the model cannot be built from, checked
    by e3nn as the model reads it: irreps strings, the hidden irreps' scalars and channel
    counts, the readout's scalars, the harmonics' order and the correlation it allows."""
    hidden, mlp = _irreps(cfg, "hidden_irreps"), _irreps(cfg, "mlp_irreps")
    check_hidden(cfg, hidden)
    check_mlp(cfg, mlp)
    check_orders(cfg)


def try_model(cfg: ModelConfig, r_max: float) -> None:
    """Build the model of `cfg` on the CPU and take one forward and backward on a two-atom
    cell: ConfigError naming the model settings if mace-torch fails on them (a user's
    init_model is read by the job, not here)."""
    import numpy as np
    from ase.build import bulk
    from mace import data as mace_data
    from mace.tools import AtomicNumberTable, torch_geometric

    from cfmtrain.train.model import DataStats, build_model

    if cfg.init_model is not None:
        return
    check_model_config(cfg)
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        atoms = bulk("Cu", "fcc", a=3.6).repeat((2, 1, 1))
        atoms.positions += np.random.default_rng(0).normal(0, 0.05, atoms.positions.shape)
        point = mace_data.AtomicData.from_config(mace_data.config_from_atoms(atoms),
                                                 z_table=AtomicNumberTable([29]), cutoff=r_max)
        batch = next(iter(torch_geometric.dataloader.DataLoader([point], batch_size=1)))
        stats = DataStats(zs=[29], e0s=[0.0], avg_num_neighbors=12.0, mean=0.0, std=1.0)
        model = build_model(cfg, stats, r_max, seed=0).to(dtype)
        out = model(batch.to_dict(), training=True, compute_force=True)
        out["energy"].sum().backward()
    except (RuntimeError, ValueError, IndexError, AssertionError, TypeError, KeyError) as err:
        keys = ", ".join(f"model.{k}={getattr(cfg, k)!r}" for k in (
            "hidden_irreps", "max_ell", "correlation", "num_interactions", "mlp_irreps",
            "radial_mlp", "num_bessel", "num_polynomial_cutoff", "use_reduced_cg"))
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        last = lines[-1][:300] if lines else ""  # TorchScript's cause comes last
        raise ConfigError(f"config model: mace-torch cannot build or run a model of these "
                          f"settings ({keys}): {type(err).__name__}: {last}") from None
    finally:
        torch.set_default_dtype(before)
