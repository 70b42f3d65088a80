"""Was a run's timing disturbed by other processes? The host's load average and steal time at
the start and end of training, the ranks' compute wall time against their CPU time, and the
verdict against configurable thresholds.

The CPU time is the training thread's own (`time.thread_time`): forward and backward run on it
(autograd runs CPU work on the calling thread), so with one torch thread per rank it equals the
wall time of the compute unless the thread waited for a core. With more torch threads per rank,
the training thread also waits for its intra-op workers, which raises the ratio a little. With
more than one rank the compute is only local with measure_straggler (the default); without it,
DDP's all-reduce waits inside backward count as compute wall time too.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

PROC_LOADAVG = Path("/proc/loadavg")
PROC_STAT = Path("/proc/stat")


def host_sample(loadavg: Path = PROC_LOADAVG, stat: Path = PROC_STAT) -> dict[str, float]:
    """The host now: 1-minute load average, and the CPU time stolen by the hypervisor and the
    total CPU time of all CPUs since boot, in seconds (/proc/stat `cpu` line). NaN where the
    files are absent (not Linux) or unreadable."""
    sample = {"loadavg": math.nan, "steal": math.nan, "cpu_total": math.nan}
    try:
        sample["loadavg"] = float(loadavg.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = stat.read_text().splitlines()[0].split()
        if fields[0] == "cpu":
            ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
            hz = os.sysconf("SC_CLK_TCK")
            sample["steal"], sample["cpu_total"] = ticks[7] / hz, sum(ticks) / hz
    except (OSError, ValueError, IndexError):
        pass
    return sample


def compute_wall_cpu(steps: Iterable[Mapping], first_epoch: int) -> tuple[float, float]:
    """(CPU seconds, wall / CPU) of the compute of all ranks' steps from epoch `first_epoch` on
    (steps.csv rows: compute_s and compute_cpu_s); NaN when there is no CPU time."""
    wall = cpu = 0.0
    for row in steps:
        if int(row["epoch"]) >= first_epoch:
            wall += float(row["compute_s"])
            cpu += float(row["compute_cpu_s"])
    if not (cpu > 0 and math.isfinite(cpu)):
        return math.nan, math.nan
    return cpu, wall / cpu


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """When a repeat counts as contended: its compute wall / CPU ratio above
    `max_wall_cpu_ratio`, or the hypervisor's stolen share of all CPU time between its start
    and end above `max_steal_fraction`."""

    max_wall_cpu_ratio: float = 1.15
    max_steal_fraction: float = 0.02

    def __post_init__(self):
        if not self.max_wall_cpu_ratio >= 1:
            raise ValueError(f"max_wall_cpu_ratio must be at least 1, got "
                             f"{self.max_wall_cpu_ratio}")
        if not 0 <= self.max_steal_fraction <= 1:
            raise ValueError(f"max_steal_fraction must be within [0, 1], got "
                             f"{self.max_steal_fraction}")


def steal_fraction(host: Mapping) -> float:
    """Stolen share of all CPU time between a run's start and end samples (NaN if unknown)."""
    total = host["cpu_total_end"] - host["cpu_total_start"]
    steal = host["steal_end"] - host["steal_start"]
    return steal / total if total > 0 else math.nan


def verdict(wall_cpu_ratio: float, steal: float, limits: Thresholds) -> str:
    """Why a repeat is contended ('' if it is not; an unknown measure does not count)."""
    reasons = []
    if wall_cpu_ratio > limits.max_wall_cpu_ratio:
        reasons.append(f"compute wall/CPU {wall_cpu_ratio:.3f} > {limits.max_wall_cpu_ratio}")
    if steal > limits.max_steal_fraction:
        reasons.append(f"steal {steal:.3f} of CPU time > {limits.max_steal_fraction}")
    return "; ".join(reasons)
