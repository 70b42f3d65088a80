"""The simulator against hand-computed cases and torch's own sampler; the cost model against
known coefficients; validation and the CLI on fixture runs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import write_group, write_run, write_store

from cfmtrain.simulate.allreduce import Network, ring_allreduce_s, tree_allreduce_s
from cfmtrain.simulate.cli import kernels_of, verdict
from cfmtrain.simulate.costmodel import CostModel, fit_cost_model
from cfmtrain.simulate.schedule import bins_schedule, fixed_count_schedule
from cfmtrain.simulate.simulator import scaling_table, simulate_epoch
from cfmtrain.simulate.sizes import Sizes, table3_mixture
from cfmtrain.simulate.validate import cross_validate
from cfmtrain.sweep.calibrate import CalibrationPoint
from cfmtrain.train.runs import load_runs


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


LAW = (0.05, 2e-3, 1e-4)  # the fixture runs' cost: c0, per atom, per edge


def calibration_points(law=LAW, noise=0.0, seed=0, sizes=(64, 128, 256, 512, 1024, 2048, 3072)
                       ) -> pd.DataFrame:
    """Calibration rows of sparse (10 edges/atom) and dense (35) batches timed under `law`
    with multiplicative Gaussian noise of relative size `noise`."""
    rng = np.random.default_rng(seed)
    atoms = np.array([a for a in sizes for _ in (0, 1)], float)
    edges = np.rint(atoms * np.tile([10.0, 35.0], len(sizes)))
    true = law[0] + law[1] * atoms + law[2] * edges
    step = true * (1 + noise * rng.standard_normal(len(true)))
    return pd.DataFrame({"atoms": atoms, "edges": edges, "status": "ok", "step_s": step * 1.05,
                         "step_cpu_s": step})  # the cost is the CPU time; wall a bit more


def test_fit_recovers_a_known_cost_law():
    model = fit_cost_model(calibration_points(noise=0.01), "baseline", column="step_cpu_s")
    assert model.intercept_s == pytest.approx(LAW[0], rel=0.1)
    assert model.per_atom_s == pytest.approx(LAW[1], rel=0.05)
    assert model.per_edge_s == pytest.approx(LAW[2], rel=0.1)
    assert model.r2 > 0.99 and model.mean_rel_error < 0.02 and model.dof == 11
    exact = fit_cost_model(calibration_points(), "baseline", column="step_cpu_s")
    assert exact.coefficients == pytest.approx(np.array(LAW), rel=1e-6)
    assert np.allclose(exact.covariance, 0.0, atol=1e-12)  # no residual, no spread


def test_cost_model_rejects_bad_points():
    frame = calibration_points()
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_cost_model(frame.assign(step_s=frame.step_s.where(frame.atoms != 512)), "x")
    with pytest.raises(ValueError, match="lack columns"):
        fit_cost_model(frame.drop(columns="edges"), "x")
    with pytest.raises(ValueError, match="need at least 4"):
        fit_cost_model(frame.head(3), "x")


def test_weak_fit_is_refused_with_the_reason():
    rng = np.random.default_rng(3)
    noise = calibration_points().assign(step_s=rng.uniform(0.5, 1.5, 14))  # no size law at all
    model = fit_cost_model(noise, "baseline", column="step_s")
    assert model.r2 < 0.5
    passed = {"supported": True, "unsupported_reason": "", "worst_ratio_error": 0.03,
              "held_out": "d/r2", "held_out_error": 0.02}
    judged = verdict(model, passed, min_r2=0.95)
    assert not judged["supported"]
    assert judged["unsupported_reason"] == f"calibration fit R² {model.r2:.3f} < 0.95"
    good = fit_cost_model(calibration_points(noise=0.01), "baseline", column="step_cpu_s")
    judged = verdict(good, passed, 0.95)
    assert judged["supported"] and judged["worst_ratio_error"] == 0.03
    failed = {**passed, "supported": False, "unsupported_reason": "held-out d/r2 both: off"}
    judged = verdict(good, failed, 0.95)
    assert not judged["supported"] and judged["unsupported_reason"] == "held-out d/r2 both: off"


def epoch_of(law, schedule) -> float:
    """An epoch's seconds under a known law (no all-reduce): the slowest rank of each step."""
    times = law[0] + law[1] * schedule.atoms + law[2] * schedule.edges
    return float(np.where(schedule.graphs > 0, times, 0.0).max(axis=1).sum())


