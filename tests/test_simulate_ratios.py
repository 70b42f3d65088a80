"""The simulator judged on paired ratios: groups whose runs follow known cost laws are predicted
within their paired ranges; a held-out group is predicted from the other groups alone; a ratio
outside its range, or a held-out error above the limit, makes the numbers unsupported, naming
the group and variant."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from helpers import write_run

from cfmtrain.measure.group_tables import PairedRecord
from cfmtrain.paper import BASELINE, BOTH
from cfmtrain.simulate.allreduce import Network
from cfmtrain.simulate.costmodel import CostModel
from cfmtrain.simulate.ratios import load_group, ratio_checks, ratio_verdict
from cfmtrain.tables import write_table
from cfmtrain.train.runs import load_run

COSTS = {BASELINE.name: (0.05, 2e-3, 1e-4), BOTH.name: (0.01, 4e-4, 2e-5)}
PATHS = {BASELINE.name: "mace", BOTH.name: "fused"}
LAWS = {PATHS[v]: CostModel(PATHS[v], *c) for v, c in COSTS.items()}
NETWORK = Network(0.0, 1e30)  # the runs write no all-reduce time


def make_group(root, dataset, ranks, data_s=0.002, shift=1.0):
    """A group folder: each variant's run (known cost law) and a paired.csv whose median is
    the runs' mean epoch ratio times `shift`, with a 3% range."""
    group = root / "results" / "train" / dataset / f"r{ranks}"
    times = {}
    for seed, (variant, cost) in enumerate(COSTS.items()):
        run = write_run(root / "runs", dataset, variant, ranks, cost=cost, allreduce_s=0.0,
                        data_s=data_s, balanced=variant == BOTH.name, seed=seed, epochs=4)
        shutil.move(run, group / variant)
        summary = json.loads((group / variant / "summary.json").read_text())
        (group / variant / "summary.json").write_text(json.dumps({**summary, "dataset": dataset}))
        times[variant] = load_run(group / variant).epochs().wall_s.to_numpy()[1:]
    ratio = float(np.mean(times[BASELINE.name] / times[BOTH.name])) * shift
    rows = [PairedRecord(dataset, ranks, v, BASELINE.name, float(np.median(times[v])),
                         r, r * 0.97, r * 1.03, 3, 0.06, 0)
            for v, r in ((BASELINE.name, 1.0), (BOTH.name, ratio))]
    write_table(group / "paired.csv", rows, PairedRecord)
    return group


def checks_of(groups, held_out):
    return ratio_checks(LAWS, [load_group(g) for g in groups], PATHS.__getitem__, NETWORK, 0.0,
                        held_out)


def test_groups_that_follow_the_laws_are_predicted_within_their_ranges(tmp_path):
    groups = [make_group(tmp_path, "mini_s", 1), make_group(tmp_path, "mini_s", 2),
              make_group(tmp_path, "mini_m", 2)]
    checks = checks_of(groups, "mini_m/r2")
    assert len(checks) == 3 and checks.variant.eq(BOTH.name).all()
    assert checks.inside.all() and (checks.rel_error.abs() < 0.02).all()
    held = checks[checks.held_out]
    assert list(held.dataset) == ["mini_m"]
    assert held.data_wait_from.iloc[0] == "mini_s/r1 mini_s/r2"
    verdict = ratio_verdict(checks, "mini_m/r2")
    assert verdict["supported"] and verdict["held_out_error"] < 0.02


def test_the_held_out_group_takes_its_data_wait_from_the_others_alone(tmp_path):
    groups = [make_group(tmp_path, "mini_s", 2, data_s=0.002),
              make_group(tmp_path, "mini_m", 2, data_s=0.2)]
    inside = checks_of(groups, None).set_index("dataset")
    held = checks_of(groups, "mini_m/r2").set_index("dataset")
    # the same data wait for both variants dilutes the ratio: a smaller wait, a larger ratio
    assert held.loc["mini_m", "predicted"] > inside.loc["mini_m", "predicted"] * 1.05
    assert held.loc["mini_m", "data_wait_from"] == "mini_s/r2"
    assert inside.loc["mini_m", "data_wait_from"] == "mini_s/r2 mini_m/r2"


@pytest.mark.parametrize("where,shift,needle", [
    ("held", 1.3, "held-out mini_m/r2 both"),
    ("inside", 1.3, "mini_s/r1 both: predicted"),
])
def test_a_ratio_off_its_measure_is_unsupported_naming_it(tmp_path, where, shift, needle):
    groups = [make_group(tmp_path, "mini_s", 1, shift=shift if where == "inside" else 1.0),
              make_group(tmp_path, "mini_m", 2, shift=shift if where == "held" else 1.0)]
    verdict = ratio_verdict(checks_of(groups, "mini_m/r2"), "mini_m/r2")
    assert not verdict["supported"] and needle in verdict["unsupported_reason"]


def test_no_held_out_group_is_unsupported(tmp_path):
    groups = [make_group(tmp_path, "mini_s", 1), make_group(tmp_path, "mini_m", 2)]
    verdict = ratio_verdict(checks_of(groups, "mini_l/r4"), "mini_l/r4")
    assert not verdict["supported"] and "mini_l/r4 not measured" in verdict["unsupported_reason"]
    assert isinstance(checks_of(groups, None), pd.DataFrame)
