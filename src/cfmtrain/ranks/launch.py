"""`cfmtrain launch --ranks R [--threads T] -- <cfmtrain args>`: run R ranks of a cfmtrain command
with srun inside a Slurm allocation, with torchrun elsewhere, always with the allocator settings.

The launcher replaces itself (exec) by the single rank. srun stays its child, because srun turns
a SIGTERM into SIGKILL for its tasks: the launcher sends SIGTERM to the step's tasks instead
(scancel --signal), so every rank can checkpoint. torchrun stays its child too: its agent exits 1
on a SIGTERM even when the ranks had finished, so a stop that arrives after the run's
`summary.json` was written (the run is complete) exits 0. Otherwise the exit code is the run's.
srun and torchrun run under a keeper (cfmtrain.children): whatever ends the launcher, SIGKILL
included, they and every rank die with it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from cfmtrain import children
from cfmtrain.malloc_env import MALLOC_ENV
from cfmtrain.ranks.distenv import LAUNCHED_AT, TORCHRUN_KEYS, available_cpus

# Slurm variables that identify the job (kept for a new step); every other SLURM_* describes the
# current step or batch script and would override the new step's geometry, so it is dropped.
SLURM_JOB_KEYS = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CONF", "SLURM_CLUSTER_NAME", "SLURM_WORKING_CLUSTER",
    "SLURM_JOB_NAME", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST", "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP",
})
RANK_KEYS = (*TORCHRUN_KEYS, "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cfmtrain launch`; everything after `--` is the cfmtrain command to run."""
    parser.add_argument("--ranks", type=int, required=True, help="number of processes (ranks)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads per rank (srun --cpus-per-task; default: the job's "
                             "CPUs per task under Slurm, else the CPUs available / ranks)")
    parser.add_argument("--srun-args", default="",
                        help="extra srun options under Slurm, e.g. '--gpus-per-task=1 "
                             "--gpu-bind=closest' (ignored by torchrun)")
    parser.add_argument("--module", default="cfmtrain",
                        help="Python module each rank runs (default: cfmtrain)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- followed by the arguments of `python -m <module>`")


def launch_mode(ranks: int, environ: Mapping[str, str]) -> str:
    """"task": already one of `ranks` srun tasks; "srun": start a step in this Slurm allocation;
    "direct": one process here; "torchrun": `ranks` local processes."""
    if "SLURM_JOB_ID" in environ or "SLURM_JOBID" in environ:
        if "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ:
            tasks = environ.get("SLURM_STEP_NUM_TASKS", environ.get("SLURM_NTASKS", ""))
            if tasks.strip() == str(ranks) and ranks > 1:
                return "task"
        return "direct" if ranks == 1 else "srun"
    return "direct" if ranks == 1 else "torchrun"


def plan(ranks: int, threads: int | None, module: str, args: list[str],
         environ: Mapping[str, str], srun_args: str = "") -> tuple[str, list[str], dict[str, str]]:
    """The launch mode, the argv to exec and its environment."""
    if ranks < 1:
        raise ValueError(f"--ranks must be at least 1, got {ranks}")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be at least 1, got {threads}")
    mode = launch_mode(ranks, environ)
    env = {k: v for k, v in environ.items() if k not in RANK_KEYS}
    env.update(MALLOC_ENV)
    rank_cmd = [sys.executable, "-m", module, *args]
    if mode == "srun":
        nested = "SLURM_STEP_ID" in environ  # inside another step: share its CPUs (--overlap)
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k in SLURM_JOB_KEYS}
        argv = ["srun", f"--ntasks={ranks}", "--kill-on-bad-exit=1", f"--job-name={step_name()}"]
        argv += [f"--cpus-per-task={threads}"] if threads else []
        argv += ["--overlap"] if nested else []
        argv += shlex.split(srun_args)
        argv += rank_cmd
    elif mode == "torchrun":
        threads = threads or max(1, available_cpus() // ranks)
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(ranks), "-m", module, *args]
    else:
        argv = rank_cmd
        if mode == "direct":
            env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
            threads = threads or available_cpus()
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return mode, argv, env


def step_name() -> str:
    """The name of the srun step this launcher starts (to find it for signals)."""
    return f"cfmtrain-launch-{os.getpid()}"


def _find_step(environ: Mapping[str, str]) -> str | None:
    """`<job>.<step>` of this launcher's srun step, if Slurm lists it yet."""
    job = environ.get("SLURM_JOB_ID", environ.get("SLURM_JOBID", ""))
    result = children.run(["squeue", "--steps", "--noheader", "--jobs", job, "--format",
                           "%i %j"], env=environ, capture_output=True, text=True, timeout=30)
    for line in result.stdout.splitlines():
        step, _, name = line.strip().partition(" ")
        if name == step_name():
            return step
    return None


