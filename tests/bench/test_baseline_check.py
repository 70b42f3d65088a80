"""The baseline check's in-process A/B: mace-torch's own `take_step` against cfmtrain's
`train_step` in paired rounds on a tiny store, with the real mace-torch model and loss."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import TINY, make_store

from cfmtrain.bench.baseline_check import interleaved
from cfmtrain.train.config import load_config


@pytest.mark.slow
def test_interleaved_steps_are_paired_rounds(tmp_path):
    store, split, _ = make_store(tmp_path / "store", n=16)
    cfg = load_config(None, [*TINY, "batch.graphs_per_batch=3", "variant=baseline",
                             "measure_straggler=false"])
    ab = interleaved(cfg, [store], split, rounds=6)
    assert ab["rounds"] == 6 and len(ab["mace_step_s"]) == len(ab["cfmtrain_step_s"]) == 6
    # every round one step of each, in an order shuffled with the seed: both orders occur
    assert sorted(map(sorted, ab["order"])) == [["cfmtrain", "mace"]] * 6
    assert len({tuple(o) for o in ab["order"]}) == 2
    ratios = np.array(ab["cfmtrain_step_s"]) / np.array(ab["mace_step_s"])
    assert ab["ratio_median"] == pytest.approx(np.median(ratios))
    assert ab["ratio_p10"] == pytest.approx(np.quantile(ratios, 0.1))
    assert ab["ratio_p90"] == pytest.approx(np.quantile(ratios, 0.9))
    assert ab["mace_step_s_median"] == pytest.approx(np.median(ab["mace_step_s"]))
    assert all(t > 0 for t in ab["mace_step_s"] + ab["cfmtrain_step_s"])
