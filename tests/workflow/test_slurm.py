"""A real Slurm: scripts/slurm/start.sh starts munged, slurmctld and slurmd on 127.0.0.1 (a
private state folder and free ports), then `snakemake --profile slurm`, run from the repository
root, trains a tiny ablation cell as one 2-task job whose ranks `cfmtrain launch` starts with
srun, and runs the `scale` target with its graph shards as job arrays; a plain sbatch job checks
the ranks' environment, their gloo all-reduce and SIGTERM forwarding; stop.sh stops exactly the
daemons start.sh recorded, also when a test fails.

Needs root and Debian's Slurm (`bash scripts/slurm/install.sh`); without them the test fails
(CFMTRAIN_SKIP_SLURM=1 skips it on purpose). One such test runs at a time on a machine (a lock:
the jobs' srun finds the configuration only at the global /etc/slurm/slurm.conf)."""

import fcntl
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from helpers import REPO

DAEMONS = ("munged", "slurmctld", "slurmd")
TOOLS = (*DAEMONS, "sinfo", "sbatch", "srun", "squeue", "scontrol", "scancel")
LOCK = Path(tempfile.gettempdir()) / "cfmtrain-slurm-test.lock"
# poll Slurm every second at first (the profile's 20 s suit a real cluster, not a test)
FAST_POLL = ["--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks",
             "1", "--latency-wait", "5"]
CELL = "results/train/mini/baseline/r2/summary.json"
TINY_MODEL = {"hidden_irreps": "8x0e+8x1o", "max_ell": 2, "correlation": 2, "radial_mlp": [8, 8],
              "num_bessel": 4}

# bounded: the lock waits at most 600 s, the cluster run itself takes 2-4 min on 2 busy cores
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(1200)]


def _require_slurm() -> None:
    """Fail, saying what to do, unless this machine can run the test cluster."""
    if os.environ.get("CFMTRAIN_SKIP_SLURM") == "1":
        pytest.skip("CFMTRAIN_SKIP_SLURM=1: the real-Slurm test is switched off")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)} missing): run "
                    "`bash scripts/slurm/install.sh` as root (Debian, apt), or set "
                    "CFMTRAIN_SKIP_SLURM=1 to skip this test", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the test cluster's slurmd must run as root (and start.sh links "
                    "/etc/slurm/slurm.conf): run as root, or set CFMTRAIN_SKIP_SLURM=1",
                    pytrace=False)


@contextmanager
def machine_lock(timeout: float):
    """Hold the machine-wide lock of this test (released when the process dies)."""
    with open(LOCK, "a+") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.seek(0)
                    pytest.fail(f"another real-Slurm test (pid {handle.read().strip()}) held "
                                f"{LOCK} for over {timeout:.0f} s", pytrace=False)
                time.sleep(1)
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def free_port_pair() -> int:
    """A port p with p and p + 1 free (slurmctld, slurmd), below the rendezvous ports (10000+)
    and the ephemeral range."""
    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return True
            except OSError:
                return False
    for port in random.Random().sample(range(7000, 9990, 2), 200):
        if free(port) and free(port + 1):
            return port
    raise RuntimeError("no two free ports in 7000-9999")


def _alive(name: str, pid: int) -> bool:
    """The process `pid` runs and is the daemon `name` (a recorded PID may have been reused)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == name.encode()
    except OSError:
        return False


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    """Start a fresh single-node cluster, yield the environment for snakemake and sbatch, then
    stop exactly the daemons start.sh recorded and check that they are gone."""
    _require_slurm()
    with machine_lock(timeout=600):
        state = tmp_path_factory.mktemp("slurm_state")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # jobs inherit it
        env.update(CFM_SLURM_DIR=str(state), CFM_SLURM_PORT=str(free_port_pair()),
                   SLURM_CONF=str(state / "slurm.conf"))
        pids = {}
        try:
            start = subprocess.run(["bash", "scripts/slurm/start.sh"], cwd=REPO, env=env,
                                   capture_output=True, text=True, timeout=120)
            assert start.returncode == 0, start.stdout + start.stderr
            pids = {d: int((state / f"{d}.pid").read_text()) for d in DAEMONS}
            assert all(_alive(d, pid) for d, pid in pids.items()), pids
            yield env
        finally:
            subprocess.run(["bash", "scripts/slurm/stop.sh"], cwd=REPO, env=env, timeout=120)
            assert not [d for d, pid in pids.items() if _alive(d, pid)], pids
            assert not list(state.glob("*.pid"))


def snakemake_slurm(env, log: Path, *args: str) -> subprocess.Popen:
    """`snakemake --profile slurm ARGS` from the repository root, as a user types it."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "snakemake", "--profile", "slurm",
                                 *FAST_POLL, *args], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, text=True)


