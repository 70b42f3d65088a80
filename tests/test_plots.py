"""Every figure of `cfmtrain figure` drawn from small fixture results in the training's, the
sweeps' and the simulator's formats: PNG and PDF written, bad inputs rejected by name."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest
from run_fixtures import write_run

from cfmtrain.plots import cli


def draw(name: str, inputs: list, output) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args([name, "--inputs", *map(str, inputs),
                                      "--output", str(output)])) == 0
    assert output.stat().st_size > 1000
    assert output.with_suffix(".pdf").stat().st_size > 1000


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    cells = {}
    for dataset, ranks in (("mini_s", 1), ("mini", 1), ("mini", 2)):
        for k, variant in enumerate(("baseline", "balancer", "kernel", "both")):
            cost = (0.05, 2e-3 * (0.6 if variant in ("kernel", "both") else 1.0), 1e-4)
            cells[dataset, variant, ranks] = write_run(
                root, dataset, variant, ranks, cost=cost, seed=k,
                balanced=variant in ("balancer", "both"))
    return cells


def test_measured_figures(runs, tmp_path):
    mini = [runs[k] for k in runs if k[0] == "mini"]
    draw("ablation", list(runs.values()), tmp_path / "fig06.png")
    draw("strong-scaling", mini, tmp_path / "fig07.png")
    draw("speedup", mini, tmp_path / "fig08.png")
    draw("loss", [runs["mini", "baseline", 1], runs["mini", "both", 1]], tmp_path / "fig09.png")
    weak = [runs[k] for k in runs if (k[0], k[2]) in (("mini_s", 1), ("mini", 2))]
    draw("weak-scaling", weak, tmp_path / "fig10.png")
    draw("straggler", [runs["mini", "baseline", 2], runs["mini", "both", 2]],
         tmp_path / "fig13.png")


def test_sweep_figures(tmp_path):
    rows = [{"molecules": m, "subset": "s", "dtype": d, "graphs": g, "atoms": g * a, "edges": 0,
             "step_s": 0.1 + g * a * 1e-4, "status": "oom" if g * a > 2000 else "ok"}
            for m, a in (("small", 20), ("large", 500)) for d in ("float32", "float64")
            for g in (1, 2, 4, 8)]
    pd.DataFrame(rows).to_csv(tmp_path / "batch.csv", index=False)
    draw("batch-size", [tmp_path / "batch.csv"], tmp_path / "fig11.png")
    rows = [{"dtype": d, "capacity": c, "graphs": 5, "atoms": c, "edges": 0, "step_s": c / 1e3,
             "atoms_per_s": 1e3 * min(c, 800) / c, "status": "ok"}
            for d in ("float32", "float64") for c in (256, 512, 1024)]
    pd.DataFrame(rows).to_csv(tmp_path / "capacity.csv", index=False)
    (tmp_path / "capacity.json").write_text('{"recommended_capacity": 512}')
    draw("capacity", [tmp_path / "capacity.csv", tmp_path / "capacity.json"],
         tmp_path / "cap.png")


def test_simulated_figures(tmp_path):
    rows = [{"run": v, "variant": v, "ranks": r, "epoch_s": t * 2000 / r ** f, "strategy": "x"}
            for v, t, f in (("baseline", 6, 0.8), ("balancer", 3, 0.9), ("kernel", 4, 0.8),
                            ("both", 1, 0.95)) for r in (1, 16, 64, 740)]
    pd.DataFrame(rows).to_csv(tmp_path / "strong.csv", index=False)
    weak = pd.DataFrame(rows).assign(dataset="1M graphs")
    weak.to_csv(tmp_path / "weak.csv", index=False)
    draw("strong-scaling-simulated", [tmp_path / "strong.csv"], tmp_path / "fig07s.png")
    draw("speedup-simulated", [tmp_path / "strong.csv"], tmp_path / "fig08s.png")
    draw("weak-scaling-simulated", [tmp_path / "weak.csv"], tmp_path / "fig10s.png")


def test_bad_inputs_named(tmp_path, runs):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"x": [1]}).to_csv(bad, index=False)
    with pytest.raises(ValueError, match="bad.csv"):
        draw("batch-size", [bad], tmp_path / "x.png")
    with pytest.raises(FileNotFoundError, match="summary.json"):
        draw("ablation", [tmp_path], tmp_path / "x.png")
    with pytest.raises(ValueError, match="no baseline"):
        draw("ablation", [runs["mini", "both", 1]], tmp_path / "x.png")
