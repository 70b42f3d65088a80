"""`cfmtrain graphs` on bad frames: a clear error naming file, frame and reason and no shard
left behind, or with --skip-invalid the frame skipped and counted in the report."""

import json

import ase.io
import numpy as np
import pytest
from ase.build import bulk

from cfmtrain.cli import main
from cfmtrain.data.convert import InvalidFrameError
from cfmtrain.graphs.build import build_shard
from cfmtrain.graphs.store import GraphStore


def frames_with_overlap():
    good = bulk("Cu", "fcc", a=3.6, cubic=True)
    bad = good.copy()
    bad.positions[1] = bad.positions[0] + [0.05, 0, 0]  # 0.05 Å apart
    for atoms in (good, bad, good.copy()):
        atoms.info["REF_energy"] = -1.0
        atoms.arrays["REF_forces"] = np.zeros((len(atoms), 3))
        atoms.info["config_type"] = "cu"
    return [good, bad, good.copy()]


def test_overlap_is_an_error_naming_file_and_frame(tmp_path):
    source = tmp_path / "frames_0000.extxyz"
    ase.io.write(source, frames_with_overlap(), format="extxyz")
    with pytest.raises(InvalidFrameError, match=r"frames_0000.extxyz: frame 1: overlapping atoms"):
        build_shard(source, tmp_path / "shard_0000.h5", 4.5)
    assert not any(p.suffix == ".h5" for p in tmp_path.iterdir())


def test_skip_invalid_counts_the_frame(tmp_path):
    source = tmp_path / "frames_0000.extxyz"
    ase.io.write(source, frames_with_overlap(), format="extxyz")
    shard = tmp_path / "shard_0000.h5"
    assert main(["graphs", "--input", str(source), "--output", str(shard), "--skip-invalid"]) == 0
    report = json.loads(shard.with_suffix(".json").read_text())
    assert report["graphs"] == 2 and report["skipped_by_reason"] == {"overlapping atoms": 1}
    store = GraphStore(shard)
    np.testing.assert_array_equal(store.num_atoms, [4, 4])
