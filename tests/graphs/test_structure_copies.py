"""Copies of a structure that are not byte-identical frames are found, within one data set and
across a union's members: atoms in another order (as POSCAR writers sort them), positions
wrapped into the cell or moved by a lattice vector, a molecule moved as a whole, values rounded
differently. Each structure is split once (its first graph kept), the warning names the data
set or members and the files; structures 0.01 Å apart stay distinct."""

from __future__ import annotations

import zipfile

import ase.io
import numpy as np
from ase import Atoms
from helpers import emt_frames
from test_union_overlap import disjoint_structures, member, split_union

from cfmtrain.graphs.store import GraphStore
from cfmtrain.graphs.structure_keys import _block_keys, first_holders


def sorted_by_element(atoms: Atoms) -> Atoms:
    """The frame with its atoms grouped by element, as POSCAR writers order them."""
    order = np.argsort(atoms.numbers, kind="stable")
    out = atoms[order]
    out.arrays["REF_forces"] = atoms.arrays["REF_forces"][order]
    return out


def moved(atoms: Atoms, shift: np.ndarray, wrap: bool = False) -> Atoms:
    out = atoms.copy()
    out.positions += shift
    if wrap:
        out.wrap()
    return out


def test_a_file_and_a_zip_holding_it_in_one_data_set_are_split_once(tmp_path, capsys):
    frames = emt_frames(15, seed=4)
    ase.io.write(tmp_path / "a.xyz", frames[:10])
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as archive:
        archive.write(tmp_path / "a.xyz", "a.xyz")
    ase.io.write(tmp_path / "b.xyz", frames[10:])
    folder = member(tmp_path, "lab", [tmp_path / "a.xyz", tmp_path / "a.zip",
                                      tmp_path / "b.xyz"])
    (parts, meta), err = split_union([folder], tmp_path / "split.npz", capsys)
    assert len(GraphStore(folder)) == 25 and int(meta["left_out"]) == 10
    assert sum(map(len, parts.values())) == 15
    disjoint_structures(GraphStore(folder), parts)
    assert (f"warning: data set {folder} holds 10 structure(s) more than once (the same atoms "
            "up to their order, wrapping into the cell and translation), in the input file(s) "
            f"{tmp_path / 'a.zip'} (copies of structures of {tmp_path / 'a.xyz'}): the later "
            "copies are left out of the split") in err


def test_copies_reordered_wrapped_or_translated_across_members_are_split_once(tmp_path,
                                                                              capsys):
    """Periodic frames sorted by element, moved out of the cell by a lattice vector and
    wrapped back, moved by lattice vectors; molecules moved as a whole."""
    frames = emt_frames(24, seed=6)  # bulk, alloy, cluster in turn
    copies = []
    for k, atoms in enumerate(frames[:12]):
        if atoms.pbc.all():
            lattice = atoms.cell.array
            shift = (lattice[0] - 2 * lattice[2]) if k % 2 else np.zeros(3)
            copy = moved(sorted_by_element(atoms), shift, wrap=k % 4 == 0)
            if k % 4 == 1:  # half its atoms out of the cell and wrapped back
                copy.positions[::2] -= lattice[1]
                copy.wrap()
        else:
            copy = moved(atoms[::-1], np.array([3.25, -1.5, 0.75]))
            copy.arrays["REF_forces"] = atoms.arrays["REF_forces"][::-1]
        copies.append(copy)
    ase.io.write(tmp_path / "first.xyz", frames)
    ase.io.write(tmp_path / "second.extxyz", copies)
    a = member(tmp_path, "first", [tmp_path / "first.xyz"])
    b = member(tmp_path, "second", [tmp_path / "second.extxyz"])
    (parts, meta), err = split_union([a, b], tmp_path / "split.npz", capsys)
    assert int(meta["left_out"]) == 12 and sum(map(len, parts.values())) == 24
    disjoint_structures(GraphStore([a, b]), parts)
    assert f"union members {a} and {b} share 12 structure(s)" in err


