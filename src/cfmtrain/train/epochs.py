"""The epoch record, declared once: one epoch of a run, one row of epochs.csv (rank 0 writes it,
train.runner), its columns in the order of EpochRecord's fields (no torch: readers import it).
"""

from __future__ import annotations

import dataclasses

from cfmtrain.tables import Record


@dataclasses.dataclass(frozen=True)
class EpochRecord(Record):
    """One epoch (seconds for the times; losses and MAEs in eV, eV/atom and eV/Å).

    wall_s: the epoch's training time (its own steps, validation left out); valid_s: its
    validation's (0 when it did not validate; the MAEs are then NaN); resumed: 1 if it was
    resumed part-way (its time spans two processes); compute_max_over_mean, wait_mean_s: the
    slowest rank's compute over the mean and the mean straggler wait per step; ended_unix_s:
    when its validation ended (places the epoch in time).
    """

    epoch: int
    wall_s: float
    valid_s: float
    steps: int
    resumed: int
    lr: float
    train_loss: float
    train_mae_energy_per_atom: float
    train_mae_forces: float
    valid_loss: float
    valid_mae_energy_per_atom: float
    valid_mae_forces: float
    atoms: int
    atoms_per_s: float
    compute_max_over_mean: float
    wait_mean_s: float
    ended_unix_s: float

    TABLE = "epochs.csv"
    WRITER = "`cfmtrain train`"
    OPTIONAL = ("ended_unix_s",)  # came later: an epochs.csv of an older version lacks it


EPOCH_FIELDS: tuple[str, ...] = EpochRecord.columns()
