"""The tables the figures are drawn from, checked number by number on known inputs: speed-ups
are the baseline's median epoch time over the variant's, scaling efficiencies follow the
paper's formulas, older summaries and simulator tables are read with their defaults, and every
figure's CSV written by `cfmtrain figure` holds those numbers."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest
from helpers import goal_rounds, summary, write_run, write_simulated, write_store

from cfmtrain.measure.group_tables import PairedRecord, paired_rows
from cfmtrain.plots import cells, cli, ratios, simulated
from cfmtrain.tables import write_table


@pytest.fixture
def ablation_cells(tmp_path):
    """Two (data set, ranks) groups; the balancer cells in the older format."""
    return [summary(tmp_path, "mini_s", "baseline", 1, 10.0, (9.0, 12.0)),
            summary(tmp_path, "mini_s", "both", 1, 4.0, (3.8, 4.4), contended=True),
            summary(tmp_path, "mini_s", "balancer", 1, 8.0),
            summary(tmp_path, "mini_m", "kernel", 2, 15.0, (14.0, 15.0)),
            summary(tmp_path, "mini_m", "baseline", 2, 30.0, (30.0, 33.0))]


def test_speedup_is_baseline_median_over_variant_median(ablation_cells):
    table = cells.speedup_table(cells.cells_table(ablation_cells))
    assert list(table.columns) == ["dataset", "ranks", "variant", "epoch_time_s",
                                   "epoch_time_min_s", "epoch_time_max_s", "speedup",
                                   "speedup_p10", "speedup_p90", "rounds", "contended"]
    # groups in input order, variants in the canonical order within a group
    assert list(zip(table.dataset, table.variant, strict=True)) == [
        ("mini_s", "baseline"), ("mini_s", "balancer"), ("mini_s", "both"),
        ("mini_m", "baseline"), ("mini_m", "kernel")]
    row = table.set_index(["dataset", "variant"])
    assert row.speedup.tolist() == pytest.approx([1.0, 10 / 8, 10 / 4, 1.0, 30 / 15])
    # the older summary: min = max = its epoch time, not contended
    assert row.loc[("mini_s", "balancer"), ["epoch_time_min_s", "epoch_time_max_s"]].tolist() \
        == [8.0, 8.0]
    assert row.contended.tolist() == [False, False, True, False, False]
    low, high = cells.speedup_range(table)
    assert low.tolist() == pytest.approx([10 / 12, 10 / 8, 10 / 4.4, 30 / 33, 30 / 15])
    assert high.tolist() == pytest.approx([10 / 9, 10 / 8, 10 / 3.8, 30 / 30, 30 / 14])
    assert (table["rounds"] == 0).all() and table.speedup_p10.isna().all()


def test_a_groups_paired_ratios_give_its_speedups_and_their_range(ablation_cells, tmp_path):
    """mini_s's group measured in paired rounds (paired.csv as `cfmtrain rounds` writes it):
    its speed-ups are the per-round medians, the error bars their 10-90% range; mini_m's
    cells, without a paired.csv, keep the ratio of medians."""
    rounds = goal_rounds({"baseline": 10.0, "balancer": 8.0, "both": 4.0}, width=0.05)
    paired = tmp_path / "mini_s" / "r1" / "paired.csv"
    paired.parent.mkdir(parents=True)
    write_table(paired, paired_rows(rounds, "mini_s", 1), PairedRecord)
    table = cells.speedup_table(*cells.read_inputs([*ablation_cells, paired]))
    row = table.set_index(["dataset", "variant"])
    expected = {v: np.quantile(rounds.times("baseline") / rounds.times(v), [0.1, 0.5, 0.9])
                for v in ("balancer", "both")}
    for variant, (p10, median, p90) in expected.items():
        got = row.loc[("mini_s", variant)]
        assert (got.speedup, got.speedup_p10, got.speedup_p90) == pytest.approx((median, p10, p90))
        assert got["rounds"] == 5
    assert row.loc[("mini_s", "both"), "speedup"] == pytest.approx(2.5)  # 10 / 4: noise median 0
    assert row.loc[("mini_m", "kernel"), "speedup"] == pytest.approx(2.0)
    assert row.loc[("mini_m", "kernel"), "rounds"] == 0
    low, high = cells.speedup_range(table)
    at = (table.dataset == "mini_s") & (table.variant == "both")
    assert (low[at].iloc[0], high[at].iloc[0]) == pytest.approx(tuple(expected["both"][[0, 2]]))
    at = (table.dataset == "mini_m") & (table.variant == "kernel")
    assert (low[at].iloc[0], high[at].iloc[0]) == pytest.approx((30 / 15, 30 / 14))
    fig06 = figure("fig06_ablation", [*ablation_cells, paired], tmp_path / "f" / "fig06.png")
    pd.testing.assert_frame_equal(fig06, table, check_dtype=False)
    fig07 = figure("fig07_strong_scaling", [ablation_cells[0], ablation_cells[1], paired],
                   tmp_path / "f" / "fig07.png")
    assert fig07.set_index("variant").loc["both", "speedup"] == pytest.approx(
        expected["both"][1])
    # strong scaling of one variant alone needs no baseline: no speed-up, no rounds
    alone = cells.strong_scaling_table(cells.cells_table([ablation_cells[1]]))
    assert alone.speedup.isna().all() and (alone["rounds"] == 0).all()
    with pytest.raises(ValueError, match=r"bad/paired.csv: not a paired.csv"):
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "paired.csv").write_text("a,b\n1,2\n")
        cells.read_paired([tmp_path / "bad" / "paired.csv"])


def test_missing_baseline_and_bad_cells_are_named(tmp_path):
    lone = summary(tmp_path, "mini", "both", 2, 4.0, (3.0, 5.0))
    with pytest.raises(ValueError, match=r"Figure 6: no baseline.*'dataset': 'mini'"):
        cells.speedup_table(cells.cells_table([lone]), figure="Figure 6")
    with pytest.raises(ValueError, match="the same cell given twice"):
        cells.cells_table([lone, lone.parent])
    odd = summary(tmp_path, "mini", "kernel", 2, 9.0, (3.0, 5.0))
    with pytest.raises(ValueError, match=r"kernel/r2/summary.json: epoch_time_s 9.0 is not"):
        cells.cells_table([odd])
    empty = summary(tmp_path, "mini", "balancer", 2, None)  # no epoch trained: written as null
    with pytest.raises(ValueError, match=r"balancer/r2/summary.json: epoch times must be numbers"):
        cells.cells_table([empty])


def test_strong_scaling_efficiency_is_the_papers_formula(tmp_path):
    # section 5.4.1: 80 minutes at 16 GPUs, 2 at 740: 80 / (740/16 * 2) = 86.5%
    paper = pd.DataFrame({"dataset": "paper", "variant": "both", "ranks": [16, 740],
                          "t": [80.0, 2.0]})
    assert ratios.strong_efficiency(paper, "t").round(3).tolist() == [1.0, 0.865]
    paths = [summary(tmp_path, "mini", v, r, t, (t * 0.9, t * 1.1))
             for v, times in (("baseline", (100.0, 60.0, 40.0)), ("both", (50.0, 25.0, 20.0)))
             for r, t in zip((1, 2, 4), times, strict=True)]
    table = cells.strong_scaling_table(cells.cells_table(paths[::-1]))
    assert table.variant.tolist() == ["baseline"] * 3 + ["both"] * 3
    assert table.ranks.tolist() == [1, 2, 4] * 2
    assert table.strong_efficiency.tolist() == pytest.approx(
        [1.0, 100 / (2 * 60), 100 / (4 * 40), 1.0, 50 / (2 * 25), 50 / (4 * 20)])


def test_weak_scaling_efficiency(tmp_path):
    paths = [summary(tmp_path, "mini_s", "baseline", 1, 10.0, (9.5, 10.5)),
             summary(tmp_path, "mini_m", "baseline", 2, 12.5, (12.0, 13.0)),
             summary(tmp_path, "mini_s", "both", 1, 5.0, (5.0, 5.0)),
             summary(tmp_path, "mini_m", "both", 2, 5.5, (5.0, 6.0))]
    table = cells.weak_scaling_table(cells.cells_table(paths))
    assert table.weak_efficiency.tolist() == pytest.approx([1.0, 10 / 12.5, 1.0, 5 / 5.5])
    with pytest.raises(ValueError, match="same variant and ranks"):
        cells.weak_scaling_table(cells.cells_table(
            [*paths, summary(tmp_path, "mini", "both", 2, 6.0)]))


def test_simulated_tables_band_speedup_and_support(tmp_path):
    table = simulated.read_simulated(write_simulated(tmp_path / "s.csv", True, ""))
    assert len(table) == 4 and simulated.unsupported(table) == ""
    speed = simulated.simulated_speedup_table(table).set_index(["variant", "ranks"])
    assert speed.loc[("both", 740), ["speedup", "speedup_low", "speedup_high"]].tolist() == \
        pytest.approx([5.0, 0.9 * 5 / 1.5, 1.1 * 5 / 0.75])
    assert speed.loc[("baseline", 740), ["speedup", "speedup_low", "speedup_high"]].tolist() == \
        [1.0, 1.0, 1.0]
    assert simulated.headline(speed.reset_index()) == pytest.approx(
        {"ranks": 740, "speedup": 5.0, "low": 3.0, "high": 1.1 * 5 / 0.75})
    strong = simulated.simulated_strong_table(table).set_index(["variant", "ranks"])
    assert strong.strong_efficiency[("both", 740)] == pytest.approx(20 * 16 / (740 * 1.0))
    # an older table: no band, supported
    old = simulated.read_simulated(write_simulated(tmp_path / "o.csv", band=False))
    assert (old.epoch_s_low == old.epoch_s).all() and (old.epoch_s_high == old.epoch_s).all()
    assert old.supported.all() and (old.unsupported_reason == "").all()
    weak = simulated.read_simulated(write_simulated(tmp_path / "w.csv", False, "R² 0.41 < 0.95"))
    assert simulated.unsupported(weak) == "R² 0.41 < 0.95"
    assert simulated.headline(simulated.simulated_speedup_table(weak)) is None
    pd.DataFrame({"variant": ["a"], "ranks": [1]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match=r"bad.csv: not a simulator table.*epoch_s"):
        simulated.read_simulated(tmp_path / "bad.csv")


def figure(name: str, inputs: list, output, *extra: str) -> pd.DataFrame:
    """Run `cfmtrain figure`; the CSV it wrote beside the PNG (PNG and PDF checked)."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args([name, "--inputs", *map(str, inputs), "--output",
                                      str(output), *extra])) == 0
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert output.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"
    return pd.read_csv(output.with_suffix(".csv"))


