"""cfmtrain.train pieces against mace-torch in one process: config validation, AtomicData from the
store, E0s/avg_num_neighbors/scale statistics, the loss, seeds, checkpoints, NaN errors.

The small EMT-labelled store and the tiny model config come from tests/helpers.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mace  # noqa: F401  (mace before e3nn)
import numpy as np
import pytest
import torch
from helpers import CUTOFF, TINY, make_store
from mace import modules
from mace.data import AtomicData, config_from_atoms
from mace.data.utils import KeySpecification, compute_average_E0s
from mace.tools import AtomicNumberTable
from mace.tools.torch_geometric.dataloader import Collater

from cfmtrain.batches.data import GraphDataset, nested_subset
from cfmtrain.graphs.store import GraphStore
from cfmtrain.train import config as config_mod
from cfmtrain.train import model as model_mod
from cfmtrain.train.build import load_parts
from cfmtrain.train.loop import NonFiniteLossError, forward_backward
from cfmtrain.train.loss import distributed_loss

KEYS = KeySpecification(info_keys={"energy": "REF_energy", "stress": "REF_stress"},
                        arrays_keys={"forces": "REF_forces"})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("store"))


def tiny_stats(store_dir: Path) -> model_mod.DataStats:
    st = GraphStore(store_dir)
    return model_mod.compute_stats(st, np.arange(len(st)), np.array([], int))


def test_config_overrides_and_errors(tmp_path):
    cfg = config_mod.load_config(overrides=["optim.lr=0.01", "model.radial_mlp=[8, 8]",
                                            "variant=both", "epochs=3"])
    assert (cfg.optim.lr, cfg.model.radial_mlp, cfg.fused, cfg.balanced) == (0.01, [8, 8],
                                                                             True, True)
    for bad, word in [("optim.lrr=1", "unknown key 'optim.lrr'"), ("epochs=1.5", "epochs"),
                      ("variant=fast", "variant"), ("model=3", "mapping"), ("epochs=0", ">= 1"),
                      ("lr", "KEY=VALUE")]:
        with pytest.raises(config_mod.ConfigError, match=word):
            config_mod.load_config(overrides=[bad])
    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 0.002}\nmodel: {widht: 3}\n")
    with pytest.raises(config_mod.ConfigError, match=r"c\.yaml.*model\.widht"):
        config_mod.load_config(path)
    saved = config_mod.to_dict(cfg)
    assert config_mod.load_config(base=saved) == cfg


def test_nested_subsets_are_nested_and_stratified():
    subsets = np.repeat(np.arange(4), 25)
    idx = np.arange(100)
    small, medium = (nested_subset(idx, subsets, f, seed=3) for f in (0.25, 0.5))
    assert set(small) <= set(medium) and len(small) < len(medium) < 100
    assert np.bincount(subsets[small]).tolist() == [7, 7, 7, 7]


def test_eval_fraction_cuts_validation_and_test_nested_by_subset(tmp_path):
    """eval_fraction keeps a nested share of each subset of the validation and test splits and
    leaves the training split to train_fraction alone."""
    folder, split, _ = make_store(tmp_path / "s", n=60)
    st = GraphStore(folder)
    full = load_parts(st, split, config_mod.load_config())
    half = load_parts(st, split, config_mod.load_config(overrides=["eval_fraction=0.5"]))
    assert np.array_equal(half["train"], full["train"])
    for name in ("valid", "test"):
        assert set(half[name]) < set(full[name])
        kept = np.bincount(st.subsets[half[name]], minlength=3)
        assert kept.tolist() == np.ceil(np.bincount(st.subsets[full[name]], minlength=3)
                                        / 2).astype(int).tolist()
    with pytest.raises(config_mod.ConfigError, match="eval_fraction"):
        config_mod.load_config(overrides=["eval_fraction=0"])


def test_atomic_data_equals_mace_from_config(store):
    folder, _, frames = store
    z_table = AtomicNumberTable([28, 29])
    data = GraphDataset(GraphStore(folder), np.arange(len(frames)), z_table, CUTOFF,
                        torch.float64, use_stress=True)
    torch.set_default_dtype(torch.float64)
    try:
        for i in (0, 1, 2):  # periodic 1-atom cell, alloy with stress, cluster without
            ref = AtomicData.from_config(config_from_atoms(frames[i], key_specification=KEYS),
                                         z_table=z_table, cutoff=CUTOFF)
            mine = data[i]
            edges = [sorted(map(tuple, np.concatenate([d.edge_index.T, d.unit_shifts], 1)
                                .tolist())) for d in (mine, ref)]
            assert edges[0] == edges[1]
            for key in ref.keys:
                if key not in ("edge_index", "shifts", "unit_shifts"):
                    torch.testing.assert_close(mine[key].to(ref[key].dtype), ref[key],
                                               msg=f"graph {i} field {key}")
    finally:
        torch.set_default_dtype(torch.float32)


def test_stats_equal_mace(store):
    folder, _, frames = store
    stats = tiny_stats(folder)
    z_table = AtomicNumberTable(stats.zs)
    configs = [config_from_atoms(a, key_specification=KEYS) for a in frames]
    e0 = compute_average_E0s(configs, z_table)
    np.testing.assert_allclose(stats.e0s, [e0[z] for z in stats.zs], rtol=1e-9, atol=1e-9)
    torch.set_default_dtype(torch.float64)
    try:
        batches = Collater([None], [None])([AtomicData.from_config(c, z_table=z_table,
                                                                   cutoff=CUTOFF)
                                            for c in configs])
        mean, rms = modules.compute_mean_rms_energy_forces([batches],
                                                          np.array([[e0[z] for z in z_table.zs]]))
        avg = modules.compute_avg_num_neighbors([batches])
    finally:
        torch.set_default_dtype(torch.float32)
    assert stats.mean == pytest.approx(float(np.ravel(mean)[0]), rel=1e-9, abs=1e-9)
    assert stats.std == pytest.approx(float(np.ravel(rms)[0]), rel=1e-9)
    assert stats.avg_num_neighbors == pytest.approx(avg, rel=1e-12)


def tiny_model(folder: Path, dtype=torch.float64, seed: int = 0) -> torch.nn.Module:
    cfg = config_mod.load_config(overrides=TINY)
    torch.set_default_dtype(dtype)
    try:
        return model_mod.build_model(cfg.model, tiny_stats(folder), CUTOFF, seed).to(dtype)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.fixture(scope="module")
def model64(store):
    return tiny_model(store[0])


def collated(folder: Path, items, model, dtype=torch.float64, stress=True):
    data = GraphDataset(GraphStore(folder), np.arange(len(GraphStore(folder))),
                        model_mod.z_table_of(model), CUTOFF, dtype, use_stress=stress)
    return Collater([None], [None])([data[i] for i in items])


@pytest.mark.parametrize("stress_weight", [0.0, 10.0])
def test_loss_equals_mace_loss(store, model64, stress_weight):
    folder, model = store[0], model64
    batch = collated(folder, [0, 1, 2, 4, 5], model)
    cfg = config_mod.load_config(overrides=[f"optim.stress_weight={stress_weight}"]).optim
    pred = model(batch.to_dict(), training=True, compute_force=True,
                 compute_stress=stress_weight > 0)
    mine = distributed_loss(batch, pred, batch.num_graphs, batch.num_nodes, 1, cfg)
    if stress_weight:
        ref_fn = modules.WeightedEnergyForcesStressLoss(1.0, 100.0, stress_weight)
    else:
        ref_fn = modules.WeightedEnergyForcesLoss(1.0, 100.0)
    torch.testing.assert_close(mine, ref_fn(batch, pred, ddp=False).to(mine.dtype),
                               rtol=1e-12, atol=0)


@pytest.mark.slow
def test_same_seed_same_initial_weights(store):
    folder = store[0]
    a, b, c = (tiny_model(folder, torch.float32, seed) for seed in (5, 5, 6))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    from cfmtrain.kernels import fuse_model

    fused = fuse_model(b)
    assert fused is b
    sf = fused.state_dict()
    assert list(sf) == list(sa) and all(torch.equal(sa[k], sf[k]) for k in sa)


def test_non_finite_loss_names_step_and_batch(store, model64):
    folder, model = store[0], model64
    batch = collated(folder, [3, 4], model)
    batch.energy[1] = float("nan")
    cfg = config_mod.load_config()
    with pytest.raises(NonFiniteLossError, match=r"step 17.*store indices \[3, 4\]"):
        forward_backward(model, batch, 2, batch.num_nodes, cfg, step=17, measure=False)


@pytest.mark.parametrize("stress_weight", [0.0, 10.0])
def test_backward_reaches_parameters_only(store, model64, stress_weight):
    """forward_backward gives loss.backward()'s parameter gradients and skips the positions'
    (and strain's) second-order gradient."""
    folder, model = store[0], model64
    cfg = config_mod.load_config(overrides=[f"optim.stress_weight={stress_weight}"])
    params = [p for p in model.parameters() if p.requires_grad]
    batch = collated(folder, [0, 1, 2, 4], model)
    pred = model(batch.to_dict(), training=True, compute_force=True,
                 compute_stress=stress_weight > 0)
    distributed_loss(batch, pred, 4, batch.num_nodes, 1, cfg.optim).backward()
    assert batch.positions.grad is not None  # what the plain backward pays for
    reference = [p.grad.clone() for p in params]
    model.zero_grad(set_to_none=True)
    batch = collated(folder, [0, 1, 2, 4], model)
    forward_backward(model, batch, 4, batch.num_nodes, cfg, step=0, measure=False)
    assert batch.positions.grad is None
    for p, ref in zip(params, reference, strict=True):
        torch.testing.assert_close(p.grad, ref, rtol=1e-12, atol=1e-14)
    model.zero_grad(set_to_none=True)


def test_checkpoint_state_is_plain(tmp_path, store, model64):
    from cfmtrain.train.checkpoint import load_checkpoint, save_checkpoint

    folder, model = store[0], model64
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005, amsgrad=True)
    loss = model(collated(folder, [0, 1], model).to_dict(), training=True)["energy"].sum()
    loss.backward()
    optimizer.step()
    state = {"format": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "config": config_mod.to_dict(config_mod.load_config()),
             "stats": dataclasses.asdict(tiny_stats(folder)), "partial": None}
    save_checkpoint(state, tmp_path / "c.pt")
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert loaded["config"] == state["config"] and loaded["stats"] == state["stats"]
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(Exception):  # noqa: B017 (torch raises its own unpickling errors)
        load_checkpoint(tmp_path / "bad.pt")


