"""`cfmtrain rounds` end to end on a tiny store, 2 ranks through the launcher: every variant of
the group trains epoch by epoch in the recorded shuffled order, rounds.csv holds each round's
epoch times (equal to the runs' own epochs.csv), paired.csv the ratios computed from them, and
each variant's summary.json the median of its rounds; a group that cannot be paired is refused
before any training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import COMMON, REPO

from cfmtrain.paper import ABLATION

ENV = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def rounds(data, out: Path, *options: str, ranks: int = 2) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "cfmtrain", "launch", "--ranks", str(ranks), "--threads", "1",
            "--", "rounds", "--graphs", str(data[0]), "--split", str(data[1]), "--output",
            str(out), "--seed", "5", "--dataset", "tiny"]
    for setting in (*COMMON, "epochs=3"):
        argv += ["--set", setting]
    argv += options  # after the settings: a --set here wins
    return subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)


@pytest.mark.dist
def test_a_group_trains_its_variants_in_paired_rounds(data, tmp_path):
    out = tmp_path / "group"
    result = rounds(data, out)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("cfmtrain launch") == 1  # one launch for the whole group
    table = pd.read_csv(out / "rounds.csv")
    # epochs=3: a warm-up epoch, then 2 timed rounds of the four variants
    assert len(table) == 2 * len(ABLATION)
    rng = np.random.default_rng(5)  # the recorded seed gives the order each round ran in
    for r, ran in table.groupby("round"):
        assert list(ran.sort_values("position").variant) == [
            ABLATION[k] for k in rng.permutation(len(ABLATION))], f"round {r}"
    for variant in ABLATION:
        mine = table[table.variant == variant].sort_values("round")
        epochs = pd.read_csv(out / variant / "epochs.csv")
        assert epochs.epoch.tolist() == [0, 1, 2]
        np.testing.assert_allclose(mine.epoch_s, epochs.wall_s[1:])  # its own timed epochs
        assert (mine.wall_s >= mine.epoch_s).all()  # the arm's wall time holds the epoch
        summary = json.loads((out / variant / "summary.json").read_text())
        assert summary["variant"] == variant and summary["ranks"] == 2
        assert summary["rounds"] == 2 and summary["round_seed"] == 5
        assert summary["epoch_time_s"] == pytest.approx(np.median(mine.epoch_s))
        assert (summary["epoch_time_min_s"], summary["epoch_time_max_s"]) == pytest.approx(
            (mine.epoch_s.min(), mine.epoch_s.max()))
        assert (out / variant / "final.model").stat().st_size > 0
        assert not (out / variant / "checkpoint.pt").exists()
    paired = pd.read_csv(out / "paired.csv")
    assert list(zip(paired.variant, paired.reference, strict=True)) == [
        *((v, "baseline") for v in ABLATION), ("both", "balancer"), ("both", "kernel")]
    times = table.pivot(index="round", columns="variant", values="epoch_s")
    for row in paired.itertuples():
        values = times[row.reference] / times[row.variant]
        p10, median, p90 = np.quantile(values, [0.1, 0.5, 0.9])
        assert (row.ratio_median, row.ratio_p10, row.ratio_p90) == pytest.approx(
            (median, p10, p90))
        assert row.rounds == 2 and row.dataset == "tiny" and row.ranks == 2 and row.seed == 5
    # every epoch replays the first one's batches: each round times the same work
    for variant in ABLATION:
        steps = pd.read_csv(out / variant / "steps.csv")
        per_epoch = [part[["rank", "graphs", "atoms", "edges"]].to_numpy()
                     for _, part in steps.groupby("epoch")]
        assert len(per_epoch) == 3 and all((p == per_epoch[0]).all() for p in per_epoch)
    # the same seed, the same data: the kernels change no loss, the balancer its batches
    losses = {v: pd.read_csv(out / v / "epochs.csv").train_loss for v in ABLATION}
    np.testing.assert_allclose(losses["kernel"], losses["baseline"], rtol=1e-4)
    np.testing.assert_allclose(losses["both"], losses["balancer"], rtol=1e-4)


@pytest.mark.slow
def test_a_group_that_cannot_be_paired_is_refused(data, tmp_path):
    out = tmp_path / "group"
    result = rounds(data, out, "--variants", "kernel", "both", ranks=1)
    assert result.returncode == 2
    assert "--variants kernel both: a group needs baseline" in result.stderr
    argv = ["--variants", "baseline", "both", "--set", "epochs=1"]
    result = rounds(data, out, *argv, ranks=1)
    assert result.returncode == 2
    assert "epochs=1: the first epoch is the untimed warm-up round" in result.stderr
    assert not out.exists()
