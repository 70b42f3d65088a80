"""Training statistics in one vectorised pass over store blocks equal the graph-by-graph sums
(a brute-force reference over GraphStore[i]) and mace-torch's own average E0s."""

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk, molecule
from mace.data.utils import compute_average_E0s
from mace.tools import AtomicNumberTable

from cfmtrain.graphs.build import build_graphs
from cfmtrain.graphs.store import GraphStore, write_shard
from cfmtrain.train.model import MAX_Z, _stat_sums, compute_stats, store_elements

CUTOFF = 4.5


def frames(seed: int, count: int) -> list[Atoms]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        kind = k % 4
        if kind == 0:
            atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(1 + k % 2)
        elif kind == 1:
            atoms = molecule("CH3CH2OH")
        elif kind == 2:
            atoms = Atoms("Ni")  # one atom, no edges
        else:
            atoms = bulk("NiO", "rocksalt", a=4.2) if k % 8 == 3 else molecule("H2O")
        atoms.rattle(0.05, seed=seed + k)
        atoms.info["REF_energy"] = float(rng.normal(-3 * len(atoms), 1.0))
        atoms.arrays["REF_forces"] = rng.normal(size=(len(atoms), 3))
        atoms.info["config_type"] = f"t{kind}"
        out.append(atoms)
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("store")
    for shard in range(3):
        write_shard(folder / f"shard_{shard:04d}.h5",
                    build_graphs(frames(10 * shard, 13 + shard), "src", CUTOFF, False,
                                 Counter()), cutoff=CUTOFF)
    return GraphStore(folder)


def graph_by_graph(store: GraphStore, indices) -> np.ndarray:
    """The reference: each graph read on its own, its sums added one at a time."""
    ata, atb = np.zeros((MAX_Z, MAX_Z)), np.zeros(MAX_Z)
    c_over_n, scalars = np.zeros(MAX_Z), np.zeros(6)
    for index in indices:
        g = store[int(index)]
        counts = np.bincount(g["numbers"], minlength=MAX_Z).astype(np.float64)
        n = len(g["numbers"])
        ata += np.outer(counts, counts)
        atb += counts * g["energy"]
        c_over_n += counts / n
        receivers = g["edge_index"][1]
        scalars += [g["energy"] / n, 1.0, np.square(g["forces"]).sum(), 3.0 * n,
                    len(receivers), len(np.unique(receivers))]
    return np.concatenate([ata.ravel(), atb, c_over_n, scalars])


@pytest.mark.parametrize("pick", ["all", "every_other", "scattered"])
@pytest.mark.parametrize("max_items", [1, 40, 1 << 23])  # blocks of one graph up to whole shards
@pytest.mark.parametrize("receivers", ["stored", "from_edges"])  # a shard without the counts
def test_block_sums_equal_graph_by_graph(store, monkeypatch, pick, max_items, receivers):
    everything = np.arange(len(store))
    indices = {"all": everything, "every_other": everything[1::2],
               "scattered": np.random.default_rng(0).permutation(everything)[:17]}[pick]
    real = GraphStore.graph_blocks
    monkeypatch.setattr(GraphStore, "graph_blocks",
                        lambda self, i, f: real(self, i, f, max_items=max_items))
    assert store.num_receivers is not None
    if receivers == "from_edges":
        monkeypatch.setattr(store, "num_receivers", None)
    np.testing.assert_allclose(_stat_sums(store, indices), graph_by_graph(store, indices),
                               rtol=1e-12, atol=1e-9)


def test_average_e0s_equal_mace_torchs(store):
    train = np.arange(len(store))
    stats = compute_stats(store, train, np.array([], int), e0s="average")
    configs = [SimpleNamespace(atomic_numbers=store[i]["numbers"],
                               properties={"energy": store[i]["energy"]}) for i in train]
    reference = compute_average_E0s(configs, AtomicNumberTable(stats.zs))
    np.testing.assert_allclose(stats.e0s, [reference[z] for z in stats.zs], rtol=1e-8,
                               atol=1e-8)
    assert stats.e0s_method == "average"


def test_a_graph_listed_twice_is_refused(store):
    with pytest.raises(ValueError, match="listed twice"):
        _stat_sums(store, np.array([0, 1, 1]))


@pytest.mark.parametrize("pick", [[], [4], [0, 1, 2, 30, 31], "all"])
def test_elements_of_graphs_equal_graph_by_graph(store, pick):
    indices = np.arange(len(store)) if pick == "all" else np.array(pick, dtype=np.int64)
    expected = sorted({int(z) for i in indices for z in store[int(i)]["numbers"]})
    assert store_elements(store, indices).tolist() == expected