def allocation_cpus_per_task(environ: Mapping[str, str]) -> int | None:
    """CPUs per task of this Slurm job (`scontrol show job`), for a step without --threads:
    Snakemake's jobstep drops SLURM_CPUS_PER_TASK, and srun would then give each task one CPU."""
    job = environ.get("SLURM_JOB_ID", environ.get("SLURM_JOBID", ""))
    try:
        result = children.run(["scontrol", "show", "job", "--oneliner", job], env=environ,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\bCPUs/Task=(\d+)", result.stdout)
    return int(match.group(1)) if match and result.returncode == 0 else None


def run_srun(argv: list[str], env: dict[str, str]) -> int:
    """Run srun as a child, passing a SIGTERM on to every task as SIGTERM; srun's exit code."""
    proc = children.Popen(argv, env=env)

    def forward(signum: int, frame: object) -> None:
        try:
            step = _find_step(env)
            if step is not None:
                print(f"cfmtrain launch: SIGTERM -> step {step}", file=sys.stderr, flush=True)
                children.run(["scancel", "--signal=TERM", step], env=env, timeout=30,
                             check=True)
                return
        except (OSError, subprocess.SubprocessError) as err:
            print(f"cfmtrain launch: cannot signal the step ({err})", file=sys.stderr)
        proc.terminate()  # no step (yet): srun aborts the launch

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 128 - code if code < 0 else code


def completed_run(command: list[str], since: float) -> Path | None:
    """The summary.json in the command's `--output` folder (with `--repeats N`, of its last
    repeat, rep<N>) if written after `since` (epoch seconds): the run is complete (`cfmtrain
    train` writes it last, only then)."""
    if "--output" not in command[:-1]:
        return None
    folder = Path(command[command.index("--output") + 1])
    if "--repeats" in command[:-1]:
        last = int(command[command.index("--repeats") + 1])
        folder = folder / f"rep{last}"
    return summary_written(folder, since)


def summary_written(folder: Path, since: float) -> Path | None:
    """The run folder's summary.json if written after `since` (epoch seconds), else None."""
    summary = folder / "summary.json"
    try:
        return summary if summary.stat().st_mtime >= since else None
    except OSError:
        return None


def run_child(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, bool]:
    """Run `argv` as a child, passing a SIGTERM on; (its exit code, 128 + N if signal N ended it;
    whether a SIGTERM came)."""
    stopped: list[int] = []
    proc = children.Popen(argv, env=env)

    def forward(signum: int, frame: object) -> None:
        stopped.append(signum)
        proc.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return (128 - code if code < 0 else code), bool(stopped)


def run_torchrun(argv: list[str], env: dict[str, str], command: list[str]) -> int:
    """Run torchrun as a child, passing a SIGTERM on; its exit code, or 0 if the stop came
    after the run was complete."""
    since = time.time()
    code, stopped = run_child(argv, env)
    if code and stopped and (summary := completed_run(command, since)):
        print(f"cfmtrain launch: stopped after the run was complete ({summary} written): exit 0",
              file=sys.stderr, flush=True)
        return 0
    return code


def run(args: argparse.Namespace) -> int:
    """Launch; returns srun's or torchrun's exit code, or 127 if exec fails (else this process
    is replaced by the single rank)."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise SystemExit("cfmtrain launch: give the command after `--`, e.g. "
                         "`cfmtrain launch --ranks 2 -- train --config run.yaml`")
    threads = args.threads
    if threads is None and launch_mode(args.ranks, os.environ) == "srun":
        threads = allocation_cpus_per_task(os.environ)
    environ = {**os.environ, LAUNCHED_AT: f"{time.time():.6f}"}  # the ranks' start-up clock
    try:
        mode, argv, env = plan(args.ranks, threads, args.module, command, environ,
                               args.srun_args)
    except ValueError as err:
        raise SystemExit(f"cfmtrain launch: {err}") from None
    print(f"cfmtrain launch ({mode}): {shlex.join(argv)}", file=sys.stderr, flush=True)
    if mode == "srun":
        return run_srun(argv, env)
    if mode == "torchrun":
        return run_torchrun(argv, env, command)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as err:
        print(f"cfmtrain launch: cannot run {argv[0]}: {err}", file=sys.stderr)
    return 127


def main(argv: list[str] | None = None) -> int:
    """`python -m cfmtrain.ranks.launch ...`, the same as `cfmtrain launch ...`."""
    parser = argparse.ArgumentParser(prog="cfmtrain launch", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
