"""docs/tutorial.md as a user follows it, in a stand-in for a fresh clone: its Snakemake lines
planned as written, in order (the fine-tuning line with a model where the foundation's line puts
it), and its path run end to end on a reduced model: the `model` target -> evaluation.csv ->
best.model in mace-torch's MACECalculator in a process that imports no cfmtrain -> the tutorial's
NVT script, its LAMMPS export and its evaluation of a file of frames, each line as written."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import ase.io
import pandas as pd
import pytest
import torch
import yaml
from helpers import REPO, small_model
from test_docs import ENV, blocks

TUTORIAL = REPO / "docs/tutorial.md"
pytestmark = pytest.mark.workflow  # runs Snakemake


def tutorial_commands() -> list[str]:
    """The command lines of the tutorial's bash blocks, in the page's order."""
    lines = [line.split(" #")[0].strip() for _, text in blocks("bash", [TUTORIAL])
             for line in text.splitlines()]
    return [line for line in lines if line]


def one(prefix: str) -> str:
    lines = [c for c in tutorial_commands() if c.startswith(prefix)]
    assert len(lines) == 1, lines
    return lines[0]


def stand_in(tmp_path: Path) -> Path:
    """A folder that looks like a fresh clone (the workflow, profiles, configs, examples)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("Snakefile", "workflow", "profiles", "config", "examples"):
        (repo / name).symlink_to(REPO / name)
    return repo


def run(words: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(words, cwd=cwd, env=ENV, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (shlex.join(words) + "\n" + result.stdout[-3000:]
                                    + result.stderr[-3000:])
    return result


def snakemake(line: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", *shlex.split(line), *extra]


def test_the_tutorials_yaml_is_the_example_config():
    assert [text for _, text in blocks("yaml", [TUTORIAL])] == [
        (REPO / "examples/tutorial.yaml").read_text()]


def test_tutorial_snakemake_commands_plan(tmp_path):
    """Each Snakemake line of the tutorial, with -n, as written: training, the foundation, the
    fine-tuning (a small mace-torch model stands at the path of the foundation's best.model,
    which the line before it trains)."""
    repo = stand_in(tmp_path)
    lines = [c for c in tutorial_commands() if c.startswith("snakemake ")]
    assert [c.split("--configfile ")[1] for c in lines] == [
        "examples/own_data.yaml examples/tutorial.yaml", "examples/foundation.yaml",
        "examples/fine_tune.yaml"]
    for line in lines:
        last = yaml.safe_load((REPO / shlex.split(line)[-1]).read_text())
        init = last.get("model", {}).get("init_model")
        if init:  # the previous line's model
            (repo / init).parent.mkdir(parents=True, exist_ok=True)
            torch.save(small_model(), repo / init)
        result = run(snakemake(line, "-n"), repo)
        assert "model_train" in result.stdout and "model_evaluate" in result.stdout


# the tutorial's model at a test's size: two epochs of 8 channels (stage two in the second)
TINY = {"model": {"settings": {"epochs": 2, "patience": 2, "model": {
    "hidden_irreps": "8x0e+8x1o", "max_ell": 1, "correlation": 2, "radial_mlp": [16]}}}}
PLAIN_MACE = """
import json, sys
import ase.io
from mace.calculators import MACECalculator

atoms = ase.io.read("examples/own_data/cuni_emt.xyz", index=0)
atoms.calc = MACECalculator(model_paths="results/model/cuni/best.model", device="cpu",
                            default_dtype="float64")
forces = atoms.get_forces()
print(json.dumps({"energy": atoms.get_potential_energy(), "forces": forces.tolist(),
                  "cfmtrain": sorted(m for m in sys.modules if m.startswith("cfmtrain"))}))
"""


@pytest.mark.slow
def test_tutorial_runs_end_to_end_on_a_reduced_model(tmp_path):
    repo = stand_in(tmp_path)
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump(TINY))
    run(snakemake(one("snakemake --profile profiles/local model --configfile examples/own_data"),
                  str(tiny)), repo)  # another configfile, after the tutorial's
    folder = repo / "results/model/cuni"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["config"]["model"]["hidden_irreps"] == "8x0e+8x1o"
    table = pd.read_csv(folder / "evaluation.csv").set_index("config_type")
    assert table.loc["all", "graphs"] == summary["graphs"]["test"] > 0
    assert table.loc["all", "mae_forces_meV_per_A"] == pytest.approx(
        1000 * summary["test_mae_forces"], rel=1e-4)
    for name in ("parity.png", "learning_curves.png", "best.model"):
        assert (folder / name).stat().st_size > 0, name

    # mace-torch alone loads it: no cfmtrain in that process
    plain = json.loads(run([sys.executable, "-c", PLAIN_MACE], repo).stdout.splitlines()[-1])
    assert plain["cfmtrain"] == []
    assert torch.isfinite(torch.tensor(plain["forces"])).all() and len(plain["forces"]) == 32

    # the NVT script as the tutorial runs it, for a few steps of the example cell
    md = shlex.split(one("python examples/md_nvt.py"))
    md[md.index("--steps") + 1] = "3"
    result = run([sys.executable, *md[1:], "--repeat", "1", "--interval", "1"], repo)
    assert "3 steps of 2 fs" in result.stdout and "fused kernels" in result.stdout
    frames = ase.io.read(repo / "results/md/nvt.traj", index=":")
    assert len(frames) == 4 and all(len(f) == 32 for f in frames)
    first = frames[0].get_forces()  # the fused model's, in the trajectory
    assert abs(frames[0].get_potential_energy() - plain["energy"]) < 1e-5 * len(frames[0])
    assert abs(first - torch.tensor(plain["forces"]).numpy()).max() < 1e-5

    # mace-torch's LAMMPS export, as written
    run(shlex.split(one("mace_create_lammps_model")), repo)
    lammps = torch.jit.load(folder / "best.model-lammps.pt")  # TorchScript, as LAMMPS loads it
    assert float(lammps.model.r_max) == 4.5  # the config's cutoff

    # the evaluation of a file of frames, as written (isolated atoms left out)
    words = shlex.split(one("cfmtrain evaluate"))
    run([sys.executable, "-m", "cfmtrain", *words[1:]], repo)
    frames_table = pd.read_csv(repo / words[words.index("--output") + 1])
    assert frames_table.set_index("config_type").loc["all", "graphs"] == 16
