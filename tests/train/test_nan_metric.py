"""A NaN validation or test error (a corrupt graph store) fails the run with a message naming
the set and the graphs, instead of a summary.json with null MAEs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CUTOFF, emt_frames, make_store, train

from cfmtrain.train.metrics import NonFiniteMetricError


def nan_store(folder, part: str):
    """make_store's store and split, with one `part` graph's energy NaN (a corrupt shard)."""
    from cfmtrain.graphs.build import atoms_to_graph
    from cfmtrain.graphs.store import write_shard

    store, split, _ = make_store(folder, n=30)
    bad = int(np.load(split)[part][1])
    graphs = []
    for i, atoms in enumerate(emt_frames(30)):
        graph = atoms_to_graph(atoms, CUTOFF)
        graph["source_index"] = i
        if i == bad:
            graph["energy"] = float("nan")
        graphs.append(graph)
    write_shard(store / "shard_0000.h5", graphs, cutoff=CUTOFF)
    return store, split, bad


@pytest.mark.slow
@pytest.mark.parametrize("part, what", [("valid", "validation after epoch 0"),
                                        ("test", "test set")])
def test_nan_metric_fails_the_run(tmp_path, part, what):
    store, split, bad = nan_store(tmp_path / "store", part)
    with pytest.raises(NonFiniteMetricError, match=rf"{what}: .*store indices \[{bad}\]"):
        train(store, split, tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()
