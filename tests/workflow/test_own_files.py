"""Own data (`kind: files`): labels found under ASE's, mace-torch's or custom keys, virial ->
stress against ASE, each frame's config_type kept, the three kinds of given E0s, the missing-label
message, and the workflow: graphs from only `paths`, rebuilt when a file changes, the README's
example planned as written."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import ase.db
import ase.io
import numpy as np
import pytest
import yaml
from ase import Atoms
from ase.build import bulk, molecule
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from helpers import REPO, workflow_clone

from cfmtrain.frames.keys import LabelKeys, own_frame, virial_to_stress
from cfmtrain.frames.validate import InvalidFrameError, check_frame, frame_labels
from cfmtrain.graphs.store import GraphStore
from cfmtrain.readers.own import parse_keys
from cfmtrain.shards.convert import convert_own


def labelled(atoms: Atoms) -> tuple[float, np.ndarray, np.ndarray | None]:
    """EMT energy, forces and (periodic) 3x3 stress of `atoms`."""
    atoms.calc = EMT()
    stress = atoms.get_stress(voigt=False) if atoms.pbc.all() else None
    return atoms.get_potential_energy(), atoms.get_forces(), stress


def crystal(seed: int, repeat: int = 1) -> Atoms:
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(repeat)
    atoms.rattle(0.05, seed=seed)
    atoms.set_cell(atoms.cell * (1 + 0.01 * seed), scale_atoms=True)
    return atoms


def ase_written(atoms: Atoms) -> Atoms:
    """Atoms carrying EMT labels as ASE's SinglePointCalculator (what ase.io.write saves)."""
    energy, forces, stress = labelled(atoms)
    results = {"energy": energy, "forces": forces}
    if stress is not None:
        results["stress"] = stress
    atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms


def write_crystals(path: Path, n: int, config_types: tuple[str | None, ...] = (None,),
                   first: int = 0) -> None:
    """`n` crystals (seeds first, first + 1, ...): files of other seeds differ in content."""
    frames = []
    for k in range(n):
        atoms = ase_written(crystal(first + k))
        if config_types[k % len(config_types)]:
            atoms.info["config_type"] = config_types[k % len(config_types)]
        frames.append(atoms)
    ase.io.write(path, frames, format="extxyz")


def read_frames(folder: Path) -> list[Atoms]:
    return [a for p in sorted(folder.glob("frames_*.extxyz")) for a in ase.io.read(p, ":")]


# ---------------------------------------------------------------- labels


def test_ase_calculator_results_load_with_no_keys(tmp_path):
    """An extxyz, trajectory and database written by ASE: no key settings."""
    atoms = ase_written(crystal(1))
    expected = (atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress(voigt=False))
    for name in ("a.extxyz", "a.traj", "a.db"):
        ase.io.write(tmp_path / name, atoms)
        manifest = convert_own("own", [tmp_path / name], tmp_path / name.replace(".", "_"),
                               progress=False)
        assert manifest["frames"] == 1
        (out,) = read_frames(tmp_path / name.replace(".", "_"))
        np.testing.assert_allclose(out.info["REF_energy"], expected[0])
        np.testing.assert_allclose(out.arrays["REF_forces"], expected[1])
        np.testing.assert_allclose(np.reshape(out.info["REF_stress"], (3, 3)), expected[2],
                                   atol=1e-12)


def test_mace_ref_keys_win_over_plain_ones():
    atoms = crystal(2)
    energy, forces, stress = labelled(atoms)
    atoms.calc = None
    atoms.info.update(REF_energy=energy, energy=energy + 1.0, REF_stress=stress)
    atoms.arrays["REF_forces"] = forces
    atoms.arrays["forces"] = forces + 1.0
    got = frame_labels(own_frame(atoms, "f.xyz", 0, LabelKeys.from_mapping()))
    assert got[0] == energy
    np.testing.assert_array_equal(got[1], forces)
    np.testing.assert_array_equal(got[2], stress)


def test_plain_info_and_arrays_entries():
    atoms = molecule("H2O")
    energy, forces, _ = labelled(atoms)
    atoms.calc = None
    atoms.info["energy"], atoms.arrays["forces"] = energy, forces
    frame = own_frame(atoms, "f.xyz", 3, LabelKeys.from_mapping())
    assert check_frame(frame) is None
    assert frame_labels(frame)[0] == energy and frame_labels(frame)[2] is None


