"""`cfmtrain graphs` on bad frames: a clear error naming file, frame and reason and no shard
left behind, or with --skip-invalid the frame skipped and counted in the report."""

import json
from collections import Counter

import ase.io
import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk

from cfmtrain.cli import main
from cfmtrain.data.validate import InvalidFrameError
from cfmtrain.graphs.build import build_graphs, build_shard
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


def test_first_invalid_frame_wins_across_validation_chunks():
    """Frames are validated a chunk at a time; the error is still the first bad frame's, be it a
    structural problem or an overlap found only by the radius graph."""
    good, overlap, _ = frames_with_overlap()
    frames = [good, good.copy(), good.copy(), overlap, Atoms(), good.copy()]
    for chunk_size in (1, 2, 4, 128):
        with pytest.raises(InvalidFrameError, match=r"^src: frame 3: overlapping atoms"):
            list(build_graphs(frames, "src", 4.5, False, Counter(), chunk_size=chunk_size))
        with pytest.raises(InvalidFrameError, match=r"^src: frame 1: empty frame"):
            list(build_graphs([good, Atoms(), overlap], "src", 4.5, False, Counter(),
                              chunk_size=chunk_size))
        skipped = Counter()
        graphs = list(build_graphs(frames, "src", 4.5, True, skipped, chunk_size=chunk_size))
        assert [g["source_index"] for g in graphs] == [0, 1, 2, 5]
        assert skipped == {"overlapping atoms": 1, "empty frame": 1}