def stop(proc: subprocess.Popen, log: Path, env) -> None:
    """End a snakemake run that is still going and cancel the Slurm jobs it submitted."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    jobs = re.findall(r"submitted with SLURM jobid (\d+)", log.read_text())
    if jobs:
        subprocess.run(["scancel", *jobs], env=env, capture_output=True, timeout=30)


def finish(proc: subprocess.Popen, log: Path, env, timeout: float = 400) -> str:
    """Wait for a snakemake run; its output, which must show success."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc, log, env)
        pytest.fail("snakemake --profile slurm timed out:\n" + log.read_text()[-4000:])
    out = log.read_text()
    assert proc.returncode == 0, out[-6000:]
    return out


def prepare_cell(work: Path, env: dict[str, str]) -> Path:
    """The tiny ablation cell's inputs (a 2-rank baseline on ~30 graphs, a reduced model, two
    epochs), built locally so that only the cell goes through Slurm; its config file."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["datasets"]["mini"].update(scale=0.03, shards=1)
    config["train"]["repeats"] = 1  # one run: the repeats are tested locally (test_train_repeats)
    settings = config["train"].setdefault("settings", {})
    settings.update(epochs=2, progress=False, threads=1)
    settings.setdefault("model", {}).update(TINY_MODEL)
    (work / "tiny.yaml").write_text(yaml.safe_dump(config))
    prep = subprocess.run([sys.executable, "-m", "snakemake", CELL, "--cores", "2", "--directory",
                           str(work), "--configfile", str(work / "tiny.yaml"), "--omit-from",
                           "train_cell"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert prep.returncode == 0, prep.stdout[-3000:] + prep.stderr[-3000:]
    return work / "tiny.yaml"


@pytest.fixture(scope="module")
def runs(slurm_env, tmp_path_factory):
    """One `snakemake --profile slurm` run of the tiny ablation cell.
    Yields (process, working directory, log)."""
    work = tmp_path_factory.mktemp("slurm_run")
    config = prepare_cell(work, slurm_env)
    log = work / "snakemake.log"
    proc = snakemake_slurm(slurm_env, log, CELL, "--configfile", str(config), "--directory",
                           str(work))
    try:
        yield proc, work, log
    finally:
        stop(proc, log, slurm_env)


def scontrol_job(job_id: str, env) -> dict[str, str]:
    """`scontrol show job` as key -> value."""
    text = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True,
                          text=True, check=True, timeout=30).stdout
    return dict(re.findall(r"([\w/]+)=(\S*)", text)) | {"JobId": job_id}


def wait_for(condition, timeout: float, message) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message()
        time.sleep(0.5)


def test_ranks_through_srun_and_sigterm(slurm_env, runs, tmp_path):
    """`cfmtrain launch --ranks 2` in an allocation: two srun tasks with their own SLURM_PROCID
    all-reduce over gloo. srun would turn a SIGTERM into SIGKILL; the launcher passes it to the
    ranks as SIGTERM (what a preempted training rank needs to checkpoint) and exits with their
    code. Submitted behind the job of `runs`, so that it runs while that executor waits to poll."""
    log = runs[2]
    wait_for(lambda: "submitted with SLURM jobid" in log.read_text(), 120,
             lambda: log.read_text()[-3000:])
    out, pidfile, job_log = tmp_path / "ranks", tmp_path / "launcher.pid", tmp_path / "job.log"
    wrap = (f"echo $$ > {pidfile}; exec {sys.executable} -m cfmtrain launch --ranks 2 "
            f"--threads 1 --module cfmtrain.ranks.distenv -- --output {out} --hold 300")
    job_id = subprocess.run(["sbatch", "--parsable", "-n2", "-c1", "-t", "10", "-o", str(job_log),
                             "-D", str(REPO), "--wrap", wrap], env=slurm_env, timeout=30,
                            capture_output=True, text=True, check=True).stdout.split(";")[0].strip()
    try:
        wait_for(lambda: len(list(out.glob("rank*.json"))) == 2 and pidfile.exists(), 400,
                 lambda: job_log.read_text() if job_log.exists() else "job did not start")
        time.sleep(1.0)  # both ranks are holding, their handlers installed
        os.kill(int(pidfile.read_text()), signal.SIGTERM)
        wait_for(lambda: scontrol_job(job_id, slurm_env)["JobState"] not in
                 ("RUNNING", "COMPLETING"), 120, job_log.read_text)
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, capture_output=True, timeout=30)
    state, text = scontrol_job(job_id, slurm_env), job_log.read_text()
    assert state["ExitCode"] == "143:0", (state, text)  # the ranks' 128 + SIGTERM, passed on
    assert "cfmtrain launch (srun): srun --ntasks=2" in text
    for rank in (0, 1):
        assert (out / f"rank{rank}.sigterm").read_text() == str(int(signal.SIGTERM)), text
    check_rank_records(out, job_id)


def check_rank_records(folder: Path, job_id: str) -> None:
    """rank<r>.json of the distenv smoke check: two srun tasks of one step of job `job_id`."""
    records = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, rec in enumerate(records):
        assert (rec["rank"], rec["world_size"], rec["source"]) == (rank, 2, "slurm")
        assert rec["environ"]["SLURM_PROCID"] == str(rank)
        assert rec["environ"]["SLURM_JOB_ID"] == job_id
        assert rec["environ"]["SLURM_STEP_ID"] == "0"  # a step of its own, not the batch script
        assert rec["all_reduce_sum"] == 3.0  # gloo all-reduce of (rank + 1) over both ranks
        assert rec["environ"]["MALLOC_MMAP_MAX_"] == "0" and rec["torch_threads"] == 1
        assert rec["master_port"] == 10000 + int(job_id) % 20000
    assert records[0]["pid"] != records[1]["pid"]


def test_tiny_ablation_cell_through_slurm(slurm_env, runs):
    proc, work, log = runs
    out = finish(proc, log, slurm_env)
    job_id = re.findall(r"SLURM jobid (\d+) \(log: \S+/rule_train_cell/", out)[-1]
    job = scontrol_job(job_id, slurm_env)
    assert job["JobState"] == "COMPLETED" and job["NumTasks"] == "2", job
    assert job["NumCPUs"] == "2" and job["CPUs/Task"] == "1", job  # threads = ranks x 1
    run_log = (work / "logs/train/mini/baseline/r2.log").read_text()
    assert "cfmtrain launch (srun): srun --ntasks=2" in run_log, run_log[-3000:]
    assert "--cpus-per-task=1" in run_log, run_log[-3000:]
    summary = json.loads((work / CELL).read_text())
    assert (summary["variant"], summary["ranks"], summary["epochs"]) == ("baseline", 2, 2)
    assert summary["provenance"]["launcher"] == "slurm"
    assert summary["epoch_time_s"] > 0 and math.isfinite(summary["final_train_loss"])
    assert math.isfinite(summary["val_mae_forces"])
    steps = (work / "results/train/mini/baseline/r2/steps.csv").read_text().splitlines()
    rank_column = steps[0].split(",").index("rank")
    assert {line.split(",")[rank_column] for line in steps[1:]} == {"0", "1"}
    assert (work / "results/train/mini/baseline/r2/final.model").stat().st_size > 0


def test_the_scale_target_fans_out_as_job_arrays(slurm_env, tmp_path):
    """`snakemake --profile slurm scale`: a count's graph shards go as a Slurm job array
    (the profile's slurm-array-jobs), not one sbatch call per shard, each task asking the
    profile's 1 GB; the short training is one 2-task job whose ranks srun starts; the table
    is collected from the job's records."""
    work = tmp_path / "scale"
    work.mkdir()
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["scale"] = {"graphs": [300], "steps": 3, "shard_graphs": 100}
    (work / "c.yaml").write_text(yaml.safe_dump(config))
    log = work / "snakemake.log"
    proc = snakemake_slurm(slurm_env, log, "scale", "--configfile", str(work / "c.yaml"),
                           "--directory", str(work))
    try:
        out = finish(proc, log, slurm_env, timeout=900)
    finally:
        stop(proc, log, slurm_env)
    arrays = re.findall(r"Submitted array job with Snakemake IDs ([\d,]+) and SLURM job ID "
                        r"(\d+)\. The individual task IDs are 1-(\d+)\.", out)
    assert sum(int(tasks) for _, _, tasks in arrays) == 3, out[-4000:]  # 3 shards
    assert not re.search(r"SLURM jobid \d+ \(log: \S+/rule_graph_shard/", out), out[-4000:]
    for _, job_id, _ in arrays:
        job = scontrol_job(job_id, slurm_env)
        assert job["JobState"] == "COMPLETED" and job["ArrayJobId"] == job_id, job
        memory = int(re.fullmatch(r"(\d+)M", job["MinMemoryNode"]).group(1))
        assert 1000 <= memory <= 2000, job  # the profile's 1 GB (and the plugin's array payload)
    trainings = re.findall(r"SLURM jobid (\d+) \(log: \S+/rule_scale_train/", out)
    assert len(trainings) == 1, out[-4000:]
    for job_id in trainings:
        job = scontrol_job(job_id, slurm_env)
        assert job["JobState"] == "COMPLETED" and job["NumTasks"] == "2", job
    assert "cfmtrain launch (srun): srun --ntasks=2" in (
        work / "logs/scale/scale_300.log").read_text()
    rows = (work / "results/bench/scale.csv").read_text().splitlines()
    assert {line.split(",")[0] for line in rows[1:]} == {"300"}
    assert any(line.startswith("300,first_step,") for line in rows), rows