@pytest.mark.slow
def test_every_measured_figure_writes_its_table(ablation_cells, tmp_path):
    out = tmp_path / "figures"
    fig06 = figure("fig06_ablation", ablation_cells, out / "fig06_ablation.png")
    pd.testing.assert_frame_equal(
        fig06, cells.speedup_table(cells.cells_table(ablation_cells)), check_dtype=False)
    assert fig06.speedup.tolist() == pytest.approx([1.0, 1.25, 2.5, 1.0, 2.0])
    fig08 = figure("fig08_speedup", ablation_cells[:3], out / "fig08_speedup.png")
    assert fig08.speedup.tolist() == pytest.approx([1.0, 1.25, 2.5])
    fig07 = figure("fig07_strong_scaling", [ablation_cells[0], ablation_cells[4]],
                   out / "fig07_strong_scaling.png")
    assert fig07.strong_efficiency.tolist() == pytest.approx([1.0, 1.0])  # two data sets
    fig10 = figure("fig10_weak_scaling", [ablation_cells[0], ablation_cells[4]],
                   out / "fig10_weak_scaling.png")
    assert fig10.weak_efficiency.tolist() == pytest.approx([1.0, 10 / 30])
    runs = [write_run(tmp_path, "mini", v, 2, seed=k, balanced=v == "both")
            for k, v in enumerate(("baseline", "both"))]
    fig09 = figure("fig09_loss", runs, out / "fig09_loss.png")
    epochs = pd.read_csv(runs[1] / "epochs.csv")
    both = fig09[fig09.variant == "both"]
    assert both.train_loss.tolist() == pytest.approx(epochs.train_loss.tolist())
    assert both.valid_loss.tolist() == pytest.approx(epochs.valid_loss.tolist())
    fig13 = figure("fig13_straggler", runs, out / "fig13_straggler.png")
    steps = pd.read_csv(runs[0] / "steps.csv")
    steps = steps[steps.epoch > 0]  # the warm-up epoch left out
    base = fig13[fig13.variant == "baseline"].set_index("rank")
    for part in cells.STEP_PARTS:
        assert base[part].tolist() == pytest.approx(steps.groupby("rank")[part].mean().tolist())
    parts = steps.groupby("rank")[list(cells.STEP_PARTS)].mean().to_numpy()
    assert base.compute_share.iloc[0] == pytest.approx(parts[:, 0].sum() / parts.sum())


