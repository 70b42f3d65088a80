"""Every stage's atomic write on a full disk (RLIMIT_FSIZE in the command's process, EFBIG):
`cfmtrain graphs` exits 1 with one line naming the shard it could not write (through HDF5),
and leaves no temporary file."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys

import ase.io
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT
from helpers import REPO


def frames(n: int) -> list:
    out = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
        atoms.rattle(0.05, seed=k)
        atoms.calc = EMT()
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
        out.append(atoms)
    return out


def limited(limit: int):
    def start() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return start


@pytest.mark.slow
def test_a_graph_shard_that_does_not_fit_is_named_in_one_line(tmp_path):
    source = tmp_path / "frames.extxyz"
    ase.io.write(source, frames(40), format="extxyz")
    out = tmp_path / "graphs" / "shard_0000.h5"
    done = subprocess.run([sys.executable, "-m", "cfmtrain", "graphs", "--input", str(source),
                           "--output", str(out), "--cutoff", "4.5"], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=limited(source.stat().st_size // 4))
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if "not written" in line]
    assert len(lines) == 1 and f"{out}: not written" in lines[0], done.stderr
    assert "ulimit -f" in lines[0] and "Traceback" not in done.stderr
    assert not out.exists() and not list(out.parent.glob(".*tmp*"))


FORWARD = r"""
import os, sys
import numpy as np
from cfmtrain.graphs.hdf5_write import hdf5_written

with hdf5_written(sys.argv[1]) as f:
    os.write(2, b"\rprogress 1/2")
    os.write(2, b"\rprogress 2/2\n")
    os.write(2, b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                b"ValueError: not h5py's\n")
    f.create_dataset("a", data=np.arange(10))
print("done", flush=True)
"""


def test_the_writer_forwards_all_but_h5pys_deallocator_reports(tmp_path):
    done = subprocess.run([sys.executable, "-c", FORWARD, str(tmp_path / "x.h5")],
                          capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stdout == b"done\n", done.stderr
    assert done.stderr == (b"\rprogress 1/2\rprogress 2/2\nTraceback (most recent call last):\n"
                           b"  File \"x.py\", line 1, in <module>\nValueError: not h5py's\n")
