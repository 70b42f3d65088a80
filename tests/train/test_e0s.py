"""E0s of the model: fitted, mace-torch's `average`, or given (a mapping or a JSON file)."""

import json

import numpy as np
import pytest
import torch
from helpers import CUTOFF, make_store
from mace import modules
from mace.data import AtomicData, KeySpecification, config_from_atoms
from mace.data.utils import compute_average_E0s
from mace.tools import AtomicNumberTable
from mace.tools.torch_geometric.dataloader import Collater

from cfmtrain.graphs import store as store_mod
from cfmtrain.train import model as model_mod

KEYS = KeySpecification(info_keys={"energy": "REF_energy"}, arrays_keys={"forces": "REF_forces"})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("e0store"), n=12)


def stats_with(folder, e0s):
    st = store_mod.GraphStore(folder)
    return model_mod.compute_stats(st, np.arange(len(st)), np.array([], int), e0s=e0s)


def mace_mean(frames, e0: dict) -> float:
    """mace-torch's energy shift (mean per-atom interaction energy) for the given E0s."""
    z_table = AtomicNumberTable(sorted(e0))
    configs = [config_from_atoms(a, key_specification=KEYS) for a in frames]
    torch.set_default_dtype(torch.float64)
    try:
        batch = Collater([None], [None])([AtomicData.from_config(c, z_table=z_table,
                                                                 cutoff=CUTOFF)
                                          for c in configs])
        mean, _ = modules.compute_mean_rms_energy_forces([batch],
                                                         np.array([[e0[z] for z in z_table.zs]]))
    finally:
        torch.set_default_dtype(torch.float32)
    return float(np.ravel(mean)[0])


def test_average_is_mace_torchs_own(store):
    folder, _, frames = store
    stats = stats_with(folder, "average")
    configs = [config_from_atoms(a, key_specification=KEYS) for a in frames]
    expected = compute_average_E0s(configs, AtomicNumberTable(stats.zs))
    assert stats.e0s_method == "average"
    np.testing.assert_allclose(stats.e0s, [expected[z] for z in stats.zs], rtol=1e-9)
    np.testing.assert_allclose(stats_with(folder, "fit").e0s, stats.e0s, rtol=1e-8, atol=1e-8)


def test_given_e0s_by_symbol_number_or_file(store, tmp_path):
    folder, _, frames = store
    given = {"Cu": -1.25, "Ni": -0.5}
    stats = stats_with(folder, given)
    assert stats.e0s_method == "mapping" and stats.zs == [28, 29]
    assert stats.e0s == [-0.5, -1.25]
    assert stats.mean == pytest.approx(mace_mean(frames, {29: -1.25, 28: -0.5}), rel=1e-9)
    path = tmp_path / "e0s.json"
    path.write_text(json.dumps({"29": -1.25, "28": -0.5}))
    from_file = stats_with(folder, str(path))
    assert from_file.e0s == stats.e0s and from_file.e0s_method == str(path)


def test_missing_or_bad_e0s_name_the_element_and_source(store, tmp_path):
    folder, _, _ = store
    with pytest.raises(ValueError, match=r"no E0 for Ni .*given: Cu"):
        stats_with(folder, {"Cu": -1.0})
    path = tmp_path / "e0s.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=rf"{path}: not a JSON mapping"):
        stats_with(folder, str(path))
    with pytest.raises(ValueError, match="'Qq'"):
        stats_with(folder, {"Cu": -1.0, "Ni": -1.0, "Qq": 2.0})
    with pytest.raises(ValueError, match="neither fit, average nor a file"):
        stats_with(folder, "nonsense")


def test_fixed_elements_fit_the_others_to_what_remains(store, tmp_path):
    """A union whose member gives some E0s (model.e0s_fixed): those are held, the rest is the
    least-squares fit of the energies less the held elements' part (a brute-force lstsq)."""
    folder, _, frames = store
    st = store_mod.GraphStore(folder)
    stats = model_mod.compute_stats(st, np.arange(len(st)), np.array([], int), e0s="fit",
                                    fixed={28: -0.5})
    counts = np.array([[np.sum(a.numbers == 29)] for a in frames], float)
    rest = np.array([a.info["REF_energy"] + 0.5 * np.sum(a.numbers == 28) for a in frames])
    cu = np.linalg.lstsq(counts, rest, rcond=None)[0][0]
    assert stats.zs == [28, 29] and stats.e0s[0] == -0.5
    assert stats.e0s[1] == pytest.approx(cu, rel=1e-9)
    assert stats.e0s_method == "fit (Cu) with given Ni"
    assert stats.mean == pytest.approx(mace_mean(frames, {29: cu, 28: -0.5}), rel=1e-8)
    # every element given: nothing left to fit, the values are the given ones
    both = model_mod.compute_stats(st, np.arange(len(st)), np.array([], int), e0s="fit",
                                   fixed={28: -0.5, 29: -1.25})
    assert both.e0s == [-0.5, -1.25] and both.e0s_method == "fit (none) with given Ni, Cu"