def test_band_contains_the_truth():
    rng = np.random.default_rng(0)
    atoms = rng.integers(5, 400, 3000)
    sizes = sizes_of(atoms, atoms * rng.integers(10, 35, 3000))
    schedule = fixed_count_schedule(sizes, 4, 8)
    truth = epoch_of(LAW, schedule)
    net = Network(alpha_s=0.0, beta_bytes_per_s=1e12)
    inside, widths = 0, []
    for seed in range(200):
        model = fit_cost_model(calibration_points(noise=0.05, seed=seed), "v", column="step_cpu_s")
        est = simulate_epoch(schedule, model, net, 0.0)
        assert est.epoch_s_low <= est.epoch_s <= est.epoch_s_high
        inside += est.epoch_s_low <= truth <= est.epoch_s_high
        widths.append((est.epoch_s_high - est.epoch_s_low) / truth)
    assert inside >= 180  # a 95% band: at least 90% of 200 fits contain the true epoch time
    assert 0.005 < np.median(widths) < 0.2  # and it is a band, not everything
    model = fit_cost_model(calibration_points(noise=0.05, seed=1), "v", column="step_cpu_s")
    model.model_error = 0.1  # the error seen on measured cells widens it by that much
    wide = simulate_epoch(schedule, model, net, 0.0)
    model.model_error = 0.0
    narrow = simulate_epoch(schedule, model, net, 0.0)
    assert wide.epoch_s_low == pytest.approx(narrow.epoch_s_low * 0.9)
    assert wide.epoch_s_high == pytest.approx(narrow.epoch_s_high * 1.1)


def test_accelerator_cost_is_flat_below_saturation():
    cpu = CostModel("v", intercept_s=0.05, per_atom_s=2e-3, per_edge_s=1e-4)
    gpu = dataclasses.replace(cpu, saturation_atoms=800)
    atoms = np.array([1, 10, 100, 400, 799, 800])
    flat = gpu.compute_s(atoms, atoms * 30)
    assert np.allclose(flat, cpu.compute_s(800, 800 * 30))  # below 800: the cost of 800
    assert np.all(np.diff(cpu.compute_s(atoms, atoms * 30)) > 0)  # the CPU case is not flat
    above = np.array([801, 1600, 3200])
    assert np.allclose(gpu.compute_s(above, above * 30), cpu.compute_s(above, above * 30))
    # a small batch keeps its edges per atom when scaled up to the saturation size
    assert gpu.compute_s(100, 100 * 10) == pytest.approx(cpu.compute_s(800, 800 * 10))


def test_variants_map_to_their_compute_paths():
    assert {v: kernels_of(v) for v in ("baseline", "balancer", "matched", "kernel", "both")} \
        == {"baseline": "mace", "balancer": "mace", "matched": "mace", "kernel": "fused",
            "both": "fused"}


def test_validation_predicts_cells_from_the_calibration(tmp_path):
    # The cells run the calibrated law exactly: every cell's work is predicted exactly, and the
    # 2-rank epoch too with the fixture's 0.01 s all-reduce = the ring's 2(R-1)alpha, alpha 0.005.
    runs = load_runs([write_run(tmp_path, "d", "baseline", r, seed=r) for r in (1, 2)])
    laws = {"mace": fit_cost_model(calibration_points(), "mace", column="step_cpu_s")}
    table = cross_validate(laws, runs, kernels_of, Network(alpha_s=0.005, beta_bytes_per_s=1e12),
                           0.0)
    assert table.validated_on.tolist() == ["d/r1", "d/r2"]
    assert table.data_wait_from.tolist() == ["d/r2", "d/r1"]  # cross-rank
    assert np.allclose(table.work_rel_error, 0.0, atol=1e-9)
    assert np.allclose(table.epoch_rel_error, 0.0, atol=1e-9)
    assert table.validated_by.tolist() == ["wall time"] * 2  # no CPU times in this step log
    assert table.validation_error.tolist() == table.epoch_rel_error.tolist()
    slower = load_runs([write_run(tmp_path / "slow", "d", "baseline", 1, cost=(0.05, 3e-3,
                                                                               1e-4))])
    off = cross_validate(laws, slower, kernels_of, Network(), 0.0)
    assert off.epoch_rel_error.iloc[0] < -0.1  # a cell slower than the calibration: seen
    # A contended cell: its compute wall time twice its CPU time, which the law predicts. Its
    # wall time is no evidence against the law; its CPU time is what it is validated by.
    folder = write_run(tmp_path / "busy", "d", "baseline", 1)
    steps = pd.read_csv(folder / "steps.csv")
    steps = steps.assign(compute_cpu_s=steps.compute_s, compute_s=2 * steps.compute_s,
                         step_s=steps.step_s + steps.compute_s)
    steps.to_csv(folder / "steps.csv", index=False)
    busy = cross_validate(laws, load_runs([folder]), kernels_of, Network(), 0.0).iloc[0]
    assert busy.contended and busy.compute_wall_cpu == pytest.approx(2.0)
    assert busy.epoch_rel_error < -0.4 and busy.cpu_rel_error == pytest.approx(0.0, abs=1e-9)
    assert busy.validated_by == "CPU time (contended cell)" and busy.validation_error == \
        busy.cpu_rel_error
    with pytest.raises(ValueError, match="no calibration of its compute path 'fused'"):
        cross_validate(laws, load_runs([write_run(tmp_path, "d", "both", 1)]), kernels_of,
                       Network(), 0.0)


