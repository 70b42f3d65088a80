"""The simulator judged on paired ratios: groups whose runs follow known cost laws are predicted
within their paired ranges; a held-out group is predicted from the other groups alone; a ratio
outside its range, or a held-out error above the limit, makes the numbers unsupported, naming
the group and variant."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers import write_group

from cfmtrain.paper import BASELINE, BOTH
from cfmtrain.simulate.allreduce import Network
from cfmtrain.simulate.costmodel import CostModel
from cfmtrain.simulate.ratios import load_group, ratio_checks, ratio_verdict

COSTS = {BASELINE.name: (0.05, 2e-3, 1e-4), BOTH.name: (0.01, 4e-4, 2e-5)}
PATHS = {BASELINE.name: "mace", BOTH.name: "fused"}
LAWS = {PATHS[v]: CostModel(PATHS[v], *c) for v, c in COSTS.items()}
NETWORK = Network(0.0, 1e30)  # the runs write no all-reduce time


def make_group(root, dataset, ranks, data_s=0.002, shift=1.0):
    """A group of runs following COSTS (no all-reduce), its paired medians off by `shift`."""
    return write_group(root, dataset, ranks, COSTS, shift=shift, balanced=(BOTH.name,),
                       allreduce_s=0.0, data_s=data_s, epochs=4)


def checks_of(groups, held_out):
    return ratio_checks(LAWS, [load_group(g) for g in groups], PATHS.__getitem__, NETWORK, 0.0,
                        held_out, 0.05)


def test_groups_that_follow_the_laws_are_predicted_within_their_ranges(tmp_path):
    groups = [make_group(tmp_path, "mini_s", 1), make_group(tmp_path, "mini_s", 2),
              make_group(tmp_path, "mini_m", 2)]
    checks = checks_of(groups, "mini_m/r2")
    assert len(checks) == 3 and checks.variant.eq(BOTH.name).all()
    assert checks.inside.all() and (checks.rel_error.abs() < 0.02).all()
    held = checks[checks.held_out]
    assert list(held.dataset) == ["mini_m"]
    assert held.data_wait_from.iloc[0] == "mini_s/r1 mini_s/r2"
    verdict = ratio_verdict(checks, "mini_m/r2", 0.10)
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
    verdict = ratio_verdict(checks_of(groups, "mini_m/r2"), "mini_m/r2", 0.10)
    assert not verdict["supported"] and needle in verdict["unsupported_reason"]


def test_no_held_out_group_is_unsupported(tmp_path):
    groups = [make_group(tmp_path, "mini_s", 1), make_group(tmp_path, "mini_m", 2)]
    verdict = ratio_verdict(checks_of(groups, "mini_l/r4"), "mini_l/r4", 0.10)
    assert not verdict["supported"] and "mini_l/r4 not measured" in verdict["unsupported_reason"]
    assert isinstance(checks_of(groups, None), pd.DataFrame)
