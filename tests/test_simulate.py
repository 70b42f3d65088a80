"""The simulator against hand-computed cases and torch's own sampler; the cost model against
known coefficients; validation and the CLI on fixture runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from run_fixtures import write_run, write_store

from cfmtrain.simulate.allreduce import Network, ring_allreduce_s, tree_allreduce_s
from cfmtrain.simulate.costmodel import CostModel, fit_cost_model
from cfmtrain.simulate.runs import load_runs
from cfmtrain.simulate.schedule import bins_schedule, fixed_count_schedule
from cfmtrain.simulate.simulator import scaling_table, simulate_epoch
from cfmtrain.simulate.sizes import Sizes, table3_mixture
from cfmtrain.simulate.validate import cross_validate, fit_variants


def sizes_of(atoms, edges) -> Sizes:
    atoms, edges = np.asarray(atoms, np.int64), np.asarray(edges, np.int64)
    return Sizes(atoms, edges, np.zeros(len(atoms), np.int64), ["all"], "test")


def test_allreduce_formulas():
    assert ring_allreduce_s(1, 1e9, 1e-3, 1e9) == 0.0
    assert ring_allreduce_s(4, 8e9, 1e-3, 1e9) == pytest.approx(2 * 3 * 1e-3 + 2 * 3 / 4 * 8)
    assert tree_allreduce_s(8, 1e9, 1e-3, 1e9) == pytest.approx(2 * 3 * (1e-3 + 1.0))
    with pytest.raises(ValueError, match="algorithm"):
        Network(algorithm="butterfly")


def test_two_ranks_hand_computed():
    # Bins {0} and {1, 2, 3} on two ranks: one step; rank 1 is the straggler.
    sizes = sizes_of([10, 20, 30, 40], [100, 200, 300, 400])
    schedule = bins_schedule(sizes, np.array([0, 1, 2, 3]), np.array([0, 1, 4]), ranks=2)
    model = CostModel("v", intercept_s=1.0, per_atom_s=0.1, per_edge_s=0.01, data_wait_s=0.5)
    net = Network(alpha_s=1e-3, beta_bytes_per_s=1e9)
    est = simulate_epoch(schedule, model, net, gradient_bytes=1e9)
    # rank 0: 0.5 + 1 + 1 + 1 = 3.5; rank 1: 0.5 + 1 + 9 + 9 = 19.5; ring: 2e-3 + 1.
    assert est.steps == 1
    assert est.slowest_compute_s == pytest.approx(19.5, rel=1e-12)
    assert est.allreduce_s == pytest.approx(1.002, rel=1e-12)
    assert est.epoch_s == pytest.approx(20.502, rel=1e-12)
    assert est.balance == pytest.approx((3.5 + 19.5) / 2 / 19.5)


def test_three_bins_two_ranks_idle_rank():
    # Three bins on two ranks: step 2 has one idle rank, which costs nothing.
    sizes = sizes_of([10, 20, 30], [0, 0, 0])
    schedule = bins_schedule(sizes, np.array([0, 1, 2]), np.array([0, 1, 2, 3]), ranks=2)
    model = CostModel("v", intercept_s=1.0, per_atom_s=1.0, per_edge_s=0.0)
    est = simulate_epoch(schedule, model, Network(alpha_s=0.5, beta_bytes_per_s=1.0), 0.0)
    assert est.steps == 2
    assert est.epoch_s == pytest.approx(max(11, 21) + 31 + 2 * (2 * 0.5))


def test_fixed_count_matches_torch_distributed_sampler():
    torch = pytest.importorskip("torch")
    from torch.utils.data import BatchSampler, DistributedSampler

    n, ranks, per_batch = 23, 3, 4
    rng = np.random.default_rng(1)
    sizes = sizes_of(rng.integers(1, 100, n), rng.integers(0, 1000, n))
    order = np.arange(n)
    schedule = fixed_count_schedule(sizes, ranks, per_batch, order=order)
    for rank in range(ranks):
        sampler = DistributedSampler(range(n), num_replicas=ranks, rank=rank, shuffle=False)
        batches = list(BatchSampler(list(sampler), per_batch, drop_last=False))
        assert len(batches) == schedule.steps
        for step, batch in enumerate(batches):
            assert schedule.atoms[step, rank] == sizes.atoms[batch].sum()
            assert schedule.edges[step, rank] == sizes.edges[batch].sum()
            assert schedule.graphs[step, rank] == len(batch)
    del torch


def test_cost_model_recovers_known_coefficients(tmp_path):
    folder = write_run(tmp_path, "d", "baseline", 2, cost=(0.05, 2e-3, 1e-4), noise=0.01,
                       steps_per_epoch=40, optim_s=0.01)
    steps = load_runs([folder])[0].steps()
    model = fit_cost_model(steps, "baseline")
    assert model.intercept_s == pytest.approx(0.05, rel=0.2)
    assert model.per_atom_s == pytest.approx(2e-3, rel=0.05)
    assert model.per_edge_s == pytest.approx(1e-4, rel=0.1)
    assert model.data_wait_s == pytest.approx(0.002)
    assert model.r2 > 0.99 and model.mean_rel_error < 0.02


def test_cost_model_rejects_bad_logs():
    frame = pd.DataFrame({"atoms": [1, 2, 3], "edges": [1, 2, 3], "data_s": 0.0, "optim_s": 0.0,
                          "compute_s": [1.0, float("nan"), 2.0]})
    with pytest.raises(ValueError, match="non-finite"):
        fit_cost_model(frame, "x")
    with pytest.raises(ValueError, match="lacks columns"):
        fit_cost_model(frame.drop(columns="edges"), "x")


def test_cross_validation_exact_model(tmp_path):
    # Noise-free linear costs: a model fitted on 1 rank predicts 2 ranks' work exactly.
    runs = load_runs([write_run(tmp_path, "d", "baseline", r, seed=r) for r in (1, 2)])
    table = cross_validate(runs, Network(alpha_s=0.005, beta_bytes_per_s=1e12), 0.0)
    assert set(table.fit_on) == {"d/r1", "d/r2"}
    assert np.allclose(table.work_rel_error, 0.0, atol=1e-6)
    assert np.allclose(table.step_mean_abs_rel_error, 0.0, atol=1e-6)
    r2 = table[table.validated_on == "d/r2"].iloc[0]
    # Fixture all-reduce 0.01 s per step = the ring's 2(R-1)alpha with alpha 0.005.
    assert r2.epoch_rel_error == pytest.approx(0.0, abs=1e-6)
    assert set(fit_variants(runs)) == {"baseline"}


def test_scaling_table_balanced_beats_fixed_count():
    rng = np.random.default_rng(0)
    atoms = rng.integers(1, 500, 4000)
    sizes = sizes_of(atoms, atoms * 30)
    model = CostModel("baseline", 0.01, 1e-4, 1e-6)

    def fixed(s, r):
        return fixed_count_schedule(s, r, 8)

    def sorted_bins(s, r):  # ideal-ish: deal equal-atom bins from a size-sorted greedy pack
        order = np.argsort(-s.atoms, kind="stable")
        loads, members = np.zeros(max(r, len(s.atoms) // 8 // r * r)), None
        members = [[] for _ in loads]
        for g in order:
            k = int(np.argmin(loads))
            loads[k] += s.atoms[g]
            members[k].append(g)
        flat = np.concatenate([np.array(m, np.int64) for m in members])
        return bins_schedule(s, flat, np.cumsum([0] + [len(m) for m in members]), r)

    table = scaling_table(sizes, {"fixed": (fixed, model), "balanced": (sorted_bins, model)},
                          [1, 4, 16], Network(), 4 * 1e6)
    at16 = table[table.ranks == 16].set_index("run")
    assert at16.loc["balanced", "epoch_s"] < at16.loc["fixed", "epoch_s"]
    assert at16.loc["balanced", "balance"] > 0.99 > at16.loc["fixed", "balance"]
    first = table[table.ranks == 1]
    assert np.allclose(first.strong_efficiency, 1.0)


def test_table3_mixture_shape():
    from cfmtrain.data.mini import SUBSETS

    sizes = table3_mixture({n: 30.0 for n in SUBSETS}, total=100_000, seed=0)
    assert len(sizes.atoms) == 100_000 and sorted(sizes.subset_names) == sorted(SUBSETS)
    assert sizes.atoms.min() >= 1 and sizes.atoms.max() == 768
    water = sizes.subset_names.index("liquid_water")
    assert np.all(sizes.atoms[sizes.subsets == water] == 768)
    assert math.isclose((sizes.subsets == water).mean(), 190_267 / 2_650_823, rel_tol=0.01)
    with pytest.raises(ValueError, match="edges-per-atom"):
        table3_mixture({"mptrj": 30.0}, total=10)


def run_command(module, argv: list[str]) -> int:
    """`cfmtrain <command> argv` through the module's own add_arguments/run."""
    import argparse

    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