def test_custom_keys_and_ignored_stress():
    atoms = crystal(3)
    energy, forces, stress = labelled(atoms)
    atoms.calc = None
    atoms.info.update(E_dft=energy, stress=stress, config_type="bulk", w=2.0)
    atoms.arrays["F_dft"] = forces
    keys = parse_keys(["energy=E_dft", "forces=F_dft", "stress=", "weight=w"])
    frame = own_frame(atoms, "f.xyz", 0, keys)
    assert frame_labels(frame)[2] is None  # stress ignored
    assert frame.info == {"config_type": "bulk", "config_weight": 2.0}
    with pytest.raises(ValueError, match="unknown label.*forse"):
        parse_keys(["forse=F"])


def test_missing_label_names_file_frame_keys_looked_for_and_held(tmp_path):
    atoms = crystal(4)
    atoms.info["energy_dft"] = 1.0
    atoms.arrays["force"] = np.zeros((len(atoms), 3))
    ase.io.write(tmp_path / "bad.xyz", [atoms, atoms])
    with pytest.raises(InvalidFrameError) as err:
        convert_own("own", [tmp_path / "bad.xyz"], tmp_path / "out", progress=False)
    message = str(err.value)
    assert f"{tmp_path / 'bad.xyz'}: frame 0: missing energy" in message
    assert "looked for REF_energy, energy" in message
    assert "info: energy_dft" in message and "arrays: numbers, positions, force" in message
    assert "calculator results: -" in message


# ---------------------------------------------------------------- virial -> stress


def test_virial_becomes_ase_stress(tmp_path):
    """W = -sigma V for EMT atoms; read back as a virial (3x3, 9, Voigt 6), sigma equals ASE's."""
    atoms = crystal(5, repeat=2)
    energy, forces, stress = labelled(atoms)
    virial = -stress * atoms.get_volume()
    np.testing.assert_allclose(virial_to_stress(virial, atoms.cell.array), stress, atol=1e-12)
    voigt = virial[[0, 1, 2, 1, 0, 0], [0, 1, 2, 2, 2, 1]]
    np.testing.assert_allclose(virial_to_stress(voigt, atoms.cell.array), stress, atol=1e-12)
    with pytest.raises(ValueError, match="needs a cell"):
        virial_to_stress(virial, np.zeros((3, 3)))
    # a TiAl-like file: energy in the header, `force` per atom, `virial` 3x3
    atoms.calc = None
    atoms.info.update(energy=energy, virial=virial, config_type="FLD_Cu")
    atoms.arrays["force"] = forces
    ase.io.write(tmp_path / "tial.xyz", atoms)
    convert_own("tial", [tmp_path / "tial.xyz"], tmp_path / "out",
                keys=parse_keys(["forces=force", "virial=virial"]), progress=False)
    (out,) = read_frames(tmp_path / "out")
    np.testing.assert_allclose(np.reshape(out.info["REF_stress"], (3, 3)), stress, atol=1e-12)
    np.testing.assert_allclose(out.arrays["REF_forces"], forces, atol=1e-7)  # %.8f
    assert out.info["config_type"] == "FLD_Cu"


# ---------------------------------------------------------------- config_type, E0s


def isolated(symbol: str, energy: float, config_type: str | None = "isolated_atom") -> Atoms:
    atoms = Atoms(symbol, positions=[[0, 0, 0]])
    if config_type:
        atoms.info["config_type"] = config_type
    atoms.calc = SinglePointCalculator(atoms, energy=energy)
    return atoms


def test_config_types_kept_and_isolated_atoms_from_the_data(tmp_path):
    write_crystals(tmp_path / "a.xyz", 4, ("bulk", None))
    ase.io.write(tmp_path / "b.xyz", [isolated("Cu", -0.5, "IsolatedAtom"),
                                      ase_written(crystal(9))])
    out = tmp_path / "out"
    manifest = convert_own("cu", [tmp_path / "a.xyz", tmp_path / "b.xyz"], out, num_shards=2,
                           e0s="isolated", progress=False)
    assert manifest["frames"] == 5 and manifest["isolated_atoms"] == 1
    assert sorted(a.info["config_type"] for a in read_frames(out)) == ["bulk", "bulk", "cu",
                                                                       "cu", "cu"]
    assert json.loads((out / "e0s.json").read_text()) == {"Cu": -0.5}
    assert manifest["e0s"] == {"method": "isolated", "values": {"Cu": -0.5},
                               "source": str(tmp_path / "b.xyz")}