def test_step_counts_and_matched_cell():
    from cfmtrain.train.sampling import global_step_counts, make_train_sampler

    sizes = np.random.default_rng(1).integers(1, 40, 101)
    cfg = config_mod.load_config(overrides=["variant=balancer", "batch.capacity=120"])
    samplers = [make_train_sampler(cfg, sizes, 10 * sizes, r, 3)[0] for r in range(3)]
    counts = global_step_counts(samplers[0], sizes).numpy()
    steps = [list(s) for s in samplers]
    assert len(counts) == len(steps[0]) == len(steps[2])
    for s, (graphs, atoms) in enumerate(counts):  # brute force over every rank's batch
        items = [item for rank in steps for item in rank[s]]
        assert graphs == sum(w for _, w in items)
        assert atoms == sum(w * sizes[i] for i, w in items)
        assert max(sum(sizes[i] for i, _ in rank[s]) for rank in steps) <= 120
    assert sorted(i for rank in steps for b in rank for i, w in b if w) == list(range(101))
    bins = 3 * len(counts)
    cfg.variant = "matched"
    matched = make_train_sampler(cfg, sizes, 10 * sizes, 0, 3)[0]
    assert {len(b) for b in list(matched)[:-1]} == {round(101 / bins)}


def test_baseline_check_settings_parse_in_mace(tmp_path):
    from mace.tools import build_default_arg_parser

    from cfmtrain.bench.baseline_check import mace_arguments

    cfg = config_mod.load_config(overrides=TINY)
    args = build_default_arg_parser().parse_args(mace_arguments(cfg, 4.5, tmp_path))
    m, o = cfg.model, cfg.optim
    assert (args.hidden_irreps, args.max_ell, args.correlation, args.num_radial_basis) == (
        m.hidden_irreps, m.max_ell, m.correlation, m.num_bessel)
    assert (args.lr, args.ema, args.ema_decay, args.amsgrad, args.forces_weight,
            args.batch_size, args.r_max, args.use_reduced_cg) == (
        o.lr, True, o.ema_decay, True, o.forces_weight, cfg.batch.graphs_per_batch, 4.5, False)
    assert args.radial_MLP == "[8, 8]" and args.model == "ScaleShiftMACE"