def test_cli_writes_tables(tmp_path):
    from cfmtrain.simulate import cli

    store = write_store(tmp_path / "graphs")
    runs = [write_run(tmp_path, "d", v, r, seed=r, cost=cost)
            for v, cost in (("baseline", (0.05, 2e-3, 1e-4)), ("kernel", (0.04, 1e-3, 5e-5)),
                            ("both", (0.04, 1e-3, 5e-5)))
            for r in (1, 2)]
    out = tmp_path / "sim"
    code = run_command(cli, ["--runs", *map(str, runs), "--graphs", str(store),
                 "--total-graphs", "20000", "--ranks", "1", "2", "16", "--weak", "0.5:2", "1:4",
                 "--capacity", "600", "--validation-parameters", "1000",
                 "--output-dir", str(out)])
    assert code == 0
    strong = pd.read_csv(out / "strong.csv").set_index(["variant", "ranks"])
    assert set(strong.index) == {(v, r) for v in ("baseline", "kernel", "both") for r in (1, 2, 16)}
    assert (strong.epoch_s > 0).all()
    # Same cost model: Algorithm 1 bins balance the ranks better than the fixed count.
    assert strong.loc[("both", 16), "balance"] > strong.loc[("kernel", 16), "balance"]
    assert len(pd.read_csv(out / "weak.csv")) == 6
    assert len(pd.read_csv(out / "strategies.csv")) == 6
    validation = pd.read_csv(out / "validation.csv")
    assert len(validation) == 6 and (validation.work_rel_error.abs() < 1e-6).all()
    text = (out / "paper.md").read_text()
    assert "740" in text and "Assumptions" in text
    fits = pd.read_csv(out / "fit.csv").set_index("variant")
    assert fits.loc["kernel", "per_atom_s"] == pytest.approx(1e-3, rel=1e-3)
