"""examples/balance_dataloader.py runs: mace-torch data through the sampler in a DataLoader loop."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import REPO

EXAMPLE = REPO / "examples" / "balance_dataloader.py"


@pytest.mark.slow  # imports mace and trains a tiny model: about 30 s of CPU
def test_example_trains_on_balanced_batches():
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--graphs", "12", "--capacity", "400", "--epochs", "2",
         "--num-replicas", "2", "--rank", "1"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = re.findall(r"rank 1/2 epoch (\d) step \d+: (\d+) graphs, (\d+) atoms, weights "
                       r"\[([^\]]*)\], loss ([0-9.]+)", result.stdout)
    assert {epoch for epoch, *_ in steps} == {"0", "1"}
    for _, graphs, atoms, weights, loss in steps:
        assert 0 < int(atoms) <= 400 and len(weights.split(",")) == int(graphs)
        assert float(loss) >= 0
    assert "sampler state: {'epoch': 1" in result.stdout