def test_e0s_from_a_file_a_mapping_or_left_to_training(tmp_path):
    write_crystals(tmp_path / "a.xyz", 2)
    ase.io.write(tmp_path / "iso.xyz", [isolated("Cu", -0.25, None), isolated("H", -13.6)])
    out = tmp_path / "out"
    got = convert_own("cu", [tmp_path / "a.xyz"], out, e0s=str(tmp_path / "iso.xyz"),
                      progress=False)["e0s"]
    assert got["method"] == "file" and got["values"] == {"Cu": -0.25, "H": -13.6}
    assert json.loads((out / "e0s.json").read_text()) == {"Cu": -0.25, "H": -13.6}
    got = convert_own("cu", [tmp_path / "a.xyz"], out, e0s='{"Cu": -0.3}', progress=False)
    assert got["e0s"]["method"] == "mapping"
    assert json.loads((out / "e0s.json").read_text()) == {"Cu": -0.3}
    assert convert_own("cu", [tmp_path / "a.xyz"], out, progress=False)["e0s"]["method"] == "fit"
    assert not (out / "e0s.json").exists()
    with pytest.raises(ValueError, match=r"no E0 for Cu .*given: H"):
        convert_own("cu", [tmp_path / "a.xyz"], out, e0s='{"H": -13.6}', progress=False)
    with pytest.raises(ValueError, match="no frame of the data has config_type IsolatedAtom"):
        convert_own("cu", [tmp_path / "a.xyz"], out, e0s="isolated", progress=False)
    ase.io.write(tmp_path / "two.xyz", [isolated("Cu", -0.25), isolated("Cu", -0.3)])
    with pytest.raises(InvalidFrameError, match=r"two.xyz: frame 1: second isolated Cu"):
        convert_own("cu", [tmp_path / "a.xyz"], out, e0s=str(tmp_path / "two.xyz"),
                    progress=False)


def test_a_path_that_matches_nothing_is_named(tmp_path):
    for path, message in (("data/*.xyz", "matches no file"), ("data/a.xyz", "no such file")):
        with pytest.raises(FileNotFoundError, match=re.escape(f"{path}: {message}")):
            convert_own("own", [path], tmp_path, progress=False)
    (tmp_path / "a.cif").write_text("")
    with pytest.raises(ValueError, match=r"a.cif: unknown suffix '.cif' \(known: .extxyz"):
        convert_own("own", [tmp_path / "a.cif"], tmp_path, progress=False)


# ---------------------------------------------------------------- the workflow



