"""The training step's device side, checked on the CPU with the device as a parameter: every
batch tensor moves to the run's device exactly once per step, asynchronously; cfmtrain's own
code in the step (loss, errors, timing) reads nothing back from the device but the loss, once,
after the timing wait; batches for a CUDA device are page-locked once each as they are made; the
errors are summed where the batch is. The calls are seen by a torch function mode that records
them; the only thing it stands in for is CUDA's page-locking, which needs a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from helpers import TINY
from torch.overrides import TorchFunctionMode

from cfmtrain.batches.prefetch import THREAD, BatchLoader, pins
from cfmtrain.ranks.distenv import DistEnv
from cfmtrain.train import loop
from cfmtrain.train.build import build_run
from cfmtrain.train.config import load_config
from cfmtrain.train.metrics import ErrorSums, StepTimes

TRAIN = Path(loop.__file__).parent  # cfmtrain/train: the step's own code
# tensor methods that copy a tensor's value to the host (a wait for a CUDA device)
READS = {"item", "tolist", "__bool__", "__float__", "__int__", "numpy", "cpu"}
DISPATCH = ("torch/overrides.py", "torch/_tensor.py")  # torch's frames between caller and mode


class Recorder(TorchFunctionMode):
    """Records every Tensor.to with a device (source tensor, held so that its id stays its own;
    device; non_blocking), every
    value read by code in cfmtrain/train/, and every Tensor.pin_memory (which it answers with the
    tensor itself: a CPU-only host cannot page-lock)."""

    def __init__(self) -> None:
        super().__init__()
        self.moves: list[tuple[torch.Tensor, torch.device, bool]] = []
        self.reads: list[tuple[str, str]] = []
        self.pinned: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "pin_memory":
            self.pinned.append(id(args[0]))
            return args[0]
        if name == "to":
            device = kwargs.get("device", args[1] if len(args) > 1 else None)
            if isinstance(device, str | torch.device):
                self.moves.append((args[0], torch.device(device),
                                   bool(kwargs.get("non_blocking", False))))
        elif name in READS:  # by whom: the first frame above torch's dispatch of the call
            caller = sys._getframe(1)
            while caller is not None and caller.f_code.co_filename.endswith(DISPATCH):
                caller = caller.f_back
            if caller is not None and Path(caller.f_code.co_filename).parent == TRAIN:
                self.reads.append((name, f"{Path(caller.f_code.co_filename).name}:"
                                         f"{caller.f_code.co_name}"))
        return func(*args, **kwargs)


def tensors(batch) -> dict[int, str]:
    """id -> field name of the batch's tensors."""
    return {id(v): k for k, v in batch.__dict__.items() if isinstance(v, torch.Tensor)}


@pytest.fixture
def run(data, tmp_path):
    cfg = load_config(overrides=[*TINY, "epochs=1", "measure_straggler=false",
                                 "batch.graphs_per_batch=4"])
    return build_run(cfg, data[0], data[1], tmp_path, DistEnv(), torch.device("cpu"))


def test_each_batch_moves_once_and_only_the_loss_is_read_back(run):
    steps = 0
    for batch in run.make_loader(run.train_set, run.sampler):
        fields = tensors(batch)
        with Recorder() as seen:
            loss, pred, moved = loop.train_step(run, batch, float(batch.num_graphs),
                                                float(batch.num_nodes), steps, StepTimes())
        sources = [id(m[0]) for m in seen.moves if id(m[0]) in fields]  # (the model's own too)
        assert sorted(sources) == sorted(fields), "each field moved exactly once"
        assert all(m[2] for m in seen.moves if id(m[0]) in fields), "non_blocking copies"
        assert seen.reads == [("__float__", "loop.py:train_step")], seen.reads
        assert isinstance(loss, float) and moved.positions.device == run.device
        steps += 1
    assert steps >= 3


def test_an_epoch_moves_each_batch_once(run):
    with Recorder() as seen:
        records = list(loop.epoch_steps(run, 0, 0))
    fields = len(tensors(next(iter(run.make_loader(run.train_set, run.sampler)))))
    moves = [m for m in seen.moves if m[2]]  # non_blocking: the batches' (the model's are not)
    assert len(moves) == len(records) * fields and len({id(m[0]) for m in moves}) == len(moves)
    reads = {r for r in seen.reads if r[1] != "loop.py:epoch_steps"}  # host counts, per step
    assert reads == {("__float__", "loop.py:train_step")}


def test_batches_for_a_cuda_device_are_pinned_once_each(run):
    """Made in this thread (a torch function mode is per thread; the prefetch thread makes its
    batches with the same method)."""
    batches = [list(range(i, i + 4)) for i in range(0, 12, 4)]
    assemble = run.make_loader(run.train_set, batches).assemble
    for device, pinned in (("cuda", True), (torch.device("cuda", 1), True), ("cpu", False)):
        assert pins(device) == pinned
        loader = BatchLoader(assemble, batches, 0, device=device)
        assert BatchLoader(assemble, batches, THREAD, device=device).pin_memory == pinned
        with Recorder() as seen:
            got = list(loader)
        fields = [i for b in got for i in tensors(b)]
        assert sorted(seen.pinned) == (sorted(fields) if pinned else []), device
    assert not pins(None, pin_memory=True) or torch.cuda.is_available()


def test_errors_are_summed_where_the_batch_is_and_named_at_the_end(run):
    batch = next(iter(run.make_loader(run.train_set, [[0, 1, 2]])))
    pred = run.model(batch.to_dict(), training=False, compute_force=True)
    pred = {k: v.detach() for k, v in pred.items() if v is not None}
    pred["energy"] = pred["energy"].clone()
    pred["energy"][1] = float("nan")
    sums = ErrorSums()
    with Recorder() as seen:
        sums.add(batch, pred, use_stress=False)
    assert seen.reads == []  # nothing read back per batch
    assert sums.values.device == batch.energy.device
    reduced = sums.reduced()
    assert reduced.values.device.type == "cpu"
    assert reduced.nonfinite == [int(batch.store_id[1])]
