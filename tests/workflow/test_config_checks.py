"""Every config value checked before any job runs, naming the key: what the schema cannot say
(finite numbers, the cutoff's range, seeds, shard counts, files, irreps strings and harmonics
orders) by cfmtrain.config_check, wired into the workflow so that `snakemake -n` refuses it."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from cfmtrain.config_check import check_workflow_config
from cfmtrain.train.config import ConfigError

DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())
DEFAULT.setdefault("split", {}).setdefault("seed", 0)


def edited(edit) -> dict:
    config = copy.deepcopy(DEFAULT)
    edit(config)
    return config


def own(tmp_path: Path, **cfg) -> callable:
    def edit(config):
        config["datasets"]["own"] = {"kind": "files", **cfg}
    return edit


CASES = [
    ("cutoff", lambda c: c.update(cutoff=float("nan")), "config cutoff: nan is not a finite"),
    ("cutoff", lambda c: c.update(cutoff=float("inf")), "config cutoff: inf is not a finite"),
    ("cutoff", lambda c: c.update(cutoff=0.02), "config cutoff: cutoff 0.02: expected a finite "
     "radius in [1, 30]"),
    ("cutoff", lambda c: c.update(cutoff=75.0), "radius in [1, 30]"),
    ("split.seed", lambda c: c["split"].update(seed=-3), "config split.seed: -3 is negative"),
    ("split.valid", lambda c: c["split"].update(valid=float("nan")),
     "config split.valid: nan is not a finite number"),
    ("shards", lambda c: c["datasets"]["mini"].update(shards=12_000),
     "config datasets.mini.shards: 12000 shards, more than shard names hold (10000)"),
    ("hidden_irreps", lambda c: c["train"]["settings"]["model"].update(hidden_irreps="32x0e+x1o"),
     "config train.settings: config model.hidden_irreps: '32x0e+x1o' is not an irreps string"),
    ("hidden_irreps", lambda c: c["train"]["settings"]["model"].update(hidden_irreps="8x1o+8x2e"),
     "'8x1o+8x2e' has no scalar (0e) channels"),
    ("max_ell", lambda c: c["train"]["settings"]["model"].update(max_ell=14),
     "config model.max_ell: 14 is beyond the spherical harmonics e3nn implements"),
    ("radial_mlp", lambda c: c["train"]["settings"]["model"].update(radial_mlp=[0, 8]),
     "config model.radial_mlp: [0, 8] must be >= 1"),
    # train.settings is checked by the loader training uses (the schema no longer mirrors it)
    ("settings_key", lambda c: c["train"]["settings"].update(epochz=3),
     "config train.settings: config: unknown key 'epochz'"),
    ("settings_type", lambda c: c["train"]["settings"].update(epochs="two"),
     "config train.settings: config epochs"),
    ("settings_range", lambda c: c["train"]["settings"].update(eval_fraction=1.5),
     "config train.settings: config eval_fraction"),
    ("settings_variant", lambda c: c["train"]["settings"].update(variant="both"),
     "config train.settings.variant: not a setting"),
    ("matrix_variant", lambda c: c["train"]["matrix"][0].update(variants=["baseline", "bothh"]),
     "config train.matrix[0].variants: unknown variant(s) ['bothh']"),
    ("figures_variant", lambda c: c.setdefault("figures", {}).update(variants=["kernal"]),
     "config figures.variants: unknown variant(s) ['kernal']"),
    # what a job would find only later: empty shards, a split of under 3 graphs, a registry
    # name `cfmtrain download` does not know, a union's member twice or not a data set
    ("mini_shards", lambda c: c["datasets"]["mini"].update(scale=0.002, shards=30),
     "config datasets.mini.shards: 30 shards for the 8 frames of datasets.mini.scale (0.002): "
     "a shard would be empty; give at most 8"),
    ("crystals_split", lambda c: c["datasets"].update(
        xtal={"kind": "generated", "preset": "crystals", "graphs": 2, "shards": 1}),
     "config datasets.xtal.graphs: 2 graph(s) cannot be split into train, validation and test"),
    ("registry", lambda c: c["datasets"].update(mp={"kind": "download", "registry": "mptrjj"}),
     "config datasets.mp.registry: 'mptrjj' (the data set's name unless given) is no entry"),
    ("member_twice", lambda c: c["datasets"].update(
        mini2={"kind": "generated", "scale": 0.05}, u={"kind": "union",
                                                    "members": ["mini2", "mini", "mini2"]}),
     "config datasets.u.members: 'mini2' is listed 2 times; list each member once"),
    ("member_union", lambda c: c["datasets"].update(
        u={"kind": "union", "members": ["mini"]}, uu={"kind": "union", "members": ["u", "mini"]}),
     "config datasets.uu.members: 'u' is a union"),
    ("member_unknown", lambda c: c["datasets"].update(u={"kind": "union", "members": ["mnii"]}),
     "config datasets.u.members: 'mnii' is not a data set of config `datasets`"),
    # model settings a training job fails on (inside mace-torch's build or first step)
    ("r_max", lambda c: c["train"]["settings"]["model"].update(r_max=6.0),
     "config train.settings.model.r_max: 6.0 Å exceeds config cutoff (4.5 Å)"),
    ("mlp_vector", lambda c: c["train"]["settings"]["model"].update(mlp_irreps="16x1o"),
     "config model.mlp_irreps: '16x1o' holds 1o; the readout MLP's activation takes even "
     "scalars only"),
    ("mlp_odd", lambda c: c["train"]["settings"]["model"].update(mlp_irreps="8x0e+8x0o"),
     "config model.mlp_irreps: '8x0e+8x0o' holds 0o"),
    ("max_ell_0", lambda c: c["train"]["settings"]["model"].update(max_ell=0),
     "config model.max_ell: 0 must be >= 1"),
    ("hidden_counts", lambda c: c["train"]["settings"]["model"].update(
        hidden_irreps="32x0e+8x1o"), "'32x0e+8x1o' mixes channel counts (8, 32)"),
    ("hidden_twice", lambda c: c["train"]["settings"]["model"].update(
        hidden_irreps="8x0e+8x1o+8x0e"), "'8x0e+8x1o+8x0e' lists 0e more than once"),
    ("correlation", lambda c: c["train"]["settings"]["model"].update(correlation=5),
     "config model.correlation: 5 with model.max_ell 2: the symmetric contraction's coupling "
     "tensors take hours"),
    ("correlation_high_ell", lambda c: c["train"]["settings"]["model"].update(max_ell=4),
     "config model.correlation: 3 with model.max_ell 4"),
    ("trial", lambda c: c["train"]["settings"]["model"].update(correlation=1),
     "config model: mace-torch cannot build or run a model of these settings "
     "(model.hidden_irreps='16x0e+16x1o', model.max_ell=2, model.correlation=1"),
    ("e0s_file", lambda c: c["train"]["settings"]["model"].update(e0s="/no/such/e0s.json"),
     "config train.settings.model.e0s: /no/such/e0s.json: no such file"),
    ("e0s_fixed_file", lambda c: c["train"]["settings"]["model"].update(
        e0s_fixed=["/no/fixed.json"]),
     "config train.settings.model.e0s_fixed[0]: /no/fixed.json: no such file"),
    # a data set another section names, by its key
    ("accuracy_dataset", lambda c: c.update(accuracy={"datasets": ["mini", "nope"]}),
     "config accuracy.datasets[1]: 'nope' is not a data set of config `datasets`; known: mini"),
    ("accuracy_sized", lambda c: c.update(accuracy={"datasets": ["mini_s"]}),
     "config accuracy.datasets[0]: 'mini_s' is not a data set of config `datasets`; known"),
    ("matrix_dataset", lambda c: c["train"]["matrix"][1].update(datasets=["mini_m", "nope_s"]),
     "config train.matrix[1].datasets[1]: 'nope_s' is not a data set of config `datasets` nor "
     "one with a size suffix of config train.sizes (_s, _m)"),
    ("matrix_size", lambda c: c["train"]["matrix"][0].update(datasets=["mini_xl"]),
     "config train.matrix[0].datasets[0]: 'mini_xl' is not a data set"),
    ("figures_dataset", lambda c: c["figures"].update(dataset="nope"),
     "config figures.dataset: 'nope' is not a data set"),
    ("figures_sizes", lambda c: c["figures"]["sizes"][1].update(dataset="mini_q"),
     "config figures.sizes[1].dataset: 'mini_q' is not a data set"),
    ("baseline_check", lambda c: c["train"].update(baseline_check=["nope"]),
     "config train.baseline_check[0]: 'nope' is not a data set"),
    ("simulate_dataset", lambda c: c["simulate"].update(dataset="nope_s"),
     "config simulate.dataset: 'nope_s' is not a data set"),
    ("sweep_dataset", lambda c: c.update(sweep={"dataset": "nope"}),
     "config sweep.dataset: 'nope' is not a data set of config `datasets`"),
]


@pytest.mark.parametrize("key, edit, message", CASES, ids=[c[0] for c in CASES])
def test_a_value_that_cannot_work_is_refused_naming_its_key(key, edit, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace("]", r"\]").replace("+", r"\+")):
        check_workflow_config(edited(edit))


def merged(base: dict, overlay: dict) -> dict:
    """`overlay` on `base` as Snakemake merges a --configfile: mappings key by key."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else copy.deepcopy(value)
    return out


