"""DistEnv maps torchrun and Slurm environments to ranks: compressed node lists (checked
against python-hostlist), ports from the job id, threads, and errors for bad environments."""

import os

import hostlist
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cfmtrain.ranks.distenv import (
    PORT_BASE,
    PORT_SPAN,
    DistEnv,
    DistEnvError,
    available_cpus,
    destroy,
    expand_hostlist,
    init_process_group,
)

# a task's environment as srun sets it (recorded from rank 1 of `srun -n2 -c3` on a real Slurm)
SLURM_TASK = {
    "SLURM_JOB_ID": "123456", "SLURM_JOBID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
    "SLURM_CPUS_PER_TASK": "3", "SLURM_JOB_NODELIST": "nid[001-004,007]",
    "SLURM_STEP_NODELIST": "nid[002-004,007]", "SLURM_NODEID": "1",
}


@pytest.mark.parametrize("text, hosts", [
    ("nid[001-004,007]", ["nid001", "nid002", "nid003", "nid004", "nid007"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("gpu-[08-10]-ib", ["gpu-08-ib", "gpu-09-ib", "gpu-10-ib"]),
    ("x[8-10]", ["x8", "x9", "x10"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("node17", ["node17"]),
    ("c[0998-1001],login", ["c0998", "c0999", "c1000", "c1001", "login"]),
])
def test_compressed_node_lists(text, hosts):
    assert expand_hostlist(text) == hosts
    assert expand_hostlist(text) == hostlist.expand_hostlist(text, allow_duplicates=True)


_names = st.text(alphabet="abcxyz-", min_size=1, max_size=4)


@st.composite
def _hostlists(draw):
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        part = draw(_names)
        for _ in range(draw(st.integers(0, 2))):
            ranges = []
            for _ in range(draw(st.integers(1, 3))):
                lo, width = draw(st.integers(0, 120)), draw(st.integers(1, 4))
                hi = lo + draw(st.integers(0, 12))
                ranges.append(f"{lo:0{width}d}" + (f"-{hi}" if hi > lo else ""))
            part += "[" + ",".join(ranges) + "]" + draw(st.sampled_from(["", "-ib", "x"]))
        parts.append(part)
    return ",".join(parts)


@settings(max_examples=300, deadline=None)
@given(_hostlists())
def test_node_lists_agree_with_python_hostlist(text):
    assert expand_hostlist(text) == hostlist.expand_hostlist(text, allow_duplicates=True)


@pytest.mark.parametrize("bad", ["nid[001-004", "nid001-004]", "a[[1-2]]", "a[3-1]", "a[1-x]",
                                 "a[]", "a,,b"])
def test_malformed_node_lists_are_refused(bad):
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(bad)


def test_slurm_task_environment():
    env = DistEnv.from_environ(SLURM_TASK)
    assert env == DistEnv(rank=5, world_size=8, local_rank=1, master_addr="nid002",
                          master_port=PORT_BASE + 123456 % PORT_SPAN, cpus_per_task=3,
                          source="slurm")
    assert env.master_port == 13456 and not env.is_main


def test_slurm_job_node_list_and_defaults():
    job_only = {k: v for k, v in SLURM_TASK.items()
                if k not in ("SLURM_STEP_NODELIST", "SLURM_CPUS_PER_TASK")}
    env = DistEnv.from_environ(job_only)
    assert env.master_addr == "nid001"
    assert env.cpus_per_task == 1  # Slurm's default: one CPU per task


def test_slurm_overrides_from_master_variables():
    env = DistEnv.from_environ({**SLURM_TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "4242"})
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 4242)


@pytest.mark.parametrize("job_id", [0, 1, 19999, 20000, 123456, 4294967295])
def test_ports_derive_from_the_job_id(job_id):
    env = DistEnv.from_environ({**SLURM_TASK, "SLURM_JOB_ID": str(job_id)})
    assert env.master_port == PORT_BASE + job_id % PORT_SPAN
    assert 1024 < env.master_port < 32768  # unprivileged and below the ephemeral range


def test_batch_script_without_step_is_a_single_process():
    batch = {k: v for k, v in SLURM_TASK.items() if "STEP" not in k}
    batch["SLURM_PROCID"] = "0"
    env = DistEnv.from_environ(batch)
    assert (env.rank, env.world_size, env.source) == (0, 1, "single")


def test_torchrun_environment():
    env = DistEnv.from_environ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "host0",
                                "MASTER_PORT": "29400", "OMP_NUM_THREADS": "5",
                                "TORCHELASTIC_RUN_ID": "none"})
    assert env == DistEnv(3, 4, 1, "host0", 29400, 5, "torchrun")
    no_omp = DistEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
                                   "MASTER_PORT": "1234"})
    assert no_omp.cpus_per_task == max(1, available_cpus() // 2)


def test_torchrun_variables_take_precedence_over_slurm():
    env = DistEnv.from_environ({**SLURM_TASK, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    assert (env.rank, env.world_size, env.source) == (0, 1, "slurm")
    env = DistEnv.from_environ({**SLURM_TASK, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                                "TORCHELASTIC_RUN_ID": "x"})
    assert (env.rank, env.world_size, env.source) == (0, 1, "torchrun")


def test_direct_launch_records_where_it_ran():
    """The launcher's one-rank mode sets RANK & co. itself: recorded as slurm or single."""
    from cfmtrain.ranks.launch import plan

    for outer, source in (({}, "single"), ({"SLURM_JOB_ID": "7"}, "slurm")):
        mode, _, environ = plan(1, 1, "cfmtrain", [], outer)
        assert mode == "direct" and DistEnv.from_environ(environ).source == source
    hand = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h",
            "MASTER_PORT": "1"}
    assert DistEnv.from_environ(hand).source == "env"


def test_single_process_default():
    env = DistEnv.from_environ({})
    assert env == DistEnv(cpus_per_task=available_cpus())
    assert env.is_main and DistEnv.from_environ({"OMP_NUM_THREADS": "2"}).cpus_per_task == 2


@pytest.mark.parametrize("environ, message", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "LOCAL_RANK missing"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "needs MASTER_ADDR and MASTER_PORT"),
    ({"RANK": "one", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK='one' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE=0 is below 1"),
    ({**SLURM_TASK, "SLURM_PROCID": "8"}, "SLURM_PROCID=8 is not below SLURM_NTASKS=8"),
    ({**SLURM_TASK, "SLURM_LOCALID": "6"}, "SLURM_LOCALID=6 exceeds SLURM_PROCID=5"),
    ({**SLURM_TASK, "SLURM_STEP_NUM_TASKS": "4"}, "differs from SLURM_STEP_NUM_TASKS=4"),
    ({k: v for k, v in SLURM_TASK.items() if k != "SLURM_NTASKS"}, "SLURM_NTASKS is missing"),
    ({**SLURM_TASK, "SLURM_STEP_NODELIST": "nid[002-"}, "SLURM_STEP_NODELIST='nid\\[002-'"),
    ({k: v for k, v in SLURM_TASK.items() if "NODELIST" not in k}, "no node list"),
    ({k: v for k, v in SLURM_TASK.items() if "JOB" not in k}, "no SLURM_JOB_ID"),
    ({**SLURM_TASK, "SLURM_CPUS_PER_TASK": "0"}, "SLURM_CPUS_PER_TASK=0 is below 1"),
])
def test_inconsistent_environments_are_refused(environ, message):
    with pytest.raises(DistEnvError, match=message):
        DistEnv.from_environ(environ)


def test_default_reads_os_environ(monkeypatch):
    for key in list(os.environ):
        if key.startswith("SLURM_") or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert DistEnv.from_environ() == DistEnv(cpus_per_task=1)


def test_single_process_group_needs_no_port():
    import torch
    import torch.distributed as dist

    threads = torch.get_num_threads()
    try:
        device = init_process_group(DistEnv(cpus_per_task=1), timeout_s=30)
        assert device == torch.device("cpu") and dist.get_backend() == "gloo"
        assert torch.get_num_threads() == 1
        value = torch.tensor([2.5])
        dist.all_reduce(value)
        assert value.item() == 2.5 and dist.get_world_size() == 1
    finally:
        destroy()
        torch.set_num_threads(threads)
    assert not dist.is_initialized()
    destroy()  # a second call is harmless
