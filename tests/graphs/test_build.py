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
from cfmtrain.frames.validate import InvalidFrameError
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


def labelled(atoms, config_type="cu"):
    atoms.info["REF_energy"] = -1.0
    atoms.arrays["REF_forces"] = np.zeros((len(atoms), 3))
    atoms.info["config_type"] = config_type
    return atoms


def test_a_cutoff_below_every_distance_is_refused_naming_it(tmp_path, capsys):
    """Nickel at 2.49 A nearest neighbours, graphs at 1.0 A: refused when no structure that
    could have an edge keeps one; the command says so in one line and writes no shard."""
    source = tmp_path / "frames_0000.extxyz"
    ase.io.write(source, [labelled(bulk("Ni", "fcc", a=3.52, cubic=True)) for _ in range(3)])
    shard = tmp_path / "shard_0000.h5"
    with pytest.raises(ValueError, match=r"none of its 3 structures \(.*\) has an edge: the "
                                         r"cutoff 1.0 A is below every interatomic distance"):
        build_shard(source, shard, 1.0)
    assert main(["graphs", "--input", str(source), "--output", str(shard), "--cutoff", "1"]) == 1
    assert "below every interatomic distance" in capsys.readouterr().err
    assert not any(p.suffix in (".h5", ".json") for p in tmp_path.iterdir())


def test_a_structure_without_edges_among_others_is_counted(tmp_path, capsys):
    """A dissociated dimer (atoms 8 A apart) is valid data: built, counted and said."""
    dimer = labelled(Atoms("Cu2", positions=[[0, 0, 0], [8, 0, 0]]))
    source = tmp_path / "frames_0000.extxyz"
    ase.io.write(source, [labelled(bulk("Cu", "fcc", a=3.6)), dimer, labelled(Atoms("Cu"))])
    shard = tmp_path / "shard_0000.h5"
    assert main(["graphs", "--input", str(source), "--output", str(shard)]) == 0
    report = json.loads(shard.with_suffix(".json").read_text())
    assert report["graphs"] == 3 and report["graphs_without_edges"] == 1
    assert "1 without an edge within 4.5 A" in capsys.readouterr().out


@pytest.mark.parametrize("cutoff", ["nan", "inf", "0.001", "-4.5", "500"])
def test_a_cutoff_that_is_not_a_radius_is_refused_before_any_work(tmp_path, capsys, cutoff):
    source = tmp_path / "frames_0000.extxyz"
    ase.io.write(source, [labelled(bulk("Cu", "fcc", a=3.6))])
    shard = tmp_path / "shard_0000.h5"
    assert main(["graphs", "--input", str(source), "--output", str(shard), "--cutoff", cutoff]) == 1
    assert "expected a finite radius in [1, 30] Angstrom" in capsys.readouterr().err
    assert not shard.exists()