@pytest.mark.slow
def test_sweep_and_simulated_figures_write_their_tables(tmp_path):
    rows = [{"molecules": m, "subset": "s", "dtype": d, "graphs": g, "distinct_graphs": g,
             "atoms": g * a, "edges": 0, "step_s": 0.1 + g * a * 1e-4,
             "status": "oom" if g * a > 2000 else "ok", "peak_rss_mb": 100.0, "error": ""}
            for m, a in (("small", 20), ("large", 500)) for d in ("float32", "float64")
            for g in (1, 2, 4, 8)]
    pd.DataFrame(rows).to_csv(tmp_path / "batch.csv", index=False)
    fig11 = figure("fig11_batch_size", [tmp_path / "batch.csv"], tmp_path / "fig11.png")
    assert fig11.step_s.tolist() == pytest.approx([r["step_s"] for r in rows])
    assert (fig11.status == "oom").sum() == 2  # 8 large molecules, each dtype
    rows = [{"dtype": d, "capacity": c, "graphs": 5, "atoms": c, "edges": 0, "step_s": c / 1e3,
             "atoms_per_s": 1e3 * min(c, 800) / c, "status": "ok", "peak_rss_mb": 100.0,
             "error": ""}
            for d in ("float32", "float64") for c in (256, 512, 1024)]
    pd.DataFrame(rows).to_csv(tmp_path / "capacity.csv", index=False)
    (tmp_path / "capacity.json").write_text('{"recommended_capacity": 512}')
    cap = figure("fig11_capacity", [tmp_path / "capacity.csv", tmp_path / "capacity.json"],
                 tmp_path / "cap.png")
    assert cap[cap.recommended].capacity.tolist() == [512, 512]
    assert cap.atoms_per_s.tolist() == pytest.approx([r["atoms_per_s"] for r in rows])
    strong = write_simulated(tmp_path / "strong.csv", True, "")
    fig08 = figure("fig08_speedup_simulated", [strong], tmp_path / "fig08s.png")
    assert fig08[fig08.ranks == 740].set_index("variant").speedup.to_dict() == \
        pytest.approx({"baseline": 1.0, "both": 5.0})
    fig07 = figure("fig07_strong_scaling_simulated", [strong], tmp_path / "fig07s.png")
    assert fig07[["epoch_s_low", "epoch_s_high"]].iloc[-1].tolist() == pytest.approx([0.75, 1.5])
    weak = write_simulated(tmp_path / "weak.csv", False, "worst validation error 126% > 15%")
    fig10 = figure("fig10_weak_scaling_simulated", [weak], tmp_path / "fig10s.png")
    assert not fig10.supported.any()
    assert set(fig10.unsupported_reason) == {"worst validation error 126% > 15%"}
    assert fig10.weak_efficiency.tolist() == pytest.approx([1.0, 100 / 5, 1.0, 20 / 1])


