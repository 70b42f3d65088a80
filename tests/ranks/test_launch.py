"""`cfmtrain launch`: the command it execs in each setting (torchrun, srun in an allocation, a
task of a step, one process), and a real local run with 2 gloo ranks, SIGTERM forwarding and exit
codes. The srun path is checked here as the command it builds; tests/workflow/test_slurm.py runs it
on a real Slurm."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

from cfmtrain.malloc_env import MALLOC_ENV
from cfmtrain.ranks.launch import launch_mode, plan

ARGS = ["train", "--config", "run.yaml"]
BATCH = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_CPUS_PER_TASK": "4",
         "SLURM_MEM_PER_CPU": "100", "SLURM_CONF": "/etc/slurm/x.conf", "PATH": "/bin"}
STEP = {**BATCH, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}


def test_outside_slurm_uses_torchrun_with_the_allocator_settings():
    mode, argv, env = plan(2, 3, "cfmtrain", ARGS, {"PATH": "/bin", "RANK": "9"})
    assert mode == "torchrun"
    assert argv == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", "-m", "cfmtrain", *ARGS]
    assert env["OMP_NUM_THREADS"] == "3" and "RANK" not in env
    assert all(env[k] == v for k, v in MALLOC_ENV.items())


def test_one_rank_runs_directly_as_rank_zero():
    for environ in ({"PATH": "/bin"}, BATCH):
        mode, argv, env = plan(1, None, "cfmtrain", ARGS, environ)
        assert mode == "direct" and argv == [sys.executable, "-m", "cfmtrain", *ARGS]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("0", "1", "0")
        assert env["MALLOC_MMAP_MAX_"] == MALLOC_ENV["MALLOC_MMAP_MAX_"]


def test_in_an_allocation_srun_starts_one_task_per_rank():
    mode, argv, env = plan(2, 4, "cfmtrain", ARGS, {**BATCH, "WORLD_SIZE": "5"})
    assert mode == "srun"
    assert argv == ["srun", "--ntasks=2", "--kill-on-bad-exit=1",
                    f"--job-name=cfmtrain-launch-{os.getpid()}", "--cpus-per-task=4",
                    sys.executable, "-m", "cfmtrain", *ARGS]
    # the job's identity stays; the batch script's geometry would override the new step's
    assert env["SLURM_JOB_ID"] == "77" and env["SLURM_CONF"] == "/etc/slurm/x.conf"
    assert not {"SLURM_NTASKS", "SLURM_PROCID", "SLURM_CPUS_PER_TASK", "WORLD_SIZE"} & set(env)
    assert env["OMP_NUM_THREADS"] == "4" and env["MALLOC_TOP_PAD_"] == MALLOC_ENV["MALLOC_TOP_PAD_"]


def test_extra_srun_options_for_gpu_binding():
    _, argv, _ = plan(4, 16, "cfmtrain", ARGS, BATCH, "--gpus-per-task=1 --gpu-bind=closest")
    assert argv[4:7] == ["--cpus-per-task=16", "--gpus-per-task=1", "--gpu-bind=closest"]
    assert plan(4, 16, "cfmtrain", ARGS, {}, "--gpus-per-task=1")[1][2] == "torch.distributed.run"


def test_inside_another_step_the_new_step_overlaps_it():
    mode, argv, _ = plan(2, None, "cfmtrain", ARGS, STEP)
    assert mode == "srun" and "--overlap" in argv and not any("cpus-per" in a for a in argv)


def test_a_task_of_a_matching_step_is_already_a_rank():
    task = {**STEP, "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}
    assert launch_mode(2, task) == "task"
    mode, argv, env = plan(2, 2, "cfmtrain.train", ARGS, task)
    assert argv == [sys.executable, "-m", "cfmtrain.train", *ARGS]
    assert env["SLURM_PROCID"] == "1" and "RANK" not in env and env["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize("ranks, threads", [(0, None), (2, 0)])
def test_bad_counts_are_refused(ranks, threads):
    with pytest.raises(ValueError, match="at least 1"):
        plan(ranks, threads, "cfmtrain", ARGS, {})


def launch(*args: str, **kwargs) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.Popen([sys.executable, "-m", "cfmtrain", "launch", *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)


def test_exit_code_and_missing_command():
    proc = launch("--ranks", "1", "--module", "cfmtrain.ranks.distenv", "--", "--no-such-option")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "--no-such-option" in out  # the rank's own exit code
    proc = launch("--ranks", "2")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "give the command after `--`" in out


def two_ranks_holding(folder: Path) -> subprocess.Popen:
    """2 local ranks of the distenv smoke check, both in their hold (signal handlers set)."""
    proc = launch("--ranks", "2", "--threads", "1", "--module", "cfmtrain.ranks.distenv", "--",
                  "--output", str(folder), "--hold", "120")
    deadline = time.monotonic() + 240
    while len(list(folder.glob("rank*.json"))) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.stdout.read())
        time.sleep(0.5)
    time.sleep(1.0)
    return proc


@pytest.mark.dist
def test_two_local_ranks_all_reduce_and_get_sigterm(tmp_path):
    proc = two_ranks_holding(tmp_path)
    try:  # both ranks are in their hold, signal handlers installed
        proc.send_signal(signal.SIGTERM)  # the launcher became torchrun, which must forward it
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in records] == [0, 1]
    assert all(r["world_size"] == 2 and r["all_reduce_sum"] == 3.0 for r in records)
    assert all(r["source"] == "torchrun" and r["torch_threads"] == 1 for r in records)
    assert all(r["environ"]["MALLOC_MMAP_MAX_"] == "0" for r in records)
    assert records[0]["pid"] != records[1]["pid"]
    for r in (0, 1):
        assert (tmp_path / f"rank{r}.sigterm").read_text() == str(int(signal.SIGTERM)), out


@pytest.mark.dist
def test_two_local_ranks_stopped_after_the_run_was_complete_exit_0(tmp_path):
    """torchrun's agent exits 1 on SIGTERM even when its ranks are done; once the run's
    summary.json is written (the run is complete), the launcher exits 0, so that Snakemake keeps
    the outputs."""
    proc = two_ranks_holding(tmp_path)
    try:
        (tmp_path / "summary.json").write_text("{}")  # what a complete run writes last
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopped after the run was complete" in out
    for r in (0, 1):  # the ranks did get the stop
        assert (tmp_path / f"rank{r}.sigterm").read_text() == str(int(signal.SIGTERM)), out
