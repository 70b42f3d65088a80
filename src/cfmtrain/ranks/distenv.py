"""Where this process sits in a distributed run: rank, world size, rendezvous and CPU threads,
read from torchrun's or a Slurm step's environment, and the torch.distributed set-up that uses it.

`python -m cfmtrain.ranks.distenv --output DIR` is a smoke check: every rank all-reduces its rank
and writes `DIR/rank<r>.json`, so a launcher (torchrun, srun) can be verified end to end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from itertools import product
from pathlib import Path

PORT_BASE = 10000  # Slurm ports are PORT_BASE + job_id % PORT_SPAN: 10000..29999, below the
PORT_SPAN = 20000  # Linux ephemeral range (32768+), so a rendezvous port is never taken by chance
DEFAULT_PORT = 29500  # torchrun's default, used only when nothing else is known
TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
LAUNCHED_AT = "CFMTRAIN_LAUNCHED_AT"  # `cfmtrain launch` sets it: when the ranks were launched


class DistEnvError(ValueError):
    """The environment describes an impossible or incomplete distributed run."""


@dataclass(frozen=True)
class DistEnv:
    """One process's place in a run; `source` is "torchrun", "slurm", "single" or "env"
    (rank variables set by hand)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    cpus_per_task: int = 1
    source: str = "single"

    @property
    def is_main(self) -> bool:
        """True on the rank that alone writes outputs."""
        return self.rank == 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> DistEnv:
        """Read torchrun's variables if any is set, else a Slurm task's (a process started by
        srun: SLURM_STEP_ID and SLURM_PROCID set), else a single process. Raises DistEnvError."""
        if any(k in environ for k in TORCHRUN_KEYS):
            return _from_torchrun(environ)
        if "SLURM_PROCID" in environ and "SLURM_STEP_ID" in environ:
            return _from_slurm(environ)
        cpus = _int_var(environ, "OMP_NUM_THREADS") if "OMP_NUM_THREADS" in environ else None
        return cls(cpus_per_task=cpus or available_cpus(), source="single")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which Slurm and cgroups restrict)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _int_var(environ: Mapping[str, str], key: str, minimum: int = 0) -> int:
    raw = environ.get(key)
    if raw is None:
        raise DistEnvError(f"environment variable {key} is missing")
    try:
        value = int(raw.strip())
    except ValueError:
        raise DistEnvError(f"environment variable {key}={raw!r} is not an integer") from None
    if value < minimum:
        raise DistEnvError(f"environment variable {key}={value} is below {minimum}")
    return value


def _check_ranks(rank: int, world: int, local: int, keys: tuple[str, str, str]) -> None:
    if rank >= world:
        raise DistEnvError(f"{keys[0]}={rank} is not below {keys[1]}={world}")
    if local > rank:
        raise DistEnvError(f"{keys[2]}={local} exceeds {keys[0]}={rank}")


