"""What the figures draw, from their tables: Figure 6's bars at the speed-ups with error bars
from the repeats' min and max and contended cells hatched; Figures 8 and 10 with error bars and
contended cells ringed; the simulated figures with the fit's band, a headline only where the
fit supports it and the "unsupported" statement where it does not. Bad inputs are named."""

from __future__ import annotations

import argparse

import matplotlib.text
import numpy as np
import pandas as pd
import pytest
from helpers import summary, write_simulated

from cfmtrain.plots import ablation, cells, cli, scaling, simulated


@pytest.fixture
def drawn(monkeypatch):
    """Figures are kept (not saved) so that their artists can be inspected."""
    figures = []

    def keep(fig, output):
        figures.append(fig)
        return []

    monkeypatch.setattr(ablation, "save", keep)
    monkeypatch.setattr(scaling, "save", keep)
    return figures


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text)]


def error_bar_ends(ax) -> list[float]:
    """Low and high end of each vertical error bar of the axes, left to right."""
    ends = []
    for collection in ax.collections:
        for segment in getattr(collection, "get_segments", list)():
            (x0, y0), (x1, y1) = segment[0], segment[-1]
            if x0 == x1 and y0 != y1:
                ends.append((x0, min(y0, y1), max(y0, y1)))
    return [y for _, lo, hi in sorted(ends) for y in (lo, hi)]


def test_figure6_bars_error_bars_and_contended_hatching(tmp_path, drawn):
    paths = [summary(tmp_path, "mini", "baseline", 2, 10.0, (9.0, 12.0)),
             summary(tmp_path, "mini", "kernel", 2, 5.0, (4.0, 8.0)),
             summary(tmp_path, "mini", "both", 2, 4.0, (3.8, 4.4), contended=True)]
    table = cells.speedup_table(cells.cells_table(paths))
    ablation.draw_ablation(table, tmp_path / "f.png", "Figure 6")
    ax = drawn[0].axes[0]
    bars = [p for p in ax.patches if p.get_height() > 0 and p.get_width() < 1]
    assert [b.get_height() for b in bars] == pytest.approx([1.0, 2.0, 2.5])
    assert [bool(b.get_hatch()) for b in bars] == [False, False, True]
    assert error_bar_ends(ax) == pytest.approx([10 / 12, 10 / 9, 10 / 8, 10 / 4,
                                                10 / 4.4, 10 / 3.8])
    assert any("contended" in t for t in texts(drawn[0]))


def test_figures_8_and_10_error_bars_and_contended_rings(tmp_path, drawn):
    paths = [summary(tmp_path, "mini_s", "baseline", 1, 10.0, (9.0, 11.0)),
             summary(tmp_path, "mini_m", "baseline", 2, 12.0, (11.0, 15.0), contended=True)]
    table = cells.weak_scaling_table(cells.cells_table(paths))
    scaling.draw_weak_scaling(table, tmp_path / "f.png", "Figure 10")
    ax = drawn[0].axes[0]
    assert error_bar_ends(ax) == pytest.approx([9.0, 11.0, 11.0, 15.0])
    rings = [line for line in ax.lines if line.get_marker() == "o" and line.get_mfc() == "none"]
    assert len(rings) == 1 and rings[0].get_xydata().tolist() == [[2.0, 12.0]]
    paths = [summary(tmp_path, "mini", "baseline", 2, 10.0, (9.0, 12.0)),
             summary(tmp_path, "mini", "both", 2, 4.0, (3.8, 4.4))]
    scaling.draw_speedup(cells.speedup_table(cells.cells_table(paths)), tmp_path / "g.png", "8")
    assert error_bar_ends(drawn[1].axes[0]) == pytest.approx([10 / 12, 10 / 9,
                                                              10 / 4.4, 10 / 3.8])
    assert not any("contended" in t for t in texts(drawn[1]))


def test_simulated_band_headline_and_unsupported_statement(tmp_path, drawn):
    supported = simulated.read_simulated(write_simulated(tmp_path / "a.csv", True, ""))
    scaling.draw_speedup(simulated.simulated_speedup_table(supported), tmp_path / "a.png", "8")
    words = texts(drawn[0])
    assert any(t.startswith("5.00x at 740 ranks") and "3.00-7.33x" in t for t in words)
    assert not any("unsupported" in t for t in words)
    band = [c for c in drawn[0].axes[0].collections if c.get_array() is None]
    assert band, "the fit's band is drawn"
    weak = simulated.read_simulated(write_simulated(tmp_path / "b.csv", False, "R² 0.41 < 0.95"))
    scaling.draw_speedup(simulated.simulated_speedup_table(weak), tmp_path / "b.png", "8")
    words = texts(drawn[1])
    assert "unsupported — R² 0.41 < 0.95" in words
    assert not any(" at 740 ranks" in t for t in words)
    assert not drawn[1].axes[0].lines, "no speed-up drawn without support"
    scaling.draw_strong_scaling(simulated.simulated_strong_table(weak), tmp_path / "c.png", "7")
    assert "unsupported — R² 0.41 < 0.95" in texts(drawn[2])
    bands = [c.get_paths()[0].vertices[:, 1] for c in drawn[2].axes[0].collections]
    # at 740 ranks: baseline 5 s (band 4.5-5.5), both 1 s (band 0.75-1.5); at 16: 100 and 20 s
    assert [v for b in bands for v in (np.min(b), np.max(b))] == pytest.approx(
        [4.5, 110.0, 0.75, 30.0])


def draw(name: str, inputs: list, output) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    cli.run(parser.parse_args([name, "--inputs", *map(str, inputs), "--output", str(output)]))


def test_every_paper_figure_has_one_name():
    assert list(cli.FIGURES) == [
        "fig05_sizes", "fig06_ablation", "fig07_strong_scaling", "fig08_speedup", "fig09_loss",
        "fig10_weak_scaling", "fig11_batch_size", "fig11_capacity", "fig12_graphs_per_rank",
        "fig13_straggler", "fig07_strong_scaling_simulated", "fig08_speedup_simulated",
        "fig10_weak_scaling_simulated"]


def test_bad_inputs_named(tmp_path):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"x": [1]}).to_csv(bad, index=False)
    with pytest.raises(ValueError, match="bad.csv"):
        draw("fig11_batch_size", [bad], tmp_path / "x.png")
    with pytest.raises(FileNotFoundError, match="summary.json"):
        draw("fig06_ablation", [tmp_path], tmp_path / "x.png")
    with pytest.raises(ValueError, match="no baseline"):
        draw("fig06_ablation", [summary(tmp_path, "mini", "both", 1, 2.0)], tmp_path / "x.png")
    with pytest.raises(SystemExit, match="must end in .png"):
        draw("fig06_ablation", [summary(tmp_path, "mini", "baseline", 1, 2.0)],
             tmp_path / "x.svg")
    assert not (tmp_path / "x.csv").exists()
