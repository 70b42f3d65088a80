"""Each edge paired with its reverse (kernels.edge_pairs) against a brute-force pairing by the
neighbour list's cell shifts, on small periodic cells (many images of one bond, self-images,
bonds along the axes) and a molecule; edges that must not pair; and the fused model, which runs
its radial MLP once per pair, against the same model with pairing off and against mace-torch."""

from __future__ import annotations

import ase.build
import mace  # noqa: F401  (import mace before e3nn)
import pytest
import torch
from e3nn import o3
from helpers import atoms, batch_dict, energy_forces_grads, small_model
from mace.data.neighborhood import get_neighborhood
from mace.modules.radial import BesselBasis, PolynomialCutoff

from cfmtrain.kernels import fuse_model, radial, unfuse_model
from cfmtrain.kernels.edge_pairs import edge_pairs

SH = o3.Irreps.spherical_harmonics(3)


def edges_of(structure, cutoff=4.5):
    """edge_index, unit shifts, harmonics and radial features as mace-torch computes them."""
    edge_index, shifts, unit_shifts, _ = get_neighborhood(
        structure.positions, cutoff, structure.pbc, structure.cell.array)
    edge_index = torch.from_numpy(edge_index)
    pos = torch.from_numpy(structure.positions)
    vectors = pos[edge_index[1]] - pos[edge_index[0]] + torch.from_numpy(shifts)
    lengths = torch.linalg.norm(vectors, dim=-1, keepdim=True)
    attrs = o3.SphericalHarmonics(SH, normalize=True, normalization="component")(vectors)
    feats = BesselBasis(cutoff, 8)(lengths) * PolynomialCutoff(cutoff, 5)(lengths)
    return edge_index, unit_shifts, attrs, feats


def brute_force_reverse(edge_index, unit_shifts) -> list[int]:
    """The reverse of each edge s -> r with shift S: the edge r -> s with shift -S."""
    where = {(int(s), int(r), tuple(u)): e
             for e, (s, r, u) in enumerate(zip(*edge_index.tolist(), unit_shifts.tolist(),
                                               strict=True))}
    return [where[(int(r), int(s), tuple(-x for x in u))]
            for s, r, u in zip(*edge_index.tolist(), unit_shifts.tolist(), strict=True)]


def on_axes():
    """A simple cubic cell: every bond lies along an axis (harmonics with exact zeros), and
    each atom's own images are its neighbours."""
    structure = ase.Atoms("Al2", positions=[[0, 0, 0], [1.6, 0, 0]], cell=[3.2, 3.2, 3.2],
                          pbc=True)
    return structure


STRUCTURES = {
    "one-atom-fcc": lambda: ase.build.bulk("Al", "fcc", a=4.05),  # self-images only
    "two-atom-tial": lambda: ase.build.bulk("TiAl", "rocksalt", a=4.0),
    "on-axes": on_axes,
    "rattled-cu": lambda: atoms((2, 2, 2)),
    "molecule": lambda: ase.build.molecule("CH3CH2OH"),
}


@pytest.mark.parametrize("name", list(STRUCTURES))
def test_every_edge_pairs_with_its_reverse(name):
    edge_index, unit_shifts, attrs, feats = edges_of(STRUCTURES[name]())
    reverse = brute_force_reverse(edge_index, unit_shifts)
    pairs = edge_pairs(edge_index, attrs, feats, SH)
    num_edges = edge_index.shape[1]
    assert pairs.rep.numel() * 2 == num_edges
    assert pairs.inverse.shape == (num_edges,)
    for e in range(num_edges):
        assert int(pairs.inverse[e]) == int(pairs.inverse[reverse[e]])
        assert int(pairs.rep[pairs.inverse[e]]) in (e, reverse[e])
    torch.testing.assert_close(feats[pairs.rep][pairs.inverse], feats, rtol=1e-14, atol=1e-14)


def test_an_edge_without_its_reverse_keeps_its_own_row():
    edge_index, unit_shifts, attrs, feats = edges_of(STRUCTURES["two-atom-tial"]())
    reverse = brute_force_reverse(edge_index, unit_shifts)
    dropped = 5
    keep = torch.arange(edge_index.shape[1]) != dropped
    orphan = reverse[dropped] - (reverse[dropped] > dropped)  # its index after the drop
    pairs = edge_pairs(edge_index[:, keep], attrs[keep], feats[keep], SH)
    num_edges = int(keep.sum())
    assert pairs.rep.numel() == (num_edges - 1) // 2 + 1
    row = int(pairs.inverse[orphan])
    assert int(pairs.rep[row]) == orphan
    assert int((pairs.inverse == row).sum()) == 1
    torch.testing.assert_close(feats[keep][pairs.rep][pairs.inverse], feats[keep], rtol=1e-14,
                               atol=1e-14)


def test_unequal_radial_features_or_harmonics_are_not_paired():
    edge_index, unit_shifts, attrs, feats = edges_of(STRUCTURES["rattled-cu"]())
    reverse = brute_force_reverse(edge_index, unit_shifts)
    feats, attrs = feats.clone(), attrs.clone()
    feats[3] += 1e-9  # as if the radial features depended on the edge's direction
    attrs[7, 1:4] = -attrs[7, 1:4]  # as if the edge pointed the way its reverse does
    pairs = edge_pairs(edge_index, attrs, feats, SH)
    num_edges = edge_index.shape[1]
    assert pairs.rep.numel() == num_edges // 2 + 2  # two pairs split, each edge its own row
    for e in (3, reverse[3], 7, reverse[7]):
        assert int((pairs.inverse == pairs.inverse[e]).sum()) == 1
    torch.testing.assert_close(feats[pairs.rep][pairs.inverse], feats, rtol=1e-14, atol=1e-14)


def test_harmonics_without_an_odd_irrep_give_no_pairs():
    edge_index, _, attrs, feats = edges_of(STRUCTURES["rattled-cu"]())
    even = o3.Irreps("1x0e+1x2e")
    assert edge_pairs(edge_index, attrs[:, [0, 4, 5, 6, 7, 8]], feats, even) is None


def test_fused_model_runs_its_radial_mlp_per_pair_exactly(monkeypatch):
    model = small_model(max_ell=3)
    batch = batch_dict(atoms())
    expected = energy_forces_grads(model, batch)
    fuse_model(model)
    seen = []
    original = radial.edge_pairs

    def spy(*args):
        seen.append(original(*args))
        return seen[-1]

    monkeypatch.setattr(radial, "edge_pairs", spy)
    paired = energy_forces_grads(model, batch)
    num_edges = batch["edge_index"].shape[1]
    assert len(seen) == 1  # both interactions take the forward's one pairing
    assert seen[0].rep.numel() * 2 == num_edges
    monkeypatch.setattr(radial, "edge_pairs", lambda *args: None)
    unpaired = energy_forces_grads(model, batch)
    for p, u, e in zip(paired, unpaired, expected, strict=True):
        scale = max(e.abs().max().item(), 1e-12)
        assert (p - u).abs().max().item() <= 1e-12 * scale
        assert (p - e).abs().max().item() <= 1e-10 * scale


def test_unfused_model_keeps_no_hook(tmp_path):
    model = fuse_model(small_model())
    assert all(radial._hooked(block) for block in model.interactions)
    unfuse_model(model)
    assert not any(block._forward_pre_hooks for block in model.interactions)
    path = tmp_path / "plain.model"
    torch.save(model, path)
    assert b"cfmtrain" not in path.read_bytes()
