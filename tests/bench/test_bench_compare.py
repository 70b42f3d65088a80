"""`cfmtrain bench compare`: two switches of one op, checked to agree, timed in paired rounds
in one process; its CSV carries the paired-ratio columns."""

import pandas as pd
import pytest

from cfmtrain.bench import compare
from cfmtrain.cli import main

ARGS = ["bench", "compare", "--model", "tiny", "--atoms", "16", "--rounds", "3", "--calls", "1"]


def test_fused_against_mace_in_paired_rounds(tmp_path, capsys):
    csv = tmp_path / "compare.csv"
    assert main([*ARGS, "--csv", str(csv)]) == 0
    frame = pd.read_csv(csv)
    assert list(frame["arm"]) == ["mace", "fused"]
    assert {"ratio_median", "ratio_p10", "ratio_p90", "rounds", "wall_s_median",
            "cpu_s_median", "seed"} <= set(frame.columns)
    assert (frame["rounds"] == 3).all()
    mace, fused = frame.itertuples()
    assert mace.ratio_median == 1.0
    assert fused.ratio_p10 <= fused.ratio_median <= fused.ratio_p90
    assert "speed-up against mace" in capsys.readouterr().out


@pytest.mark.slow
def test_arms_that_compute_different_values_are_refused(tmp_path, monkeypatch, capsys):
    real = compare.setup

    def skewed(config):
        step, facts = real(config)
        if config["impl"] != "fused":
            return step, facts

        def wrong(record=False):
            out = step(record)
            return {k: v * 1.01 for k, v in out.items()} if record else out
        return wrong, facts

    monkeypatch.setattr(compare, "setup", skewed)
    csv = tmp_path / "compare.csv"
    assert main([*ARGS, "--csv", str(csv)]) == 1
    assert "fused and mace differ" in capsys.readouterr().out and not csv.exists()
