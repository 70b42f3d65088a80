"""100 training steps of a paper-shaped MACE (channels reduced) on `mini` graphs through cfmtrain's
own build_run and train_step: the fused kernels against mace-torch, loss curves and weights."""

from __future__ import annotations

from pathlib import Path

import e3nn
import mace  # noqa: F401  (import mace before e3nn)
import numpy as np
import pytest
import torch
from e3nn import o3
from mace.modules.symmetric_contraction import SymmetricContraction
from torch_ema import ExponentialMovingAverage

from cfmtrain.graphs.build import atoms_to_graph
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.kernels.conv import FusedChannelwiseConv
from cfmtrain.kernels.symmetric_contraction import SymmetricContractionFused
from cfmtrain.ranks.distenv import DistEnv
from cfmtrain.sources.mini import make_frame
from cfmtrain.train.build import build_run
from cfmtrain.train.config import load_config
from cfmtrain.train.loop import train_step
from cfmtrain.train.metrics import StepTimes

pytestmark = pytest.mark.slow  # 100 steps of 4 runs: about 20 s

CUTOFF = 4.5
STEPS = 100
EPS32 = float(np.finfo(np.float32).eps)
# (subset, frame) of mini (seed 0): a non-periodic water cluster (H, O), periodic EMT crystals
# and a metal sheet with vacuum (tmd) holding all of mini's metals (Al, Ni, Cu, Pd, Ag, Pt, Au),
# among them a 1-atom cell whose only neighbours are its own periodic images. Small frames: the
# cost of mace-torch's step grows with the atoms, and 400 steps must take seconds
FRAMES = [("water_clusters", 31), ("mptrj", 0), ("tmd", 13), ("mptrj", 15), ("mptrj", 27),
          ("mptrj", 3)]
BATCHES = [[0, 1], [2], [3], [4, 5]]  # positions in FRAMES (10-16 atoms), cycled in this order
# the paper's model with 8 instead of 128 channels: lmax 3, correlation 3, 2 layers,
# radial MLP [64, 64, 64]; and the product's optimiser defaults (Adam amsgrad, lr 0.005, weight
# decay, clipping, EMA, energy weight 1, forces weight 100)
MODEL = ["model.hidden_irreps=8x0e+8x1o", "model.max_ell=3", "model.correlation=3",
         "model.num_interactions=2", f"model.r_max={CUTOFF}", "progress=false",
         "measure_straggler=false", "threads=1"]
MACE64, FUSED64, MACE32, FUSED32 = RUNS = [("baseline", "float64"), ("kernel", "float64"),
                                           ("baseline", "float32"), ("kernel", "float32")]


@pytest.fixture(scope="module")
def mini_store(tmp_path_factory) -> tuple[Path, Path]:
    """A one-shard store of the FRAMES of mini and a split training on all of them."""
    folder = tmp_path_factory.mktemp("mini_graphs")
    graphs = []
    for i, (subset, index) in enumerate(FRAMES):
        graph = atoms_to_graph(make_frame(0, subset, index), CUTOFF)
        graph.pop("min_length", None)  # not a stored field
        graph["source_index"] = i
        graphs.append(graph)
    write_shard(folder / "shard_0000.h5", graphs, cutoff=CUTOFF)
    empty = np.zeros(0, np.int64)
    np.savez(folder / "split.npz", train=np.arange(len(FRAMES)), valid=empty, test=empty)
    return folder, folder / "split.npz"


def train(variant: str, precision: str, store: Path, split: Path, out: Path,
          start: dict | None) -> dict:
    """STEPS calls of train_step on BATCHES, cycled, of a run made by build_run; the run's own
    initial weights are replaced by `start` (float64, rounded to the run's dtype) if given."""
    cfg = load_config(overrides=[*MODEL, f"variant={variant}", f"model.dtype={precision}"])
    run = build_run(cfg, store, split, out, DistEnv(), torch.device("cpu"))
    params = dict(run.model.named_parameters())
    initial = {k: p.detach().to(torch.float64, copy=True) for k, p in params.items()}
    if start is not None:
        assert params.keys() == start.keys()
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(start[name])
        run.ema = ExponentialMovingAverage(run.params, decay=cfg.optim.ema_decay)
    batches = list(run.make_loader(run.train_set, BATCHES))
    losses = []
    for step in range(STEPS):
        batch = batches[step % len(batches)]
        loss, _, _ = train_step(run, batch, float(batch.num_graphs), float(batch.num_nodes),
                                step, StepTimes())
        losses.append(loss)
    return {"model": run.model, "initial": initial, "losses": np.array(losses),
            "final": {k: p.detach().to(torch.float64, copy=True) for k, p in params.items()}}


