"""The data commands on a really full disk (a 1 MiB tmpfs, mounted where the tests run as
root): `convert` (its part files, with 1 or 2 workers), `generate` (its pool), `figure` (its PDF,
which matplotlib's writer fails on with a zlib error), `split` and `stats` exit 1 with one line
naming the file not written and what is full, leave no temporary file, and print no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ase.io
import pytest
from helpers import REPO, emt_frames, fill, make_store, mounted_tmpfs

PAGE = 4096  # a tmpfs allocates whole pages


@pytest.fixture
def disk(tmp_path):
    """A 1 MiB tmpfs at tmp_path/disk."""
    with mounted_tmpfs(tmp_path / "disk", "1m") as folder:
        yield folder


def cfmtrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cfmtrain", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def said(done: subprocess.CompletedProcess, prefix: str, folder: Path) -> str:
    """The one line of a command stopped by the full disk (a progress bar's text aside)."""
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.replace("\r", "\n").splitlines()
             if "not written" in line or "Error" in line or "Traceback" in line]
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"{prefix}{folder}/"), lines[0]
    assert ": not written, the disk is full (No space left on device)" in lines[0]
    assert "resource_tracker" not in done.stderr
    return lines[0]


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp" in p.name or p.name.startswith(".staging")
            or p.name == ".parts"]


@pytest.mark.slow  # about 12 s each
@pytest.mark.parametrize("workers", [1, 2])
def test_convert_on_a_full_disk_names_the_file(tmp_path, disk, workers):
    source = tmp_path / "big.xyz"
    ase.io.write(source, emt_frames(3000, seed=1))  # 2 MB of frames
    out = disk / "frames"
    done = cfmtrain("convert", "own", "--own-data", "--input", source, "--output", out,
                    "--no-progress", "--workers", workers)
    line = said(done, "error: ", out)
    assert ".parts/part_000000.extxyz: not written" in line
    assert leftovers(disk) == [] and list(out.iterdir()) == []


@pytest.mark.slow
def test_generate_on_a_full_disk_names_the_shard(disk):
    out = disk / "mini"
    done = cfmtrain("generate", "--preset", "mini", "--scale", "0.3", "--workers", "2",
                    "--output-dir", out)
    assert "/frames_000" in said(done, "cfmtrain generate: ", out)
    assert leftovers(disk) == [] and list(out.iterdir()) == []


def pages(path: Path) -> int:
    return -(-path.stat().st_size // PAGE) * PAGE


@pytest.mark.slow
def test_a_figure_whose_pdf_does_not_fit_is_named(tmp_path, disk):
    store = make_store(tmp_path / "store", n=30)[0]
    shard = store / "shard_0000.h5"
    room = tmp_path / "room"
    done = cfmtrain("figure", "fig05_sizes", "--inputs", shard, "--dataset", "x", "--output",
                    room / "fig05.png")
    assert done.returncode == 0, done.stderr
    table, image, pdf = (room / f"fig05.{s}" for s in ("csv", "png", "pdf"))
    assert pdf.stat().st_size > 2 * PAGE
    fill(disk, pages(table) + pages(image) + PAGE)  # room for the table and the PNG only
    done = cfmtrain("figure", "fig05_sizes", "--inputs", shard, "--dataset", "x", "--output",
                    disk / "fig05.png")
    assert said(done, "cfmtrain figure: ", disk).startswith(
        f"cfmtrain figure: {disk / 'fig05.pdf'}: not written")
    assert leftovers(disk) == [] and not (disk / "fig05.pdf").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["split", "stats"])
def test_split_and_stats_on_a_full_disk_name_the_file(tmp_path, disk, command):
    store = make_store(tmp_path / "store", n=30)[0]
    fill(disk)
    out = disk / "out"
    args = (["--output", out / "split.npz"] if command == "split"
            else ["--name", "x", "--csv", out / "t.csv", "--markdown", out / "t.md"])
    said(cfmtrain(command, "--graphs", store, *args), f"cfmtrain {command}: ", out)
    assert leftovers(disk) == []
