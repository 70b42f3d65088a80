"""A real Slurm: the project scripts start munged, slurmctld and slurmd on 127.0.0.1; then
`snakemake --profile slurm`, run from the repository root, runs a tiny ablation cell as one 2-task
job whose ranks `cfmtrain launch` starts with srun (before the workflow had a training rule: the
`distcheck` rule of tests/slurm_workflow), and a plain sbatch job checks the ranks' environment,
their gloo all-reduce and SIGTERM forwarding. The cluster's one node runs the jobs one by one."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".slurm"
DAEMONS = ("munged", "slurmctld", "slurmd")
# poll Slurm every second at first (the profile's 20 s suit a real cluster, not a test)
FAST_POLL = ["--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks",
             "1", "--latency-wait", "5"]
CELL = "results/train/mini/baseline/r2/summary.json"
DISTCHECK = "ranks/r2"
TINY_MODEL = {"hidden_irreps": "8x0e+8x1o", "max_ell": 2, "correlation": 2, "radial_mlp": [8, 8],
              "num_bessel": 4}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("slurmctld") is None,
                       reason="Slurm is not installed: run scripts/slurm/install.sh"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test cluster's slurmd runs as root"),
]


def _alive(name: str, pid: int) -> bool:
    """The process `pid` runs and is the daemon `name` (a recorded PID may have been reused)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == name.encode()
    except OSError:
        return False


@pytest.fixture(scope="module")
def slurm_env():
    """Start the single-node cluster (unless already up), yield the environment for snakemake,
    stop exactly the daemons the script started and check that they are gone."""
    pidfiles = {d: STATE / f"{d}.pid" for d in DAEMONS}
    was_running = all(p.exists() and _alive(d, int(p.read_text())) for d, p in pidfiles.items())
    subprocess.run(["bash", "scripts/slurm/start.sh"], cwd=ROOT, check=True, timeout=120)
    pids = {d: int(p.read_text()) for d, p in pidfiles.items()}
    assert all(_alive(d, pid) for d, pid in pids.items())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # jobs inherit it
    env["SLURM_CONF"] = str(STATE / "slurm.conf")
    try:
        yield env
    finally:
        if not was_running:
            subprocess.run(["bash", "scripts/slurm/stop.sh"], cwd=ROOT, check=True, timeout=120)
            assert not [d for d, pid in pids.items() if _alive(d, pid)]
            assert not any(p.exists() for p in pidfiles.values())


def snakemake_slurm(env, log: Path, *args: str) -> subprocess.Popen:
    """`snakemake --profile slurm ARGS` from the repository root, as a user types it."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "snakemake", "--profile", "slurm",
                                 *FAST_POLL, *args], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, log: Path, timeout: float = 400) -> str:
    """Wait for a snakemake run; its output, which must show success."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("snakemake --profile slurm timed out:\n" + log.read_text()[-4000:])
    out = log.read_text()
    assert proc.returncode == 0, out[-6000:]
    return out