def test_one_data_set_with_repeated_frames_leaves_the_repeats_out(tmp_path, capsys):
    frames = emt_frames(12, seed=8)
    repeated = frames + [frames[3], moved(frames[5], frames[5].cell.array[0]), frames[3]]
    ase.io.write(tmp_path / "run.xyz", repeated)
    folder = member(tmp_path, "md", [tmp_path / "run.xyz"])
    (parts, meta), err = split_union([folder], tmp_path / "split.npz", capsys)
    assert int(meta["left_out"]) == 3 and sum(map(len, parts.values())) == 12
    assert (f"data set {folder} holds 3 structure(s) more than once (the same atoms up to "
            f"their order, wrapping into the cell and translation), in the input file(s) "
            f"{tmp_path / 'run.xyz'} (repeated within it)") in err


def block(frames: list[Atoms]) -> dict:
    """graph_blocks' arrays of `frames`."""
    return {"num_atoms": np.array([len(a) for a in frames]),
            "numbers": np.concatenate([a.numbers for a in frames]).astype(np.uint8),
            "positions": np.concatenate([a.positions for a in frames]),
            "cell": np.array([a.cell.array for a in frames]),
            "pbc": np.array([a.pbc for a in frames])}


def test_copies_at_bin_edges_and_cell_faces_are_found_and_near_structures_are_not():
    """Atoms on the cell's faces (fractional 0 and 1 a rounding apart), coordinates on a bin
    edge moved by rounding, a slab moved along its normal and by a lattice vector: one
    structure each; an atom moved by 0.01 Å: another structure."""
    from ase.build import bulk, fcc111

    rng = np.random.default_rng(0)
    crystal = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2))  # atoms at 0 and 1/2
    noisy = crystal.copy()
    noisy.positions += rng.choice([-1e-12, 1e-12], noisy.positions.shape)  # across the faces
    edge = crystal.copy()
    edge.positions[0] = [1e-4 * 137, 1e-4 * 4.0, 0.5]  # on bin edges of the unshifted grid
    edge_copy = edge.copy()
    edge_copy.positions[0] -= 3e-9
    slab = fcc111("Cu", (2, 2, 3), vacuum=5.0)
    slab.rattle(0.02, seed=1)
    slab_copy = moved(slab, slab.cell.array[0] + [0.0, 0.0, 1.75], wrap=True)
    near = crystal.copy()
    near.positions[3] += [0.01, 0.0, 0.0]
    frames = [crystal, noisy, edge, edge_copy, slab, slab_copy, near]
    first = first_holders(_block_keys(block(frames))).tolist()
    assert first == [0, 0, 2, 2, 4, 4, 6]


def test_the_keys_of_many_graphs_take_seconds():
    """50,000 periodic graphs of 20 atoms, keyed with their copies (permuted, moved by
    lattice vectors, rounded to 1e-8 Å) in one pass."""
    import time

    rng = np.random.default_rng(3)
    graphs, atoms = 50_000, 20
    cells = 8 * np.eye(3) + rng.normal(0, 0.5, (graphs, 3, 3))
    positions = np.einsum("gni,gij->gnj", rng.random((graphs, atoms, 3)), cells)
    numbers = rng.integers(1, 90, (graphs, atoms))
    order = np.argsort(rng.random((graphs, atoms)), axis=1)
    lattice = np.einsum("gi,gij->gj", rng.integers(-2, 3, (graphs, 3)).astype(float), cells)
    copies = np.round(np.take_along_axis(positions, order[..., None], axis=1)
                      + lattice[:, None], 8)
    found = {"num_atoms": np.full(2 * graphs, atoms),
             "numbers": np.concatenate([numbers.ravel(),
                                        np.take_along_axis(numbers, order, 1).ravel()]),
             "positions": np.concatenate([positions, copies]).reshape(-1, 3),
             "cell": np.concatenate([cells, cells]), "pbc": np.ones((2 * graphs, 3), bool)}
    start = time.perf_counter()
    first = first_holders(_block_keys(found))
    assert time.perf_counter() - start < 30
    assert np.array_equal(first, np.tile(np.arange(graphs), 2))