@pytest.mark.slow
def test_epoch_normalized_loss_weighs_every_graph_alike(store, model64):
    """Summed over an epoch, the loss divided by the epoch's mean counts per step (balanced
    variants) is the same however the graphs are batched into as many steps: each graph's energy
    and each atom's forces weigh alike. Divided by each step's own counts, a step with one large
    graph alone weighs its energy 4x; with energies alone and fixed-count batches the two agree."""
    from cfmtrain.train.sampling import loss_normalizers

    folder, model = store[0], model64
    sizes = GraphStore(folder).num_atoms
    order = [int(i) for i in np.argsort(-sizes, kind="stable")][:12]
    fixed = [order[k:k + 3] for k in range(0, 12, 3)]  # 3 graphs a step
    uneven = [order[:1], order[1:5], order[5:9], order[9:12]]  # the largest alone
    errors = {}

    def epoch_loss(batches, epoch_mean, forces_weight=100.0):
        cfg = config_mod.load_config(overrides=[f"optim.forces_weight={forces_weight}"]).optim
        counts = torch.tensor([[len(b), float(sizes[b].sum())] for b in batches],
                              dtype=torch.float64)
        total = 0.0
        for b, (graphs, atoms) in zip(batches, loss_normalizers(counts, epoch_mean).tolist(),
                                      strict=True):
            key = tuple(b)
            if key not in errors:
                batch = collated(folder, b, model)
                errors[key] = (batch, model(batch.to_dict(), training=True, compute_force=True))
            batch, pred = errors[key]
            total += float(distributed_loss(batch, pred, graphs, atoms, 1, cfg))
        return total

    balanced = epoch_loss(uneven, epoch_mean=True)
    assert balanced == pytest.approx(epoch_loss(fixed, epoch_mean=True), rel=1e-12)
    assert epoch_loss(uneven, epoch_mean=False) != pytest.approx(balanced, rel=1e-3)
    energies = epoch_loss(fixed, epoch_mean=False, forces_weight=0.0)
    assert energies == pytest.approx(epoch_loss(uneven, epoch_mean=True, forces_weight=0.0),
                                     rel=1e-12)


def test_loss_normalization_follows_the_variant():
    for variant, mode, expected in [("baseline", "auto", False), ("balancer", "auto", True),
                                    ("both", "auto", True), ("kernel", "auto", False),
                                    ("matched", "auto", False), ("both", "step", False),
                                    ("baseline", "epoch", True)]:
        cfg = config_mod.load_config(overrides=[f"variant={variant}",
                                                f"optim.loss_normalization={mode}"])
        assert cfg.epoch_normalized is expected, (variant, mode)