def train_cell(work: Path, env: dict[str, str]) -> str | None:
    """The tiny ablation cell's target (a 2-rank baseline on ~30 graphs, a reduced model, two
    epochs), its inputs built locally so that only the cell goes through Slurm; None while the
    workflow has no training rule."""
    if "train.smk" not in (ROOT / "Snakefile").read_text():
        return None
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    config["datasets"]["mini"].update(scale=0.03, shards=1)
    settings = config["train"].setdefault("settings", {})
    settings.update(epochs=2, progress=False)
    settings.setdefault("model", {}).update(TINY_MODEL)
    (work / "tiny.yaml").write_text(yaml.safe_dump(config))
    prep = subprocess.run([sys.executable, "-m", "snakemake", CELL, "--cores", "2", "--directory",
                           str(work), "--configfile", str(work / "tiny.yaml"), "--omit-from",
                           "train_cell"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert prep.returncode == 0, prep.stdout[-3000:] + prep.stderr[-3000:]
    return CELL


@pytest.fixture(scope="module")
def runs(slurm_env, tmp_path_factory):
    """One `snakemake --profile slurm` run: the tiny ablation cell or, while the workflow has no
    training rule, the distcheck rule. Yields (process, working directory, log, target)."""
    work = tmp_path_factory.mktemp("slurm_run")
    target = train_cell(work, slurm_env) or DISTCHECK
    config = work / "tiny.yaml" if target == CELL else ROOT / "config/config.yaml"
    log = work / "snakemake.log"
    proc = snakemake_slurm(slurm_env, log, target, "--snakefile", "tests/slurm_workflow/Snakefile",
                           "--configfile", str(config), "--directory", str(work))
    try:
        yield proc, work, log, target
    finally:
        if proc.poll() is None:
            proc.terminate()  # the executor cancels its Slurm jobs
            proc.wait(timeout=60)


def scontrol_job(job_id: str, env) -> dict[str, str]:
    """`scontrol show job` as key -> value."""
    text = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True,
                          text=True, check=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text)) | {"JobId": job_id}


def slurm_job(out: str, rule: str, env) -> dict[str, str]:
    """The Slurm job of `rule` in this snakemake run."""
    job_id = re.findall(rf"SLURM jobid (\d+) \(log: \S+/rule_{rule}/", out)[-1]
    return scontrol_job(job_id, env)


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
            f"--threads 1 --module cfmtrain.train.distenv -- --output {out} --hold 300")
    job_id = subprocess.run(["sbatch", "--parsable", "-n2", "-c1", "-t", "10", "-o", str(job_log),
                             "-D", str(ROOT), "--wrap", wrap], env=slurm_env,
                            capture_output=True, text=True, check=True).stdout.split(";")[0].strip()
    try:
        wait_for(lambda: len(list(out.glob("rank*.json"))) == 2 and pidfile.exists(), 400,
                 lambda: job_log.read_text() if job_log.exists() else "job did not start")
        time.sleep(1.0)  # both ranks are holding, their handlers installed
        os.kill(int(pidfile.read_text()), signal.SIGTERM)
        wait_for(lambda: scontrol_job(job_id, slurm_env)["JobState"] not in
                 ("RUNNING", "COMPLETING"), 120, job_log.read_text)
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, check=False)
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
    proc, work, log, target = runs
    if target != CELL:
        pytest.skip("the workflow has no training rule yet: the distcheck rule ran instead")
    out = finish(proc, log)
    job = slurm_job(out, "train_cell", slurm_env)
    assert job["JobState"] == "COMPLETED" and job["NumTasks"] == "2", job
    run_log = (work / "logs/train/mini/baseline/r2.log").read_text()
    assert "cfmtrain launch (srun): srun --ntasks=2" in run_log, run_log[-3000:]
    summary = json.loads((work / CELL).read_text())
    assert (summary["variant"], summary["ranks"], summary["epochs"]) == ("baseline", 2, 2)
    assert summary["provenance"]["launcher"] == "slurm"
    assert summary["epoch_time_s"] > 0 and math.isfinite(summary["final_train_loss"])
    assert math.isfinite(summary["val_mae_forces"])
    steps = (work / "results/train/mini/baseline/r2/steps.csv").read_text().splitlines()
    rank_column = steps[0].split(",").index("rank")
    assert {line.split(",")[rank_column] for line in steps[1:]} == {"0", "1"}
    assert (work / "results/train/mini/baseline/r2/final.model").stat().st_size > 0


def test_distcheck_rule_through_slurm(slurm_env, runs):
    """Before the training rule existed: the same resources and launch, on the smoke check."""
    proc, work, log, target = runs
    if target != DISTCHECK:
        pytest.skip("the ablation cell ran instead (it covers the same path)")
    job = slurm_job(finish(proc, log), "distcheck", slurm_env)
    assert job["JobState"] == "COMPLETED" and job["NumTasks"] == "2", job
    check_rank_records(work / DISTCHECK, job["JobId"])