def snakemake(repo: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", *args], cwd=repo, capture_output=True, text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def planned(repo: Path, *args: str) -> set[str]:
    """The rules a dry run would run (empty when there is nothing to be done)."""
    output = snakemake(repo, "-n", *args)
    if "Nothing to be done" in output:
        return set()
    lines = output[output.index("Job stats:"):].splitlines()[3:]
    return {line.split()[0] for line in lines[:next(
        k for k, line in enumerate(lines) if line.startswith("total"))]}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A clone whose only data set is `kind: files` with `paths`, its graphs really built."""
    repo = workflow_clone(tmp_path_factory.mktemp("own") / "repo")
    data = repo / "Jo's data"  # a path that needs quoting
    (data / "more").mkdir(parents=True)
    write_crystals(data / "a.xyz", 6, ("bulk", "strained", None))
    write_crystals(data / "b.xyz", 2, first=6)
    write_crystals(data / "more/c.extxyz", 2, first=8)
    (repo / "config/own.yaml").write_text(
        "datasets:\n  own: {kind: files, paths: [\"Jo's data/*.xyz\", \"Jo's data/**/*.extxyz\"]}"
        "\ntargets: [own]\n")
    snakemake(repo, "--cores", "2", "graphs", "--configfile", "config/own.yaml")
    return repo


@pytest.mark.workflow
def test_graphs_from_only_paths(built):
    store = GraphStore(built / "results/graphs/own")
    assert len(store) == 10
    assert set(store.subset_names) == {"bulk", "strained", "own"}
    manifest = json.loads((built / "results/data/own/frames/manifest.json").read_text())
    assert [s["path"] for s in manifest["sources"]] == [
        "Jo's data/a.xyz", "Jo's data/b.xyz", "Jo's data/more/c.extxyz"]


@pytest.mark.workflow
def test_a_cell_trains_from_only_paths_into_an_ordinary_mace_model(built):
    """Own data end to end: an extxyz written by ASE, a `kind: files` entry with `paths`, and
    a training cell of the default config; the model is a mace-torch model ASE can use."""
    from mace.calculators import MACECalculator

    snakemake(built, "--cores", "2", "results/train/own/both/r1/summary.json",
              "--configfile", "config/own.yaml")
    folder = built / "results/train/own/both/r1"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["e0s"]["method"] == "fit" and set(summary["e0s"]["eV"]) == {"Cu"}
    assert summary["capacity"]["source"] == "auto"
    assert summary["steps_per_epoch"] == summary["capacity"]["baseline_steps"]
    assert np.isfinite(summary["val_mae_forces"])
    atoms = crystal(7)
    atoms.calc = MACECalculator(model_paths=str(folder / "final.model"), device="cpu",
                                default_dtype="float32")
    assert np.isfinite(atoms.get_potential_energy()) and atoms.get_forces().shape == (
        len(atoms), 3)


@pytest.mark.workflow
def test_graphs_rebuilt_when_a_file_is_edited_added_or_removed(built):
    config = ("--configfile", "config/own.yaml")
    assert planned(built, "graphs", *config) == set()
    data = built / "Jo's data"
    a = data / "a.xyz"
    text = a.read_bytes()
    a.write_bytes(text + b"\n")  # edited (Snakemake compares the contents of a touched file)
    assert {"frames", "graph_shard", "split"} <= planned(built, "graphs", *config)
    a.write_bytes(text)
    (data / "d.xyz").write_bytes(text)  # added
    assert "frames" in planned(built, "graphs", *config)
    (data / "d.xyz").unlink()
    (data / "b.xyz").rename(built / "removed")
    assert "frames" in planned(built, "graphs", *config)
    (built / "removed").rename(data / "b.xyz")
    # the second glob then matches nothing: refused before any job, naming it
    (data / "more/c.extxyz").rename(built / "removed")
    refused = subprocess.run([sys.executable, "-m", "snakemake", "-n", "graphs", *config],
                             cwd=built, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0
    assert ("config datasets.own.paths: \"Jo's data/**/*.extxyz\" matches no file"
            in refused.stdout + refused.stderr)
    (built / "removed").rename(data / "more/c.extxyz")
    assert planned(built, "graphs", *config) == set()


def readme_section() -> tuple[str, list[str]]:
    """The YAML example and the snakemake commands of docs/own-data.md's "## Real DFT data"."""
    text = (REPO / "docs/own-data.md").read_text()
    section = text.split("## Real DFT data", 1)[1].split("\n## ", 1)[0]
    example = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    commands = [line for block in re.findall(r"```bash\n(.*?)```", section, re.S)
                for line in block.splitlines() if line.startswith("snakemake ")]
    return example, commands


@pytest.mark.workflow
def test_readme_example_plans_as_written(tmp_path):
    """The README's config and commands, on tiny ASE-written files at the example's paths:
    TiAl-like (energy, `force`, `virial`) and ethanol-like with isolated atoms."""
    example, commands = readme_section()
    repo = workflow_clone(tmp_path / "repo")
    (repo / "config/own.yaml").write_text(example)
    shared = tmp_path / "shared/data/real-dft"
    (shared / "ethanol").mkdir(parents=True)
    tial, stresses = [], []
    for seed in (0, 1):
        atoms = crystal(seed)
        energy, forces, stress = labelled(atoms)
        atoms.calc = None
        atoms.info.update(energy=energy, virial=-stress * atoms.get_volume())
        atoms.arrays["force"] = forces
        tial.append(atoms)
        stresses.append(stress)
    ase.io.write(shared / "TiAl_tutorial.xyz", tial)
    ase.io.write(shared / "ethanol/train_eth_meth.xyz",
                 [ase_written(molecule(m)) for m in ("CH3CH2OH", "CH3OH")])
    ase.io.write(shared / "ethanol/isolated_atoms.xyz",
                 [isolated(s, -1.0) for s in "HCO"])
    datasets = yaml.safe_load(example)["datasets"]
    assert datasets["tial"]["keys"] == {"forces": "force", "virial": "virial"}
    assert len(commands) == 2
    output = ""
    for command in commands:
        args = command.split()[1:]
        assert args.index("--configfile") == len(args) - 2  # targets before --configfile
        output += snakemake(repo, "-n", "--printshellcmds", *args)
    assert "--key forces=force --key virial=virial" in output
    assert re.search(r"model\.e0s=\W*results/data/ethanol/frames/e0s\.json", output)
    snakemake(repo, "--cores", "2", "results/data/tial/frames", "results/data/ethanol/frames",
              "--configfile", "config/own.yaml")
    e0s = json.loads((repo / "results/data/ethanol/frames/e0s.json").read_text())
    assert e0s == {"H": -1.0, "C": -1.0, "O": -1.0}
    got = sorted(read_frames(repo / "results/data/tial/frames"), key=lambda a: a.info["REF_energy"])
    want = sorted(zip(tial, stresses, strict=True), key=lambda pair: pair[0].info["energy"])
    for frame, (_, stress) in zip(got, want, strict=True):
        np.testing.assert_allclose(np.reshape(frame.info["REF_stress"], (3, 3)), stress,
                                   atol=1e-12)
    # config/real_dft.yaml: the union of both sets, raced against mace_run_train (docs/accuracy.md)
    command = "snakemake --profile profiles/local accuracy --configfile config/real_dft.yaml"
    assert command in (REPO / "docs/accuracy.md").read_text()
    (repo / "config/real_dft.yaml").symlink_to(REPO / "config/real_dft.yaml")
    output = snakemake(repo, "-n", "--printshellcmds", *command.split()[1:])
    assert re.search(r"cfmtrain bench accuracy --graphs results/graphs/tial "
                     r"results/graphs/ethanol --split results/graphs/real_dft/split\.npz", output)
    assert "--name real_dft_medium" in output
    # the union: ethanol's isolated-atom E0s held fixed, TiAl's elements fitted to the rest
    fixed = (r"--set \W*model\.e0s=\W*fit\W* --set \W*model\.e0s_fixed="
             r"\[\W*results/data/ethanol/frames/e0s\.json\W*\]")
    assert re.search(fixed, output)
    # config/real_dft_model.yaml over it: the same race with the model target's settings
    command += " config/real_dft_model.yaml"
    assert command in (REPO / "docs/accuracy.md").read_text()
    (repo / "config/real_dft_model.yaml").symlink_to(REPO / "config/real_dft_model.yaml")
    output = snakemake(repo, "-n", "--printshellcmds", *command.split()[1:])
    assert "--name real_dft_model" in output and re.search(fixed, output)
    assert re.search(r"--settings \W*\{\W*preset\W*:\W*model\W*,", output)
    cell = snakemake(repo, "-n", "--printshellcmds", "results/train/real_dft/both/r2/summary.json",
                     "--configfile", "config/real_dft.yaml")  # a training cell: the same E0s
    assert re.search(fixed, cell) and "cfmtrain cell" in cell


def test_a_folder_given_as_a_file_and_a_missing_e0s_file_are_named(tmp_path):
    (tmp_path / "frames").mkdir()
    with pytest.raises(ValueError, match=r"frames: is a folder; list its files or a glob such "
                                         r"as '.*frames/\*\.xyz'"):
        convert_own("own", [tmp_path / "frames"], tmp_path / "out", progress=False)
    frame = Atoms("Cu2", positions=[[0, 0, 0], [2.5, 0, 0]])
    frame.info["REF_energy"], frame.arrays["REF_forces"] = -1.0, np.zeros((2, 3))
    ase.io.write(tmp_path / "a.xyz", [frame])
    for e0s, message in ((tmp_path / "isolated.extxyz", "isolated.extxyz: no such file"),
                         (tmp_path / "frames", "frames: is a folder, not a file")):
        with pytest.raises(ValueError, match=rf"e0s file .*{message}"):
            convert_own("own", [tmp_path / "a.xyz"], tmp_path / "out", e0s=str(e0s),
                        progress=False)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("frames_*"))