def test_figures_5_and_12_write_their_tables(tmp_path):
    from cfmtrain.balance.strategies import algorithm1, fixed_count
    from cfmtrain.graphs.store import GraphStore

    store_dir = write_store(tmp_path / "store", graphs_per_subset=6)
    shards = sorted(store_dir.glob("shard_*.h5"))
    store = GraphStore(store_dir)
    fig05 = figure("fig05_sizes", shards, tmp_path / "fig05_sizes_tiny.png", "--dataset", "tiny")
    assert len(fig05) == len(store) and set(fig05.dataset) == {"tiny"}
    by_graph = fig05.set_index("graph").sort_index()
    np.testing.assert_array_equal(by_graph.atoms, store.num_atoms)
    np.testing.assert_array_equal(by_graph.edges, store.num_edges)
    assert by_graph.subset.tolist() == [store.subset_names[s] for s in store.subsets]
    fig12 = figure("fig12_graphs_per_rank", shards, tmp_path / "fig12.png", "--dataset", "tiny",
                   "--capacity", "80", "--ranks", "2", "--steps", "2",
                   "--graphs-per-batch", "3", "--oversize", "own_bin")
    sizes = store.num_atoms
    plans = {"fixed_count": fixed_count(sizes, 80, 2, seed=0, graphs_per_batch=3),
             "algorithm1": algorithm1(sizes, 80, 2, oversize="own_bin", refine=False)}
    for panel, plan in plans.items():
        for step in range(2):
            for rank in range(2):
                at = (fig12.panel == panel) & (fig12.step == step) & (fig12["rank"] == rank)
                rows = fig12[at]
                placed = plan.bin(step * 2 + rank)
                assert rows.graph.tolist() == list(placed)
                assert rows["size"].tolist() == sizes[list(placed)].tolist()
                assert rows.left.tolist() == np.concatenate([[0], np.cumsum(
                    sizes[list(placed)])[:-1]]).tolist()
    assert set(fig12.capacity) == {80.0} and set(fig12.unit) == {"atoms"}
    with pytest.raises(ValueError, match="--dataset"):
        figure("fig05_sizes", shards, tmp_path / "x.png")
