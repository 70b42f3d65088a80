"""Two gloo ranks against one process: gradients over uneven batches equal those of one process
on their union (mace-torch's own loss as the reference), and a rank that dies fails the other.

Run as a script, this file is one rank of the gradient check (RANK/WORLD_SIZE/... set).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, free_port, rank_env

pytestmark = pytest.mark.dist  # two gloo ranks in their own processes

BATCHES = [[0], [1, 2, 4]]  # training positions per rank: 1 graph vs 3 (uneven)
STRESS_WEIGHT = 10.0

# a rank runs this file as a script: tests/ (helpers) on its path, as pytest puts it
TESTS_PATH = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                           os.environ.get("PYTHONPATH")]))


def gradient_worker(store: Path, split: Path, out: Path) -> None:
    """One rank: build the run (float64), forward/backward on BATCHES[rank] with DDP's
    all-reduce and again in measurement mode (barrier, flat all-reduce); save the gradients."""
    import mace  # noqa: F401
    import torch
    from helpers import TINY
    from mace.tools.torch_geometric.dataloader import Collater

    from cfmtrain.ranks import distenv
    from cfmtrain.train.build import build_run
    from cfmtrain.train.config import load_config
    from cfmtrain.train.loop import allreduce_gradients, forward_backward

    env = distenv.DistEnv.from_environ()
    device = distenv.init_process_group(env, timeout_s=60)
    cfg = load_config(overrides=[*TINY, "model.dtype=float64",
                                 f"optim.stress_weight={STRESS_WEIGHT}"])
    run = build_run(cfg, store, split, out, env, device)
    if env.rank == 0:
        torch.save(run.model, out / "model.pt")
    mine = [run.train_set[i] for i in BATCHES[env.rank]]
    batch = Collater([None], [None])(mine)
    counts = torch.tensor([float(batch.num_graphs), float(batch.num_nodes)], dtype=torch.float64)
    torch.distributed.all_reduce(counts)
    for measure in (False, True):
        run.optimizer.zero_grad(set_to_none=True)
        forward_backward(run.ddp, batch, *counts.tolist(), cfg, step=0, measure=measure)
        if measure:
            allreduce_gradients(run.params)
        if env.rank == 0:
            grads = {n: p.grad.clone() for n, p in run.model.named_parameters()}
            torch.save(grads, out / f"grads_{'measure' if measure else 'ddp'}.pt")
    if env.rank == 0:
        torch.save(run.parts["train"], out / "train.pt")
    torch.distributed.barrier()
    os._exit(0)  # no teardown of DDP after the process group (see cfmtrain.train.cli)


def test_two_ranks_give_gradient_of_union(tmp_path):
    import mace  # noqa: F401
    import numpy as np
    import torch
    from helpers import CUTOFF, make_store
    from mace import modules
    from mace.tools.torch_geometric.dataloader import Collater

    from cfmtrain.batches.data import GraphDataset
    from cfmtrain.graphs.store import GraphStore
    from cfmtrain.train.model import z_table_of

    store, split, _ = make_store(tmp_path / "store", n=12)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, str(store), str(split), str(tmp_path)],
                              env={**rank_env(r, 2, port), "PYTHONPATH": TESTS_PATH}, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)

    model = torch.load(tmp_path / "model.pt", weights_only=False)
    train = torch.load(tmp_path / "train.pt", weights_only=False)
    torch.set_default_dtype(torch.float64)
    try:
        data = GraphDataset(GraphStore(store), np.asarray(train), z_table_of(model), CUTOFF,
                            torch.float64, use_stress=True)
        union = Collater([None], [None])([data[i] for b in BATCHES for i in b])
        model.zero_grad()
        pred = model(union.to_dict(), training=True, compute_force=True, compute_stress=True)
        loss = modules.WeightedEnergyForcesStressLoss(1.0, 100.0, STRESS_WEIGHT)(union, pred,
                                                                                 ddp=False)
        loss.backward()
    finally:
        torch.set_default_dtype(torch.float32)
    for mode in ("ddp", "measure"):
        grads = torch.load(tmp_path / f"grads_{mode}.pt", weights_only=True)
        assert set(grads) == {n for n, _ in model.named_parameters()}
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-10, atol=1e-13,
                                       msg=f"{mode}: {name}")
        assert max(g.abs().max() for g in grads.values()) > 0


def test_dead_rank_fails_the_other_within_timeout(tmp_path):
    from helpers import TINY, make_store

    store, split, _ = make_store(tmp_path / "store", n=24)
    port = free_port()
    args = [sys.executable, "-m", "cfmtrain.train", "--graphs", str(store), "--split", str(split),
            "--output", str(tmp_path / "run"), "--set", "epochs=1000", "--set", "timeout_s=20",
            "--set", "checkpoint_every=1", "--set", "batch.graphs_per_batch=2",
            *[a for t in TINY for a in ("--set", t)]]
    procs = [subprocess.Popen(args, env=rank_env(r, 2, port), cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    deadline = time.monotonic() + 240
    while not (tmp_path / "run" / "steps.csv").exists():  # training has started
        assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].stdout.read()
        time.sleep(0.5)
    procs[1].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        output = procs[0].communicate(timeout=60)[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[0].returncode != 0, output
    assert time.monotonic() - killed_at < 60
    assert "Error" in output or "error" in output


if __name__ == "__main__":
    gradient_worker(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
