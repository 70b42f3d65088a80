"""Sweep worker, run as `python -m cfmtrain.sweep.measure spec.json` in a fresh process: builds
the training run's model once, then times training steps on each batch of the spec, printing one
JSON line per batch. A batch that exceeds the memory budget is reported as out of memory and the
rest of its group is skipped (larger batches would fail too)."""

from __future__ import annotations

import ctypes
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mace  # noqa: F401  (before e3nn: torch weights-only loading of e3nn's constants)
import numpy as np
import torch

from cfmtrain.batches.data import GraphDataset
from cfmtrain.ranks.distenv import DistEnv
from cfmtrain.train.build import DTYPES, build_run
from cfmtrain.train.config import load_config
from cfmtrain.train.loop import train_step
from cfmtrain.train.metrics import StepTimes
from cfmtrain.train.model import z_table_of

OOM_MARKERS = ("can't allocate memory", "not enough memory", "out of memory", "bad_alloc")


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


M_TOP_PAD = -2  # glibc mallopt parameter


def limit_memory(budget_mb: int) -> None:
    """Let the process grow by at most `budget_mb` from here (an accelerator's memory stand-in).

    The tuned allocator keeps a 1 GiB padded heap top that is already mapped, which an address-
    space limit would not see: release it and stop padding (trimming stays off, so the timed
    steps, which reuse their memory, are unaffected), then cap the address space.
    """
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc_trim(0)
    libc.mallopt(M_TOP_PAD, 0)
    limit = virtual_bytes() + budget_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def virtual_bytes() -> int:
    """This process's virtual memory size (VmSize)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def make_batch(run, indices: list[int]):
    """One collated batch of store graphs `indices`, as the training loader makes it."""
    dataset = GraphDataset(run.store, np.asarray(indices, np.int64), z_table_of(run.model),
                           float(run.model.r_max), DTYPES[run.cfg.model.dtype])
    return next(iter(run.make_loader(dataset, [list(range(len(indices)))])))


def time_steps(run, batch, repeats: int, min_time_s: float = 0.0,
               max_repeats: int = 0) -> tuple[list[float], list[float]]:
    """Wall and thread CPU seconds of each training step (forward, backward, optimiser) on
    `batch`: `repeats` steps, more while they sum to less than `min_time_s` (up to
    `max_repeats`), so that small batches get a median as stable as large ones."""
    graphs, atoms = float(batch.num_graphs), float(batch.num_nodes)
    walls: list[float] = []
    cpus: list[float] = []
    while len(walls) < repeats or (sum(walls) < min_time_s and len(walls) < max_repeats):
        t, c0 = StepTimes(), time.thread_time()
        train_step(run, batch, graphs, atoms, len(walls), t)
        cpus.append(time.thread_time() - c0)
        walls.append(t.compute_s + t.optim_s)
    return walls, cpus


def is_oom(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or any(m in str(err).lower() for m in OOM_MARKERS)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    cfg = load_config(overrides=spec.get("overrides", []))
    with tempfile.TemporaryDirectory() as out:
        graphs = spec["graphs"]  # a store folder, or a list of them (a union)
        graphs = [Path(g) for g in graphs] if isinstance(graphs, list) else Path(graphs)
        run = build_run(cfg, graphs, Path(spec["split"]), Path(out), DistEnv(),
                        torch.device("cpu"))
    batches = spec["batches"]
    groups = spec.get("groups", [0] * len(batches))
    time_steps(run, make_batch(run, batches[0]), 1)  # warm-up: thread pools, caches
    if spec.get("memory_budget_mb"):
        limit_memory(int(spec["memory_budget_mb"]))
    failed_groups = set()
    for index, indices in enumerate(batches):
        if groups[index] in failed_groups:
            emit({"index": index, "status": "skipped"})
            continue
        try:
            batch = make_batch(run, indices)
            times, cpus = time_steps(run, batch, int(spec.get("repeats", 3)),
                               float(spec.get("min_time_s", 0.0)), int(spec.get("max_repeats", 0)))
        except (RuntimeError, MemoryError) as err:
            if not is_oom(err):
                raise
            emit({"index": index, "status": "oom", "error": str(err).splitlines()[0][:200]})
            failed_groups.add(groups[index])
            continue
        emit({"index": index, "status": "ok", "step_s": statistics.median(times),
              "step_min_s": min(times), "step_max_s": max(times), "repeats": len(times),
              "step_cpu_s": statistics.median(cpus),
              "graphs": int(batch.num_graphs),
              "atoms": int(batch.num_nodes), "edges": int(batch.edge_index.shape[1]),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
