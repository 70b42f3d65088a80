"""Was a run's timing disturbed by other processes? The host's load average and steal time at
the start and end of training, the ranks' compute wall time against their CPU time, a speed
probe (fixed matmul and gather work) on every rank at the start and end, and the verdict
against configurable thresholds.

The probe catches what the other two cannot: a busy neighbour on the same physical cores slows
a thread that still runs all the time (no waiting, no steal). Its time is judged against the
fastest probe of the same cell (`probe_slowdown`), so a uniformly slower machine is no flag.
Its gathers catch the neighbour that thrashes the shared cache or memory, which matmuls alone
miss (docs/design-notes.md, the speed probe).

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


PROBE_CALLS, PROBE_SIZE = 500, 256  # ~0.1-0.2 s of float32 matmuls on one core
PROBE_GATHERS, PROBE_ROWS = 40, 1 << 15  # ~0.08 s of random row gathers from a 16 MB table
PROBE_WIDTH = 128  # float32 per gathered row


def probe_parts(calls: int = PROBE_CALLS, size: int = PROBE_SIZE, gathers: int = PROBE_GATHERS,
                rows: int = PROBE_ROWS) -> dict[str, float]:
    """Wall seconds of the two parts of the speed probe and the thread CPU seconds of both, on
    this process's torch threads: `calls` matmuls of seeded `size` x `size` float32 matrices
    (compute: they fit in the core's own cache), then `gathers` gathers of `rows` random rows
    from a seeded table of as many 128-float32 rows, each scaled in place (memory: a neighbour
    that thrashes the shared cache or the memory bus slows these, and the training steps'
    gathers with them, while the matmuls hardly move)."""
    import time

    import torch

    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=gen) for _ in range(2))
    table = torch.randn(rows, PROBE_WIDTH, generator=gen)
    index = torch.randint(rows, (rows,), generator=gen)
    out = torch.empty(rows, PROBE_WIDTH)
    a @ b  # first-call costs outside the timing
    torch.index_select(table, 0, index, out=out)
    cpu = time.thread_time()
    start = time.perf_counter()
    for _ in range(calls):
        a @ b
    middle = time.perf_counter()
    for _ in range(gathers):
        torch.index_select(table, 0, index, out=out).mul_(1.0001)
    end = time.perf_counter()
    return {"matmul_s": middle - start, "gather_s": end - middle,
            "cpu_s": time.thread_time() - cpu}


def speed_probe(calls: int = PROBE_CALLS, size: int = PROBE_SIZE, gathers: int = PROBE_GATHERS,
                rows: int = PROBE_ROWS) -> tuple[float, float]:
    """(wall, thread CPU) seconds of the probe's fixed work (`probe_parts`, both parts)."""
    parts = probe_parts(calls, size, gathers, rows)
    return parts["matmul_s"] + parts["gather_s"], parts["cpu_s"]


def slowdowns(samples: list[list[float]]) -> list[float]:
    """Per repeat (its samples of one measure: probe times, or its compute CPU time), its
    slowest sample over the fastest of the whole cell, less one; NaN where a repeat has none."""
    known = [[p for p in times if math.isfinite(p) and p > 0] for times in samples]
    fastest = min((p for times in known for p in times), default=math.nan)
    return [max(times) / fastest - 1 if times else math.nan for times in known]


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
    `max_wall_cpu_ratio`, the hypervisor's stolen share of all CPU time between its start
    and end above `max_steal_fraction`, its speed probe slower than the cell's fastest by more
    than `max_probe_slowdown`, or its compute CPU time above the cell's least by more than
    `max_cpu_slowdown`."""

    max_wall_cpu_ratio: float = 1.15
    max_steal_fraction: float = 0.02
    max_probe_slowdown: float = 0.15
    max_cpu_slowdown: float = 0.10

    def __post_init__(self):
        if not self.max_wall_cpu_ratio >= 1:
            raise ValueError(f"max_wall_cpu_ratio must be at least 1, got "
                             f"{self.max_wall_cpu_ratio}")
        if not 0 <= self.max_steal_fraction <= 1:
            raise ValueError(f"max_steal_fraction must be within [0, 1], got "
                             f"{self.max_steal_fraction}")
        if not self.max_probe_slowdown >= 0:
            raise ValueError(f"max_probe_slowdown must be at least 0, got "
                             f"{self.max_probe_slowdown}")
        if not self.max_cpu_slowdown >= 0:
            raise ValueError(f"max_cpu_slowdown must be at least 0, got "
                             f"{self.max_cpu_slowdown}")


def steal_fraction(host: Mapping) -> float:
    """Stolen share of all CPU time between a run's start and end samples (NaN if unknown)."""
    total = host["cpu_total_end"] - host["cpu_total_start"]
    steal = host["steal_end"] - host["steal_start"]
    return steal / total if total > 0 else math.nan


def verdict(wall_cpu_ratio: float, steal: float, limits: Thresholds,
            probe_slowdown: float = math.nan, cpu_slowdown: float = math.nan) -> str:
    """Why a repeat is contended ('' if it is not; an unknown measure does not count)."""
    reasons = []
    if wall_cpu_ratio > limits.max_wall_cpu_ratio:
        reasons.append(f"compute wall/CPU {wall_cpu_ratio:.3f} > {limits.max_wall_cpu_ratio}")
    if steal > limits.max_steal_fraction:
        reasons.append(f"steal {steal:.3f} of CPU time > {limits.max_steal_fraction}")
    if probe_slowdown > limits.max_probe_slowdown:
        reasons.append(f"host slower: speed probe {100 * probe_slowdown:.0f}% over the cell's "
                       f"fastest > {100 * limits.max_probe_slowdown:.0f}%")
    if cpu_slowdown > limits.max_cpu_slowdown:
        reasons.append(f"host slower: compute CPU time {100 * cpu_slowdown:.0f}% over the "
                       f"cell's least on identical work > {100 * limits.max_cpu_slowdown:.0f}%")
    return "; ".join(reasons)
