"""Radius graphs against ASE's neighbor_list: triclinic cells (also smaller than the cutoff),
open clusters, single atoms and mixed periodicity."""

import numpy as np
import pytest
from ase import Atoms
from ase.neighborlist import neighbor_list

from cfmtrain.frames.neighbors import radius_graph

CUTOFF = 4.5


def random_cell(rng: np.random.Generator, length: float) -> np.ndarray:
    """A well-conditioned random triclinic cell with vectors about `length` long."""
    while True:
        cell = np.diag(rng.uniform(0.7, 1.3, 3) * length) + rng.uniform(-0.3, 0.3, (3, 3)) * length
        if abs(np.linalg.det(cell)) > 0.2 * length**3:
            return cell


def edge_set(i, j, shifts):
    return sorted(zip(np.asarray(i).tolist(), np.asarray(j).tolist(),
                      map(tuple, np.asarray(shifts).tolist()), strict=True))


def check_against_ase(atoms: Atoms) -> int:
    graph = radius_graph(atoms.positions, atoms.cell.array, atoms.pbc, CUTOFF)
    i, j, shifts, d = neighbor_list("ijSd", atoms, CUTOFF)
    assert edge_set(*graph.edge_index, graph.unit_shifts) == edge_set(i, j, shifts)
    vectors = (atoms.positions[graph.edge_index[1]] - atoms.positions[graph.edge_index[0]]
               + graph.unit_shifts @ atoms.cell.array)
    lengths = np.linalg.norm(vectors, axis=1)
    assert lengths.max(initial=0) < CUTOFF
    assert graph.min_length == pytest.approx(d.min(initial=np.inf), rel=1e-12)
    np.testing.assert_allclose(np.sort(lengths), np.sort(d), rtol=1e-12)
    return len(i)


@pytest.mark.parametrize(
    "length, natoms, pbc",
    [(2.1, 1, (True, True, True)),     # one atom, cell far below the cutoff: many images
     (3.0, 2, (True, True, True)),
     (6.0, 12, (True, True, True)),
     (11.0, 60, (True, True, True)),
     (3.5, 3, (True, False, True)),    # mixed periodicity, small cell
     (8.0, 20, (False, True, False)),
     (9.0, 25, (False, False, False))],
)
def test_random_triclinic_cells_match_ase(length, natoms, pbc):
    rng = np.random.default_rng(int(length * 100) + natoms)
    for _ in range(3):
        cell = random_cell(rng, length)
        atoms = Atoms(numbers=rng.integers(1, 80, natoms), cell=cell, pbc=pbc,
                      scaled_positions=rng.uniform(0, 1, (natoms, 3)))
        assert check_against_ase(atoms) > 0 or natoms == 1 and not any(pbc)


def test_open_cluster_without_cell():
    rng = np.random.default_rng(7)
    atoms = Atoms(numbers=[8, 1, 1] * 10, positions=rng.uniform(0, 9, (30, 3)))
    assert check_against_ase(atoms) > 0


def test_single_atom_without_periodicity_has_no_edges():
    graph = radius_graph(np.zeros((1, 3)), np.zeros((3, 3)), [False] * 3, CUTOFF)
    assert graph.edge_index.shape == (2, 0) and graph.unit_shifts.shape == (0, 3)


def test_empty_structure():
    graph = radius_graph(np.zeros((0, 3)), np.eye(3), [True] * 3, CUTOFF)
    assert graph.edge_index.shape == (2, 0)


def test_self_images_in_small_cell_count():
    # fcc Cu primitive cell (one atom): images within 4.5 Å are the 12 + 6 + 24 shells
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.6)
    graph = radius_graph(atoms.positions, atoms.cell.array, atoms.pbc, CUTOFF)
    assert graph.edge_index.shape[1] == 42
    assert (graph.edge_index == 0).all() and not (graph.unit_shifts == 0).all(axis=1).any()


def test_shift_beyond_int8_is_widened():
    # a 0.03 Å periodic axis puts images 150 cells away inside the cutoff: int8 cannot hold them
    graph = radius_graph(np.zeros((1, 3)), np.diag([0.03, 10.0, 10.0]), (True, False, False),
                         CUTOFF)
    assert graph.unit_shifts.dtype == np.int16 and abs(graph.unit_shifts).max() == 149
    assert graph.edge_index.shape[1] == 298 and graph.min_length == pytest.approx(0.03)


@pytest.mark.parametrize("positions, pbc, cell", [
    # a planar cluster 1500 A across: vesin's grid rescaling rounded its thin axis to zero cells
    # and died of a floating-point exception (SIGFPE) inside the overlap check and the graph
    ([[0, 0, 0], [1.1, 0, 0], [1500, 0, 0], [1500, 1500, 0.4], [750, 900, 0.2]], (0, 0, 0),
     np.zeros((3, 3))),
    # a wire periodic along x, 2000 A across the open axes
    ([[0, 0, 0], [1.2, 0.5, 0], [0.3, 2000, 0], [1.0, 0, 2000]], (1, 0, 0),
     np.diag([2.5, 0, 0])),
    # a slab with a 900 x 3000 A open extent in its plane's normal and a far atom
    ([[0, 0, 0], [1.5, 1.5, 0], [0, 0, 900], [1.0, 1.0, 3000]], (1, 1, 0),
     np.diag([3.0, 3.0, 0])),
])
def test_structures_of_any_extent_match_ase(positions, pbc, cell):
    atoms = Atoms(numbers=[6] * len(positions), positions=positions, cell=cell,
                  pbc=[bool(p) for p in pbc])
    assert check_against_ase(atoms) > 0


def test_wide_structures_against_ase_fuzzed():
    """Random open extents up to 3000 A, flat or not, any periodicity, two radii."""
    rng = np.random.default_rng(3)
    for _ in range(60):
        extent = 10 ** rng.uniform(0, 3.5, 3)
        if rng.random() < 0.5:
            extent[rng.integers(3)] = rng.uniform(0, 2)
        pbc = rng.random(3) < 0.3
        cell = np.diag(np.where(pbc, rng.uniform(3, 300, 3), 0.0))  # ASE is slow on wider
        positions = rng.random((int(rng.integers(2, 30)), 3)) * extent
        atoms = Atoms(numbers=[1] * len(positions), positions=positions, cell=cell, pbc=pbc)
        for radius in (2.0, CUTOFF):
            graph = radius_graph(atoms.positions, atoms.cell.array, atoms.pbc, radius)
            i, j, shifts = neighbor_list("ijS", atoms, radius)
            assert edge_set(*graph.edge_index, graph.unit_shifts) == edge_set(i, j, shifts)
