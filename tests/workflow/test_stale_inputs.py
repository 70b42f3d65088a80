"""An input of the frames step whose content changed while its modification time was kept (a
restored copy, `touch -r`, `rsync -t`) is found by the sha256 the frames manifest records: the
frames are rebuilt, naming the file, where Snakemake's times alone would keep the old ones; a
file only touched is read once and rebuilds nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ase.io
import pytest
from ase import Atoms
from helpers import emt_frames, workflow_clone

from cfmtrain.shards.sources import changed_inputs, stamp


def snakemake(repo: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", *args, "--configfile", "config/own.yaml"],
        cwd=repo, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def isolated_atoms(energies: dict[str, float]) -> list[Atoms]:
    atoms = []
    for symbol, energy in energies.items():
        atom = Atoms(symbol, pbc=False)
        atom.info.update(REF_energy=energy, config_type="IsolatedAtom")
        atoms.append(atom)
    return atoms


def rewrite_keeping_time(path: Path, write) -> None:
    """`write(path)`, then the file's access and modification times set back as they were."""
    before = path.stat()
    write(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns


@pytest.mark.workflow
def test_frames_rebuilt_when_an_input_changes_behind_its_time(tmp_path):
    repo = workflow_clone(tmp_path / "repo")
    lab = repo / "lab"
    lab.mkdir()
    ase.io.write(lab / "cells.extxyz", emt_frames(6, seed=3))
    ase.io.write(lab / "atoms.xyz", isolated_atoms({"Cu": -0.5, "Ni": -0.75}))
    (repo / "config/own.yaml").write_text(
        "datasets:\n  own: {kind: files, paths: [lab/cells.extxyz], e0s: {file: lab/atoms.xyz}}"
        "\ntargets: [own]\n")
    target = "results/data/own/frames"
    snakemake(repo, "--cores", "1", target)
    frames = repo / target
    assert json.loads((frames / "e0s.json").read_text()) == {"Cu": -0.5, "Ni": -0.75}
    assert "Nothing to be done" in snakemake(repo, "-n", target)

    # the E0s file rewritten with another Cu energy, its time set back: rebuilt, named
    rewrite_keeping_time(lab / "atoms.xyz", lambda p: ase.io.write(
        p, isolated_atoms({"Cu": -0.55, "Ni": -0.75})))
    planned = snakemake(repo, "-n", target)
    assert "Nothing to be done" not in planned
    assert (f"{target}: rebuilt: lab/atoms.xyz changed since the conversion (its sha256 "
            "differs from the one manifest.json records") in planned
    snakemake(repo, "--cores", "1", target)
    assert json.loads((frames / "e0s.json").read_text()) == {"Cu": -0.55, "Ni": -0.75}
    assert "Nothing to be done" in snakemake(repo, "-n", target)

    # a data file swapped for a copy of itself with one frame less, its time set back
    kept = emt_frames(6, seed=3)[:5]
    rewrite_keeping_time(lab / "cells.extxyz", lambda p: ase.io.write(p, kept))
    assert "lab/cells.extxyz changed since the conversion" in snakemake(repo, "-n", target)
    snakemake(repo, "--cores", "1", target)
    assert json.loads((frames / "manifest.json").read_text())["frames"] == 5

    # only touched (time moved, content the same): nothing to rebuild, and it is read once
    os.utime(lab / "cells.extxyz")
    output = snakemake(repo, "-n", target)
    assert "Nothing to be done" in output and "changed since the conversion" not in output
    digests = json.loads((repo / ".snakemake/cfmtrain-digests.json").read_text())
    assert digests[str((lab / "cells.extxyz").resolve())]["stamp"] == stamp(lab / "cells.extxyz")


def test_an_unmoved_stamp_is_trusted_and_a_moved_one_hashed_once(tmp_path):
    """The manifest's stamp vouches for the content (no read); a moved stamp is hashed, and
    the cache holds the digest of the touched file for the next check."""
    data = tmp_path / "a.xyz"
    ase.io.write(data, emt_frames(2))
    from cfmtrain.shards.sources import source_record

    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"sources": [source_record(data)]}))
    cache = tmp_path / "digests.json"
    assert changed_inputs(manifest, cache) == [] and not cache.exists()
    os.utime(data)  # touched
    assert changed_inputs(manifest, cache) == []
    assert json.loads(cache.read_text())[str(data.resolve())]["stamp"] == stamp(data)
    rewrite_keeping_time(data, lambda p: p.write_bytes(p.read_bytes().replace(b"Cu", b"Ni", 1)))
    assert changed_inputs(manifest, cache) == [str(data)]
    assert changed_inputs(tmp_path / "none.json", cache) == []  # no frames yet: nothing stale