def test_fixed_e0s_merge_files_and_refuse_disagreement(tmp_path):
    first, second, third = (tmp_path / f"{k}.json" for k in "abc")
    first.write_text(json.dumps({"H": -13.6, "O": -432.1}))
    second.write_text(json.dumps({"C": -1029.5, "H": -13.6}))
    third.write_text(json.dumps({"H": -13.0}))
    assert model_mod.fixed_e0s([str(first), str(second)]) == {1: -13.6, 8: -432.1, 6: -1029.5}
    assert model_mod.fixed_e0s({"Ti": -1.5}) == {22: -1.5}
    with pytest.raises(ValueError, match=rf"H is -13.6 eV in {first} but -13.0 eV in {third}"):
        model_mod.fixed_e0s([str(first), str(third)])
    with pytest.raises(ValueError, match="no such file"):
        model_mod.fixed_e0s([str(tmp_path / "missing.json")])


def test_fixed_e0s_config_needs_fit(tmp_path):
    from cfmtrain.train.config import ConfigError, load_config

    cfg = load_config(None, ['model.e0s_fixed=["a.json", "b.json"]'])
    assert cfg.model.e0s == "fit" and cfg.model.e0s_fixed == ["a.json", "b.json"]
    assert load_config(None, ["model.e0s_fixed={H: -13.6}"]).model.e0s_fixed == {"H": -13.6}
    with pytest.raises(ConfigError, match="model.e0s is 'average'"):
        load_config(None, ["model.e0s=average", 'model.e0s_fixed=["a.json"]'])
    with pytest.raises(ConfigError, match="list of .json files"):
        load_config(None, ['model.e0s_fixed=["a.txt"]'])


def tied_store(folder):
    """Cu crystals whose Ni and Pd atoms always come in pairs: Cu's E0 is determined, Ni's and
    Pd's only as a sum. Returns (store folder, count matrix, energies)."""
    from ase.build import bulk
    from ase.calculators.emt import EMT

    from cfmtrain.graphs.build import atoms_to_graph

    graphs, counts, energies = [], [], []
    for i, pairs in enumerate((1, 2, 3, 1, 2)):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1 + i % 2, 1))
        atoms.numbers[:pairs] = 28
        atoms.numbers[pairs:2 * pairs] = 46
        atoms.rattle(0.03, seed=i)
        atoms.calc = EMT()
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
        graph = atoms_to_graph(atoms, CUTOFF)
        graph["source_index"] = i
        graphs.append(graph)
        counts.append([np.sum(atoms.numbers == z) for z in (28, 29, 46)])
        energies.append(atoms.info["REF_energy"])
    folder.mkdir(parents=True)
    store_mod.write_shard(folder / "shard_0000.h5", graphs, cutoff=CUTOFF)
    return folder, np.array(counts, float), np.array(energies)


def test_a_fit_that_leaves_e0s_open_names_those_elements(tmp_path):
    folder, counts, energies = tied_store(tmp_path / "tied")
    with pytest.warns(UserWarning, match=r"do not determine separate E0s for Ni, Pd \(") as got:
        stats = stats_with(folder, "fit")
    assert "Cu" not in str(got[0].message).split("minimum norm")[0]
    # the values are still mace-torch's: the minimum-norm least squares on the count matrix
    expected = np.linalg.lstsq(counts, energies, rcond=None)[0]
    np.testing.assert_allclose(stats.e0s, expected, rtol=1e-6)
    assert model_mod.undetermined_elements(counts.T @ counts, np.array([28, 29, 46])) == [28, 46]


def test_a_determined_fit_says_nothing(store):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats_with(store[0], "fit")