def _from_torchrun(environ: Mapping[str, str]) -> DistEnv:
    missing = [k for k in TORCHRUN_KEYS if k not in environ]
    if missing:
        raise DistEnvError(f"torchrun environment incomplete: {', '.join(missing)} missing "
                           f"while {', '.join(k for k in TORCHRUN_KEYS if k in environ)} set")
    rank = _int_var(environ, "RANK")
    world = _int_var(environ, "WORLD_SIZE", minimum=1)
    local = _int_var(environ, "LOCAL_RANK")
    _check_ranks(rank, world, local, TORCHRUN_KEYS)
    if world > 1 and not ("MASTER_ADDR" in environ and "MASTER_PORT" in environ):
        raise DistEnvError(f"WORLD_SIZE={world} needs MASTER_ADDR and MASTER_PORT")
    port = _int_var(environ, "MASTER_PORT", 1) if "MASTER_PORT" in environ else DEFAULT_PORT
    if "OMP_NUM_THREADS" in environ:
        cpus = _int_var(environ, "OMP_NUM_THREADS", 1)
    else:
        per_node = _int_var(environ, "LOCAL_WORLD_SIZE", 1) if "LOCAL_WORLD_SIZE" in environ else 1
        cpus = max(1, available_cpus() // per_node)
    return DistEnv(rank, world, local, environ.get("MASTER_ADDR", "127.0.0.1"), port, cpus,
                   _rank_vars_source(environ, world))


def _rank_vars_source(environ: Mapping[str, str], world: int) -> str:
    """Who set RANK & co.: torchrun (it also sets TORCHELASTIC_RUN_ID), else cfmtrain's launcher
    starting one rank directly (inside a Slurm job or not), else the user ("env")."""
    if "TORCHELASTIC_RUN_ID" in environ:
        return "torchrun"
    if world == 1:
        return "slurm" if "SLURM_JOB_ID" in environ or "SLURM_JOBID" in environ else "single"
    return "env"


def _from_slurm(environ: Mapping[str, str]) -> DistEnv:
    keys = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
    rank = _int_var(environ, keys[0])
    world = _int_var(environ, keys[1], minimum=1)
    local = _int_var(environ, keys[2])
    _check_ranks(rank, world, local, keys)
    if "SLURM_STEP_NUM_TASKS" in environ:
        step_tasks = _int_var(environ, "SLURM_STEP_NUM_TASKS", 1)
        if step_tasks != world:
            raise DistEnvError(f"SLURM_NTASKS={world} differs from SLURM_STEP_NUM_TASKS="
                               f"{step_tasks}: the step's task count must be the world size")
    return DistEnv(rank, world, local, slurm_master_addr(environ), slurm_master_port(environ),
                   _slurm_cpus(environ), "slurm")


def _slurm_cpus(environ: Mapping[str, str]) -> int:
    """Slurm gives a task one CPU unless --cpus-per-task was requested."""
    for key in ("SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"):
        if key in environ:
            return _int_var(environ, key, minimum=1)
    return 1


def slurm_master_addr(environ: Mapping[str, str]) -> str:
    """MASTER_ADDR if set, else the first host of the step's (or job's) node list."""
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"]
    for key in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(key):
            try:
                return expand_hostlist(environ[key])[0]
            except ValueError as err:
                raise DistEnvError(f"{key}={environ[key]!r}: {err}") from None
    raise DistEnvError("no node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST) and no MASTER_ADDR")


def slurm_master_port(environ: Mapping[str, str]) -> int:
    """MASTER_PORT if set, else PORT_BASE + job_id % PORT_SPAN, the same on every node."""
    if "MASTER_PORT" in environ:
        return _int_var(environ, "MASTER_PORT", minimum=1)
    for key in ("SLURM_JOB_ID", "SLURM_JOBID"):
        if key in environ:
            return PORT_BASE + _int_var(environ, key) % PORT_SPAN
    raise DistEnvError("no SLURM_JOB_ID and no MASTER_PORT to derive the rendezvous port from")


_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def _expand_brackets(body: str, text: str) -> list[str]:
    """`001-003,7` -> ['001', '002', '003', '7']: zero padding follows the lower bound."""
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item.strip())
        if not m:
            raise ValueError(f"bad range {item!r} in host list {text!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in host list {text!r}")
        out.extend(f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
    return out


def _expand_host(part: str, text: str) -> list[str]:
    """One host expression without top-level commas, e.g. `gpu-[08-10]-ib` or `r[1-2]n[1-2]`."""
    pieces = re.split(r"\[([^\[\]]*)\]", part)  # literals at even, bracket bodies at odd indices
    if any("[" in p or "]" in p for p in pieces[::2]):
        raise ValueError(f"unbalanced brackets in host list {text!r}")
    choices = [[p] if i % 2 == 0 else _expand_brackets(p, text) for i, p in enumerate(pieces)]
    return ["".join(combo) for combo in product(*choices)]


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list (`nid[001-004,007]`, `a[1-2],b3`, `gpu-[08-10]-ib`) in order."""
    hosts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced or nested brackets in host list {text!r}")
        if ch == "," and depth == 0:
            part = text[start:i].strip()
            if not part:
                raise ValueError(f"empty host name in host list {text!r}")
            hosts.extend(_expand_host(part, text))
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced brackets in host list {text!r}")
    return hosts


def init_process_group(env: DistEnv, backend: str | None = None, timeout_s: float = 600):
    """Start torch.distributed for `env` and return this rank's torch.device: gloo on CPU,
    NCCL on CUDA (`cuda:<local_rank>`, or the one GPU a task sees when srun binds GPUs to tasks);
    torch threads = env.cpus_per_task. A single process gets an in-memory store (no port).
    Collectives time out after timeout_s, so a dead rank fails the others instead of hanging."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(env.cpus_per_task)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":  # all the node's GPUs visible: one per local rank; one bound: that one
        device = torch.device("cuda", env.local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if env.world_size == 1:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    else:
        host = f"[{env.master_addr}]" if ":" in env.master_addr else env.master_addr
        dist.init_process_group(backend, init_method=f"tcp://{host}:{env.master_port}",
                                rank=env.rank, world_size=env.world_size, timeout=timeout)
    return device


def destroy() -> None:
    """Tear down the process group if one is running."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _check(output: Path, hold_s: float, timeout_s: float) -> int:
    """The smoke check: all-reduce (rank + 1), write rank<r>.json, optionally hold for a signal."""
    import torch
    import torch.distributed as dist

    env = DistEnv.from_environ()
    init_process_group(env, timeout_s=timeout_s)
    total = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(total)
    record = {**asdict(env), "all_reduce_sum": total.item(), "host": socket.gethostname(),
              "pid": os.getpid(), "torch_threads": torch.get_num_threads(),
              "environ": {k: v for k, v in os.environ.items()
                          if k.startswith(("SLURM_", "MALLOC_", "OMP_")) or k in TORCHRUN_KEYS}}
    output.mkdir(parents=True, exist_ok=True)
    (output / f"rank{env.rank}.json").write_text(json.dumps(record, indent=1))
    if hold_s > 0:  # wait for SIGTERM, which the launcher must forward to every rank
        def on_term(signum, frame):  # exit at once: no interpreter teardown with gloo alive
            (output / f"rank{env.rank}.sigterm").write_text(str(signum))
            os._exit(128 + signum)
        signal.signal(signal.SIGTERM, on_term)
        time.sleep(hold_s)
    dist.barrier()
    destroy()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m cfmtrain.ranks.distenv --output DIR [--hold S]`."""
    parser = argparse.ArgumentParser(prog="python -m cfmtrain.ranks.distenv",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="folder for rank<r>.json")
    parser.add_argument("--hold", type=float, default=0.0,
                        help="seconds to wait after writing (SIGTERM writes rank<r>.sigterm)")
    parser.add_argument("--timeout", type=float, default=60.0, help="collective timeout (s)")
    args = parser.parse_args(argv)
    return _check(args.output, args.hold, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