@pytest.fixture(scope="module")
def runs(mini_store, tmp_path_factory) -> dict:
    """The four RUNS (mace-torch and fused, float64 and float32), all from mace-torch float64's
    initial weights. One thread; e3nn's TorchScript compilation off (the same numbers, faster)."""
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    options = e3nn.get_optimization_defaults()
    torch.set_num_threads(1)
    e3nn.set_optimization_defaults(jit_script_fx=False)
    try:
        results: dict = {}
        for variant, precision in RUNS:
            start = results[MACE64]["initial"] if results else None
            out = tmp_path_factory.mktemp(f"{variant}_{precision}")
            results[variant, precision] = train(variant, precision, *mini_store, out, start)
        return results
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        e3nn.set_optimization_defaults(**options)


def test_frames_cover_subsets_periodic_and_not(mini_store):
    store = GraphStore(mini_store[0])
    assert set(store.subset_names) == {subset for subset, _ in FRAMES}
    periodic = [bool(store[i]["pbc"].all()) for i in range(len(store))]
    assert periodic == [subset != "water_clusters" for subset, _ in FRAMES]
    assert min(store.num_atoms) == 1 and set(np.concatenate(
        [store[i]["numbers"] for i in range(len(store))])) == {1, 8, 13, 28, 29, 46, 47, 78, 79}


def test_runs_use_the_kernels_they_claim(runs):
    for (variant, precision), result in runs.items():
        model = result["model"]
        fused = variant == "kernel"
        contractions = [p.symmetric_contractions for p in model.products]
        convs = [block.conv_tp for block in model.interactions]
        assert len(contractions) == len(convs) == 2
        expected_sc = SymmetricContractionFused if fused else SymmetricContraction
        expected_conv = FusedChannelwiseConv if fused else o3.TensorProduct
        assert all(type(sc) is expected_sc for sc in contractions)
        assert all(type(conv) is expected_conv for conv in convs)
        assert all(p.dtype == getattr(torch, precision) for p in model.parameters())
    # build_run gives both variants the same initial weights (only float32 ones are copied in)
    fused_initial = runs[FUSED64]["initial"]
    assert all(torch.equal(p, fused_initial[k]) for k, p in runs[MACE64]["initial"].items())


def test_training_decreases_every_batch_loss(runs):
    cycle = len(BATCHES)
    for result in runs.values():
        losses = result["losses"]
        assert np.isfinite(losses).all()
        # each batch's loss in the last cycle is under half its loss in the first
        assert (losses[-cycle:] < 0.5 * losses[:cycle]).all(), losses


def test_float64_curves_and_weights_equal_mace(runs):
    """The fused step is the same function as mace-torch's: float64 to 1e-10 over 100 steps."""
    ref, ours = runs[MACE64], runs[FUSED64]
    assert np.abs(ours["losses"] - ref["losses"]).max() <= 1e-10 * ref["losses"].min()
    assert relative_l2(ours["final"], ref["final"]) <= 1e-10
    for name, p in ref["final"].items():
        assert (ours["final"][name] - p).abs().max() <= 1e-8 * p.abs().max(), name


def test_float32_curves_within_twice_mace_float32_error(runs):
    """Against the float64 curve, fused float32 is off by at most twice mace-torch float32's
    error: at every step against the largest error mace-torch's has reached by then (at a
    single step its error can be near zero by chance: a step-by-step comparison failed at 2 of
    100 steps on an AVX-512 host while the running bound holds with a factor 0.54), up to a
    floor of 8 float32 roundings of the loss; in RMS over every 20 steps; and in the final
    weights. Both errors grow to ~1e-6 relative in 100 steps."""
    exact = runs[MACE64]["losses"]
    ours = np.abs(runs[FUSED32]["losses"] - exact) / exact
    mace32 = np.abs(runs[MACE32]["losses"] - exact) / exact
    assert mace32.max() > 0  # float32 really differs from float64
    reached = np.maximum.accumulate(mace32)
    assert (ours <= 2 * reached + 8 * EPS32).all(), np.c_[ours, reached]
    windows = (-1, 20)
    rms_ours = np.sqrt(np.mean(ours.reshape(windows) ** 2, axis=1))
    rms_mace = np.sqrt(np.mean(mace32.reshape(windows) ** 2, axis=1))
    assert (rms_ours <= 2 * rms_mace).all(), np.c_[rms_ours, rms_mace]
    final = runs[MACE64]["final"]
    assert relative_l2(runs[FUSED32]["final"], final) <= 2 * relative_l2(runs[MACE32]["final"],
                                                                         final)


def relative_l2(params: dict, reference: dict) -> float:
    """|params - reference| / |reference| over all parameters together."""
    diff = sum(float((params[k] - p).square().sum()) for k, p in reference.items())
    norm = sum(float(p.square().sum()) for p in reference.values())
    return float(np.sqrt(diff / norm))