def test_validation_of_flagged_cells_by_why_they_were_flagged(tmp_path):
    """A cell flagged only because the host ran slower (its CPU time on identical work up as
    much as its wall time) is validated by wall time, its CPU time being no better evidence; a
    cell whose reported repeat lost CPU to steal waited for cores and is validated by CPU time;
    a flagged summary without per-repeat measures counts as waiting too."""
    import json

    laws = {"mace": fit_cost_model(calibration_points(), "mace", column="step_cpu_s")}
    rows = {}
    for name, repeat in (("slower", {"wall_cpu_ratio": 1.01, "steal_fraction": 0.0,
                                     "cpu_slowdown": 0.3}),
                         ("stolen", {"wall_cpu_ratio": 1.01, "steal_fraction": 0.05,
                                     "cpu_slowdown": 0.0}),
                         ("old", None)):
        folder = write_run(tmp_path / name, "d", "baseline", 1)
        steps = pd.read_csv(folder / "steps.csv")
        steps.assign(compute_cpu_s=steps.compute_s).to_csv(folder / "steps.csv", index=False)
        summary = json.loads((folder / "summary.json").read_text())
        summary["contended"] = True
        if repeat is not None:
            unused = {"wall_cpu_ratio": 3.0, "steal_fraction": 0.5, "used": False}
            summary["repeats"] = [{**repeat, "contended": True, "used": True}, unused]
            summary["contention_thresholds"] = {"max_wall_cpu_ratio": 1.15,
                                                "max_steal_fraction": 0.02}
        (folder / "summary.json").write_text(json.dumps(summary))
        rows[name] = cross_validate(laws, load_runs([folder]), kernels_of, Network(),
                                    0.0).iloc[0]
    assert all(row.contended for row in rows.values())
    assert rows["slower"].validated_by == "wall time (host slower)"
    assert rows["slower"].validation_error == rows["slower"].epoch_rel_error
    for name in ("stolen", "old"):
        assert rows[name].validated_by == "CPU time (contended cell)"
        assert rows[name].validation_error == rows[name].cpu_rel_error


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
    from cfmtrain.sources.mini import SUBSETS

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


def simulate(tmp_path, calibration: pd.DataFrame, *extra: str) -> Path:
    """`cfmtrain simulate` on fixture cells (baseline, kernel, both at 1 and 2 ranks, run under
    LAW and a fused law) and `calibration`; returns the output folder."""
    from cfmtrain.simulate import cli

    store = write_store(tmp_path / "graphs")
    fused = (0.04, 1e-3, 5e-5)
    costs = {"baseline": LAW, "kernel": fused, "both": fused}
    groups = [write_group(tmp_path, "d", r, costs, seed=10 * r) for r in (1, 2)]
    runs = [g / v for g in groups for v in costs]
    path = tmp_path / "calibration.csv"
    # the columns the simulator does not use, empty (a calibration without `kernels` stays so)
    unused = [c for c in CalibrationPoint.columns() if c not in calibration and c != "kernels"]
    calibration.assign(**dict.fromkeys(unused, math.nan)).to_csv(path, index=False)
    out = tmp_path / "sim"
    code = run_command(cli, ["--runs", *map(str, runs), "--groups", *map(str, groups),
                             "--calibration", str(path),
                             "--graphs", str(store), "--total-graphs", "20000",
                             "--ranks", "1", "2", "16", "64", "740", "--weak", "0.5:2", "1:4",
                             "--capacity", "600", "--validation-parameters", "1000",
                             "--validation-alpha", "0.005", "--validation-beta", "1e12",
                             "--output-dir", str(out), *extra])
    assert code == 0
    return out


