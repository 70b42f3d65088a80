"""steps.csv is appended after each epoch, never rewritten while a run goes on; a resume drops
the rows past its checkpoint and a line cut short by a kill; rows hold StepRecord's columns."""

import csv
import os

import numpy as np

from cfmtrain.train.runner import Recorder
from cfmtrain.train.steps import STEP_FIELDS, StepRecord


def records(epoch: int, first_step: int, steps: int = 3, ranks: int = 2) -> list[StepRecord]:
    return [StepRecord(epoch, first_step + s, r, 4, 40 + r, 400, 0.01, 0.1 + s, 0.0, 0.0, 0.0,
                       0.2, 1.5, 0.2, 0.1) for s in range(steps) for r in range(ranks)]


def rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_epochs_are_appended_and_only_the_latest_is_held(tmp_path):
    recorder = Recorder(tmp_path, True, 0, 0)
    recorder.add_steps(records(0, 0))
    path = tmp_path / "steps.csv"
    inode, first = os.stat(path).st_ino, path.read_bytes()
    recorder.add_steps(records(1, 3))
    assert os.stat(path).st_ino == inode, "appended in place, not replaced by a new file"
    assert path.read_bytes().startswith(first)
    written = rows(path)
    assert list(written[0]) == list(STEP_FIELDS) and len(written) == 12
    assert [int(r["step"]) for r in written] == sorted(int(r["step"]) for r in written)
    assert len(recorder.epoch_rows) == 6, "only the latest epoch in memory"
    np.testing.assert_array_equal(recorder.epoch_records(1)[:, STEP_FIELDS.index("step")],
                                  [3, 3, 4, 4, 5, 5])
    assert len(recorder.all_steps()) == 12


def test_a_resume_drops_rows_past_its_checkpoint_and_a_cut_line(tmp_path):
    recorder = Recorder(tmp_path, True, 0, 0)
    recorder.add_steps(records(0, 0))
    recorder.add_steps(records(1, 3))
    path = tmp_path / "steps.csv"
    with open(path, "a") as f:
        f.write("1,6,0,4,40")  # killed while appending
    resumed = Recorder(tmp_path, True, 4, 1)  # the checkpoint: epoch 1, before step 4
    kept = rows(path)
    assert [int(r["step"]) for r in kept] == [0, 0, 1, 1, 2, 2, 3, 3]
    np.testing.assert_array_equal(resumed.epoch_records(1)[:, STEP_FIELDS.index("step")], [3, 3])
    resumed.add_steps(records(1, 4, steps=2))
    assert [int(r["step"]) for r in rows(path)][-4:] == [4, 4, 5, 5]


def test_other_ranks_write_nothing(tmp_path):
    recorder = Recorder(tmp_path, False, 0, 0)
    recorder.add_steps(records(0, 0))
    assert not (tmp_path / "steps.csv").exists() and recorder.all_steps() == []