@pytest.mark.slow
def test_the_shipped_configs_pass():
    check_workflow_config(DEFAULT)
    paper = yaml.safe_load((REPO / "config/paper.yaml").read_text())
    check_workflow_config(merged(DEFAULT, paper))


def test_own_data_files_are_checked(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.xyz").write_text("1\n\nH 0 0 0\n")
    for cfg, message in [
        ({"paths": [str(tmp_path / "data")]}, "is a folder; list its files or a glob such as"),
        ({"paths": [str(tmp_path / "data/b.xyz")]}, "b.xyz: no such file"),
        ({"paths": [str(tmp_path / "data/*.xyz")], "e0s": {"file": str(tmp_path / "iso.xyz")}},
         "config datasets.own.e0s.file: .*iso.xyz: no such file"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_workflow_config(edited(own(tmp_path, **cfg)))
    check_workflow_config(edited(own(tmp_path, paths=[str(tmp_path / "data/*.xyz")])))


def test_own_data_a_job_would_refuse_is_refused_before(tmp_path):
    """A recursive glob that matches only folders beside a file that exists, a matched file of
    an unknown format, an E0s file of one, an E0s mapping with a symbol of no element."""
    (tmp_path / "runs/md").mkdir(parents=True)
    (tmp_path / "runs/a.extxyz").write_text("1\n\nH 0 0 0\n")
    (tmp_path / "runs/notes.txt").write_text("")
    found = str(tmp_path / "runs/a.extxyz")
    for cfg, message in [
        ({"paths": [found, str(tmp_path / "runs/**/md")]},
         r"config datasets.own.paths: '.*runs/\*\*/md' matches no file"),
        ({"paths": [str(tmp_path / "runs/*")]},
         r"config datasets.own.paths: .*notes.txt: unknown suffix '.txt'"),
        ({"paths": [found], "e0s": {"file": str(tmp_path / "runs/notes.txt")}},
         r"config datasets.own.e0s.file: .*notes.txt: unknown suffix"),
        ({"paths": [found], "e0s": {"Cu": -3.5, "Cx": -1.0}},
         r"config datasets.own.e0s: 'Cx': not element symbols"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_workflow_config(edited(own(tmp_path, **cfg)))


def test_library_checks_are_remembered_per_model_setting(tmp_path):
    passed = tmp_path / "passed"
    check_workflow_config(DEFAULT, passed=passed)
    assert len(list(passed.iterdir())) == 1
    bad = edited(lambda c: c["train"]["settings"]["model"].update(max_ell=12))
    with pytest.raises(ConfigError, match="max_ell"):
        check_workflow_config(bad, passed=passed)
    check_workflow_config(bad, library_checks=False)  # the jobs' own parse skips them


@pytest.mark.workflow
@pytest.mark.parametrize("overlay, message", [
    ("cutoff: .nan\n", "config cutoff: nan is not a finite number"),
    ("datasets:\n  big: {kind: generated, preset: crystals, graphs: 40, shards: 41}\n",
     "config datasets.big.shards: 41 shards for the 40 frames of datasets.big.graphs"),
    ("train:\n  settings:\n    model: {hidden_irreps: '16x0e+16x1x'}\n",
     "config model.hidden_irreps: '16x0e+16x1x' is not an irreps string"),
    ("train:\n  settings:\n    model: {r_max: 6.0}\n",
     "config train.settings.model.r_max: 6.0 Å exceeds config cutoff (4.5 Å)"),
    ("train:\n  settings:\n    model: {mlp_irreps: 16x1o}\n",
     "config model.mlp_irreps: '16x1o' holds 1o"),
    ("train:\n  settings:\n    model: {max_ell: 0}\n", "config model.max_ell: 0 must be >= 1"),
    ("accuracy: {datasets: [nope]}\n",
     "config accuracy.datasets[0]: 'nope' is not a data set of config `datasets`"),
    ("train:\n  matrix:\n    - {datasets: [nope_s], variants: [baseline], ranks: [1]}\n",
     "config train.matrix[0].datasets[0]: 'nope_s' is not a data set"),
    ("figures: {dataset: nope}\n", "config figures.dataset: 'nope' is not a data set"),
])
def test_the_dry_run_refuses_before_any_job(tmp_path, overlay, message):
    path = tmp_path / "overlay.yaml"
    path.write_text(overlay)
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile", str(path)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