def two_paths(mace: pd.DataFrame, fused: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([mace.assign(kernels="mace"), fused.assign(kernels="fused")])


@pytest.mark.slow
def test_cli_writes_tables_with_bands_and_cases(tmp_path):
    calibration = two_paths(calibration_points(noise=0.02, seed=1),
                            calibration_points((0.04, 1e-3, 5e-5), noise=0.02, seed=2))
    # a loaded calibration: wall time 1.5x the CPU time, which is what the laws are fitted on
    out = simulate(tmp_path, calibration.assign(step_s=1.5 * calibration.step_cpu_s))
    strong = pd.read_csv(out / "strong.csv").set_index(["variant", "ranks"])
    ranks = (1, 2, 16, 64, 740)
    assert set(strong.index) == {(v, r) for v in ("baseline", "kernel", "both") for r in ranks}
    assert (strong.epoch_s > 0).all() and strong.supported.all()
    assert (strong.unsupported_reason.isna()).all() and set(strong["case"]) == {"CPU (measured)"}
    assert ((strong.epoch_s_low < strong.epoch_s) & (strong.epoch_s < strong.epoch_s_high)).all()
    # Same cost model: Algorithm 1 bins balance the ranks better than the fixed count.
    assert strong.loc[("both", 16), "balance"] > strong.loc[("kernel", 16), "balance"]
    accel = pd.read_csv(out / "strong_accelerator.csv").set_index(["variant", "ranks"])
    assert set(accel["case"]) == {"accelerator (assumed)"}
    # flat below 800 atoms: no batch costs less than on the CPU, most cost more
    assert (accel.epoch_s >= strong.epoch_s).all()
    assert accel.loc[("baseline", 1), "epoch_s"] > 1.1 * strong.loc[("baseline", 1), "epoch_s"]
    assert len(pd.read_csv(out / "weak.csv")) == 6
    assert len(pd.read_csv(out / "weak_accelerator.csv")) == 6
    assert len(pd.read_csv(out / "strategies.csv")) == 10
    validation = pd.read_csv(out / "validation.csv")
    assert len(validation) == 6 and (validation.work_rel_error.abs() < 0.05).all()
    fits = pd.read_csv(out / "fit.csv").set_index("variant")
    assert fits.loc["kernel", "kernels"] == "fused" and fits.loc["baseline", "kernels"] == "mace"
    assert fits.loc["kernel", "per_atom_s"] == pytest.approx(1e-3, rel=0.1)
    assert fits.supported.all() and (fits.r2 > 0.99).all()
    text = (out / "paper.md").read_text()
    assert "## CPU (measured)" in text and "## Accelerator (assumed)" in text
    row = next(line for line in text.splitlines() if "speedup at 740 ranks" in line)
    speedup = strong.loc[("baseline", 740), "epoch_s"] / strong.loc[("both", 740), "epoch_s"]
    low, high = (strong.loc[("baseline", 740), "epoch_s_low"] / strong.loc[("both", 740),
                 "epoch_s_high"], strong.loc[("baseline", 740), "epoch_s_high"]
                 / strong.loc[("both", 740), "epoch_s_low"])
    assert row == f"| speedup at 740 ranks (x) | 6 | {speedup:.3g} | {low:.3g} – {high:.3g} |"
    assert "Unsupported" not in text and "Assumptions" in text
    assert "its median wall/CPU ratio 1.50" in text
    ratios = pd.read_csv(out / "ratios.csv")
    assert len(ratios) == 4 and ratios.inside.all()  # kernel and both, in each group
    assert set(ratios[ratios.held_out].ranks) == {2}  # the last group given, predicted apart
    assert (fits.held_out == "d/r2").all()
    versus = pd.read_csv(out / "versus_paper.csv")
    assert len(versus) == 16 and versus.supported.all()
    top = versus[(versus.case == "CPU (measured)")
                 & versus.quantity.str.startswith("speedup at 740")]
    assert top.simulated.iloc[0] == pytest.approx(speedup)
    assert (top.low.iloc[0], top.high.iloc[0]) == pytest.approx((low, high))


@pytest.mark.slow
def test_cli_refuses_a_weak_fit_in_tables_and_paper(tmp_path):
    rng = np.random.default_rng(5)
    mace = calibration_points()
    mace = mace.assign(step_cpu_s=rng.uniform(0.5, 1.5, len(mace)))  # noise: no size law
    out = simulate(tmp_path, two_paths(mace, calibration_points((0.04, 1e-3, 5e-5))))
    strong = pd.read_csv(out / "strong.csv")
    base = strong[strong.variant == "baseline"]
    assert not base.supported.any()
    assert base.unsupported_reason.str.startswith("calibration fit R² ").all()
    assert strong[strong.variant == "both"].supported.all()
    text = (out / "paper.md").read_text()
    assert text.count("**Unsupported.**") == 2  # the CPU and accelerator cases
    assert "baseline: calibration fit R² " in text
    assert "speedup at 740" not in text  # no headline speed-up from a weak fit


def test_cli_names_a_bad_calibration(tmp_path):
    with pytest.raises(ValueError, match=r"calibration.csv: not a calibration table, missing "
                                         r"columns \['kernels'\]"):
        simulate(tmp_path, calibration_points())
    failed = two_paths(calibration_points(), calibration_points()).assign(status="oom")
    with pytest.raises(ValueError, match=r"calibration.csv: no timed point"):
        simulate(tmp_path, failed)
