"""One training run from start (or checkpoint) to the exported model: epochs, validation, the
LR schedule, Stage Two, the best model and early stopping (train.selection), checkpoints every N
steps, SIGTERM and max_steps stops, and rank 0's outputs (best.model, final.model, the tables).

summary.json is written last and only by a complete run: a run that trains removes an old one
first, and a run resumed from the checkpoint of its last epoch only finishes (test set, export,
summary.json). Once every output is written, SIGTERM is ignored, so that a stop in the
interpreter's teardown cannot turn the finished run into a failed one (exit 143).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import resource
import signal
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import TypeVar

import numpy as np
import psutil
import torch
import torch.distributed as dist
from tqdm import tqdm

from cfmtrain.atomic import atomic_path
from cfmtrain.kernels import fuse_model
from cfmtrain.ranks import contention
from cfmtrain.train import checkpoint as ckpt
from cfmtrain.train import resume, selection, summary
from cfmtrain.train.build import DTYPES, Run
from cfmtrain.train.config import TrainConfig
from cfmtrain.train.diskfull import writing
from cfmtrain.train.epochs import EPOCH_FIELDS, EpochRecord
from cfmtrain.train.loop import StopFlag, epoch_steps, evaluate, world_size
from cfmtrain.train.metrics import ErrorSums
from cfmtrain.train.steps import STEP_FIELDS, StepRecord
from cfmtrain.train.warmup import warm_up

T = TypeVar("T")


class Recorder:
    """Rank 0's rows of steps.csv and epochs.csv (rows past a resumed checkpoint dropped).

    steps.csv is appended after each epoch, never rewritten (but once at a resume, to drop the
    rows past the checkpoint and a line cut short by a kill); only the latest epoch's rows are
    held in memory."""

    def __init__(self, out: Path, is_main: bool, global_step: int, epoch: int):
        self.out, self.is_main = out, is_main
        self.epoch_rows: list[dict] = []
        path = out / "steps.csv"
        if is_main and path.exists():
            # a steps.csv of an older version lacks the later columns (CPU time): NaN there
            kept = [{k: r.get(k) or "nan" for k in STEP_FIELDS} for r in summary.read_rows(path)
                    if None not in r.values() and r.get("step") and int(r["step"]) < global_step]
            summary.write_rows(path, STEP_FIELDS, kept)
            self.epoch_rows = [r for r in kept if int(r["epoch"]) == epoch]
        # an epochs.csv of an older version lacks the later columns: empty there
        self.epochs = [{k: r.get(k, "") for k in EPOCH_FIELDS}
                       for r in summary.read_rows(out / "epochs.csv")
                       if int(r["epoch"]) < epoch] if is_main else []

    def add_steps(self, records: list[StepRecord]) -> None:
        """Gather every rank's step records to rank 0 and append them to steps.csv (a
        collective)."""
        gathered = _all_ranks(records)
        if self.is_main:
            rows = sorted((r for part in gathered for r in part), key=lambda r: (r.step, r.rank))
            if not rows:
                return
            if self.epoch_rows and int(self.epoch_rows[-1]["epoch"]) != rows[0].epoch:
                self.epoch_rows = []
            new = [r.row() for r in rows]
            self.epoch_rows += new
            summary.append_rows(self.out / "steps.csv", STEP_FIELDS, new)

    def all_steps(self) -> list[dict]:
        """Every row of steps.csv (read once, at the end of a run; rank 0 only)."""
        return summary.read_rows(self.out / "steps.csv") if self.is_main else []

    def epoch_records(self, epoch: int) -> np.ndarray:
        """This epoch's step rows (all ranks) as floats."""
        rows = [[float(r[k]) for k in STEP_FIELDS] for r in self.epoch_rows
                if int(r["epoch"]) == epoch]
        return np.array(rows).reshape(-1, len(STEP_FIELDS))

    def add_epoch(self, row: dict) -> None:
        if self.is_main:
            self.epochs.append(row)
            summary.write_rows(self.out / "epochs.csv", EPOCH_FIELDS, self.epochs)


def _checkpoint(run: Run, epoch: int, done: int, elapsed_s: float, pending: list,
                recorder: Recorder) -> None:
    """A mid-epoch checkpoint (collective: gathers step records and partial sums)."""
    recorder.add_steps(pending)
    pending.clear()
    partial = {"sums": run.train_errors.reduced().values, "elapsed_s": elapsed_s}
    if run.env.rank == 0:
        ckpt.save_checkpoint(ckpt.checkpoint_state(run, epoch, done, partial),
                             run.out / ckpt.CHECKPOINT)


Turns = Generator[float, None, T]  # yields its share of the work done; returns its result


def drive(turns: Turns[T]) -> T:
    """Run a generator of turns to its end; its return value."""
    while True:
        try:
            next(turns)
        except StopIteration as end:
            return end.value


def epoch_turns(run: Run, epoch: int, skip: int, partial: dict | None, stop: StopFlag,
                recorder: Recorder, plan: int | None = None, position: int = 0) -> Turns[bool]:
    """Train one epoch (from step `skip`), then validate, step the scheduler and checkpoint,
    yielding after every step the share of the epoch's steps done, so that the caller may
    interleave the epochs of several runs (measure.rounds). The epoch's time counts only the
    time spent inside it; the batches are those of the sampler's epoch `plan` (default:
    `epoch`); its loss weights and learning rate those of its stage (train.selection). Returns
    False if the run must stop (SIGTERM or max_steps) first. `position`: the line of its
    progress bar (1 under a run's bar of epochs)."""
    cfg, main = run.cfg, run.env.rank == 0
    note = selection.begin_epoch(cfg, run.selection, epoch, run.optimizer)
    run.loss_weights = selection.loss_weights(cfg, run.selection, epoch)
    if note and main:
        print(note, file=sys.stderr, flush=True)
    clock = {"own": partial["elapsed_s"] if partial else 0.0, "since": time.perf_counter()}

    def elapsed() -> float:
        return clock["own"] + time.perf_counter() - clock["since"]

    run.train_errors = ErrorSums()
    if partial and main:
        run.train_errors.values += partial["sums"]
    steps = len(run.sampler)
    bar = tqdm(total=steps, initial=skip, desc=f"epoch {epoch}", unit="step", file=sys.stderr,
               disable=not (main and cfg.progress), mininterval=1.0, leave=False,
               position=position)
    pending: list[StepRecord] = []
    last_epoch = epoch + 1 >= cfg.epochs
    done, now = skip, False
    records = epoch_steps(run, epoch, skip, plan)
    try:
        for record in records:
            done += 1
            if "first_step_at" not in run.timeline:
                run.timeline["first_step_at"] = time.time()
            pending.append(record)
            bar.update(1)
            budget = 0 < cfg.max_steps <= run.global_step and not (last_epoch and done == steps)
            now = stop.agreed() or budget  # max_steps at the run's end: just finish
            every = cfg.checkpoint_every and run.global_step % cfg.checkpoint_every == 0
            if done < steps and (now or every):
                _checkpoint(run, epoch, done, elapsed(), pending, recorder)
            if now and done < steps:
                return False
            clock["own"] = elapsed()
            yield done / steps
            clock["since"] = time.perf_counter()
    finally:  # also when the caller closes it early
        records.close()
        bar.close()
    wall = elapsed()
    recorder.add_steps(pending)
    _end_epoch(run, epoch, wall, partial is not None, recorder)
    return not (now or stop.agreed())


# the validation columns of an epoch that eval_interval skips: empty in epochs.csv
NOT_VALIDATED = {"loss": "", "mae_energy_per_atom": "", "mae_forces": "", "graphs": 0}


def validates_after(epoch: int, cfg: TrainConfig) -> bool:
    """True if the run validates after `epoch` (0-based): every eval_interval-th and the last."""
    return (epoch + 1) % cfg.eval_interval == 0 or epoch + 1 >= cfg.epochs


BEST = "best.model"  # keep_best: the model of the lowest validation loss
FINAL = "final.model"  # the model after the last epoch trained


def _end_epoch(run: Run, epoch: int, wall: float, resumed: bool, recorder: Recorder) -> None:
    """Validation, scheduler step (not in stage two), the choice of the best model and early
    stopping (train.selection; best.model written), epochs.csv row and the epoch-end
    checkpoint."""
    cfg, weights = run.cfg, run.loss_weights or run.cfg.optim
    train = run.train_errors.reduced().as_dict(weights)
    t0 = time.perf_counter()
    validated = validates_after(epoch, cfg)
    valid = evaluate(run, run.valid_set, cfg.batch.valid_graphs_per_batch).finite_dict(
        weights, f"validation after epoch {epoch}") if validated else NOT_VALIDATED
    valid_s = time.perf_counter() - t0 if validated else 0.0
    if selection.in_stage_two(cfg, run.selection, epoch):
        pass  # the stage's constant learning rate (mace-torch steps its SWALR to it)
    elif isinstance(run.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        if validated:  # patience counts validations
            run.scheduler.step(valid["loss"] if valid["graphs"] else train["loss"])
    else:
        run.scheduler.step()
    improved, note = (selection.after_validation(cfg, run.selection, epoch, valid["loss"])
                      if validated and valid["graphs"] else (False, None))
    if improved and cfg.keep_best and run.env.rank == 0:
        ckpt.export_model(run, run.out / BEST)
    if run.env.rank == 0:
        records = recorder.epoch_records(epoch)
        ratio, wait = summary.compute_balance(records, run.env.world_size)
        atoms = float(records[:, STEP_FIELDS.index(StepRecord.col.atoms)].sum())
        recorder.add_epoch(EpochRecord(
            epoch=epoch, wall_s=wall, valid_s=valid_s,
            steps=len(records) // run.env.world_size, resumed=int(resumed),
            lr=run.optimizer.param_groups[0]["lr"], train_loss=train["loss"],
            train_mae_energy_per_atom=train["mae_energy_per_atom"],
            train_mae_forces=train["mae_forces"], valid_loss=valid["loss"],
            valid_mae_energy_per_atom=valid["mae_energy_per_atom"],
            valid_mae_forces=valid["mae_forces"], atoms=int(atoms),
            atoms_per_s=atoms / wall if wall > 0 else math.nan,
            compute_max_over_mean=ratio, wait_mean_s=wait,
            ended_unix_s=time.time()).row())  # when validation ended: places the epoch in time
        said = (f", valid MAE E {1000 * valid['mae_energy_per_atom']:.2f} meV/atom, "
                f"F {1000 * valid['mae_forces']:.1f} meV/Å" if validated else ", not validated")
        best = f" (best so far{', written to ' + BEST if cfg.keep_best else ''})" \
            if improved else ""
        print(f"epoch {epoch}: {wall:.1f} s, train loss {train['loss']:.4g}{said}{best}"
              + (f"\n{note}" if note else ""), file=sys.stderr, flush=True)
        ckpt.save_checkpoint(ckpt.checkpoint_state(run, epoch + 1, 0, None),
                             run.out / ckpt.CHECKPOINT)


def chosen_model(run: Run) -> torch.nn.Module | None:
    """With keep_best, the best model (best.model, read on every rank, fused as the run's) the
    test set is evaluated with; None for the run's own EMA weights (without keep_best, or when
    no validation chose one)."""
    path = run.out / BEST
    if not run.cfg.keep_best or not path.is_file():
        return None
    model = torch.load(path, map_location="cpu", weights_only=False)  # this run's own export
    model = model.to(DTYPES[run.cfg.model.dtype]).to(run.device)
    return fuse_model(model) if run.cfg.fused else model


def _replay_rows(run: Run, after: dict) -> list[dict]:
    """replay_mae.csv's rows: the replay set's validation errors before and after training."""
    rows = []
    for when, errors in (("before", run.replay_before or {}), ("after", after)):
        if errors.get("graphs"):
            rows.append({"when": when, "graphs": errors["graphs"],
                         "mae_energy_meV_per_atom": 1000 * errors["mae_energy_per_atom"],
                         "mae_forces_meV_per_A": 1000 * errors["mae_forces"]})
    return rows


def finish(run: Run, recorder: Recorder, host: dict, extra: dict | None = None) -> dict:
    """Test-set errors per subset (of best.model's weights with keep_best), the exported
    .model(s), test_mae.csv, replay_mae.csv with replay graphs, and summary.json (with `host`:
    the load and steal samples of the training's start and end; `extra`: more keys)."""
    cfg, store = run.cfg, run.store
    names = store.subset_names
    model = chosen_model(run)
    test = evaluate(run, run.test_set, cfg.batch.valid_graphs_per_batch,
                    store.subsets.astype(np.int64), len(names), model=model)
    replay = (evaluate(run, run.replay_set, cfg.batch.valid_graphs_per_batch, model=model)
              .as_dict(cfg.optim) if run.replay_set is not None else None)
    test.finite_dict(cfg.optim, "test set")  # on every rank: the same sums, the same verdict
    if run.env.rank != 0:
        return {}
    rows = []
    for row, name in [*enumerate(names), (None, "all")]:
        errors = test.as_dict(cfg.optim, row)
        if errors["graphs"]:
            rows.append({"subset": name, "graphs": errors["graphs"],
                         "mae_energy_meV_per_atom": 1000 * errors["mae_energy_per_atom"],
                         "mae_forces_meV_per_A": 1000 * errors["mae_forces"]})
    fields = ("subset", "graphs", "mae_energy_meV_per_atom", "mae_forces_meV_per_A")
    summary.write_rows(run.out / "test_mae.csv", fields, rows)
    print("test set MAE\n" + "\n".join(f"  {r['subset']:>16}: {r['graphs']:5d} graphs, "
                                        f"E {r['mae_energy_meV_per_atom']:8.2f} meV/atom, "
                                        f"F {r['mae_forces_meV_per_A']:8.1f} meV/Å" for r in rows),
          file=sys.stderr)
    ckpt.export_model(run, run.out / FINAL)
    if cfg.keep_best and model is None:  # no validation chose one: the last epoch's
        print(f"warning: no validation loss to choose by (no validation graphs): {BEST} is "
              f"the last epoch's model, as {FINAL}", file=sys.stderr)
        ckpt.export_model(run, run.out / BEST)
    if replay is not None:
        rows = _replay_rows(run, replay)
        summary.write_rows(run.out / "replay_mae.csv", tuple(rows[0]) if rows else ("when",),
                           rows)
        print("replay set validation MAE (" + run.replay_source + ")\n" + "\n".join(
            f"  {r['when']:>6}: {r['graphs']:5d} graphs, E {r['mae_energy_meV_per_atom']:8.2f} "
            f"meV/atom, F {r['mae_forces_meV_per_A']:8.1f} meV/Å" for r in rows), file=sys.stderr)
    all_steps = recorder.all_steps()
    steps = np.array([[float(r["graphs"]), float(r["atoms"])] for r in all_steps])
    sel = run.selection
    batch = {"mean_graphs_per_batch": float(steps[:, 0].mean()) if len(steps) else math.nan,
             "mean_atoms_per_batch": float(steps[:, 1].mean()) if len(steps) else math.nan,
             "model_file": BEST if cfg.keep_best else FINAL, "final_model_file": FINAL,
             # the choice of model: the stage's lowest validation loss and its epoch, where
             # stage two began, and the epoch early stopping stopped after (null: none)
             "best_epoch": sel.best_epoch if cfg.keep_best and model is not None else None,
             "best_valid_loss": sel.best_loss if math.isfinite(sel.best_loss) else None,
             "stage_two_from": sel.stage_two_from, "stopped_early_after": sel.stopped_at,
             "replay": {"graphs": run.replay_source, "before": run.replay_before,
                        "after": replay} if replay is not None else None,
             "units": {"energy": "eV/atom", "forces": "eV/Å", "time": "s"}}
    cpu, ratio = contention.compute_wall_cpu(all_steps, summary.FIRST_TIMED_EPOCH
                                             if len(recorder.epochs) > 1 else 0)
    load = {**host, "cpu_time_s": cpu, "wall_cpu_ratio": ratio}
    result = summary.summarize(run, recorder.epochs, test.as_dict(cfg.optim), batch, load)
    result.update(extra or {})
    summary.write_json(run.out / "summary.json", result)
    return result


def _all_ranks(value: object) -> list:
    """Every rank's `value` (a collective)."""
    gathered = [None] * world_size()
    if world_size() > 1:
        dist.all_gather_object(gathered, value)
        return gathered
    return [value]


def _rank_memory() -> dict[str, float]:
    """This process's peak RSS and its PSS now, in GB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss: KiB
    return {"peak_rss_gb": peak, "pss_gb": psutil.Process().memory_full_info().pss / 1e9}


def write_timeline(run: Run) -> None:
    """Rank 0's start-up and epoch-plan timings (Run.timeline) as timeline.json, with the
    largest peak RSS of a rank and the ranks' summed PSS (shared pages counted once) now (a
    collective)."""
    usage = _all_ranks(_rank_memory())
    run.timeline["peak_rss_gb"] = max(u["peak_rss_gb"] for u in usage)
    run.timeline["pss_gb_all_ranks"] = sum(u["pss_gb"] for u in usage)
    if run.env.rank == 0:
        with writing(run.out / "timeline.json"), atomic_path(run.out / "timeline.json") as tmp:
            tmp.write_text(json.dumps(run.timeline, indent=1))


@dataclasses.dataclass
class Progress:
    """Where a run stands between epochs: its next epoch (and the step and partial sums of a
    resumed one), its step recorder and the host's sample at its start."""

    run: Run
    recorder: Recorder
    epoch: int
    skip: int = 0
    partial: dict | None = None
    host_start: dict = dataclasses.field(default_factory=dict)
    probe_start: float = math.nan
    plan: int | None = None  # the sampler's epoch every epoch replays (None: its own)
    bar: object = None  # the run's bar of epochs (train), under which each epoch's shows

    @property
    def trained(self) -> bool:
        """True when no epoch is left to train (the last trained, or stopped early)."""
        return selection.trained(self.run.cfg, self.epoch, self.run.selection)


def begin(run: Run, state: dict | None) -> Progress:
    """Restore `run` from `state` if given (recording a change of code version), drop a stale
    summary.json, warm the memory up on its largest batches and sample the host: the run is
    ready for its next epoch."""
    epoch, skip, partial = 0, 0, None
    main = run.env.rank == 0
    if state is not None:
        ckpt.restore(run, state)
    run.code_versions = resume.code_versions(state, summary.code_version(), main)
    trained = False
    if state is not None:
        epoch, skip, partial = state["epoch"], state["batches_done"], state["partial"]
        trained = selection.trained(run.cfg, epoch, run.selection)
        if main and trained:
            print(f"resuming a trained run (epoch {epoch}, global step {run.global_step}): "
                  "finishing it (test set, model export, summary.json)", file=sys.stderr)
        elif main:
            print(f"resuming at epoch {epoch}, step {skip} of the epoch "
                  f"(global step {run.global_step})", file=sys.stderr)
    if main and not trained:
        (run.out / "summary.json").unlink(missing_ok=True)  # of an earlier run: now stale
    if main and state is None:  # a fresh run: an earlier run's best model is not its
        (run.out / BEST).unlink(missing_ok=True)
    recorder = Recorder(run.out, main, run.global_step, epoch)
    if state is None and run.replay_set is not None:
        run.replay_before = evaluate(run, run.replay_set, run.cfg.batch.valid_graphs_per_batch
                                     ).as_dict(run.cfg.optim)
        if main:
            b = run.replay_before
            print(f"replay set validation before training: {b['graphs']} graphs, MAE E "
                  f"{1000 * b['mae_energy_per_atom']:.2f} meV/atom, F "
                  f"{1000 * b['mae_forces']:.1f} meV/Å", file=sys.stderr, flush=True)
    if not trained and run.cfg.warm_up:
        warm_up(run, range(epoch, run.cfg.epochs))
    probe = run.cfg.probe_host
    return Progress(run, recorder, epoch, skip, partial,
                    contention.host_sample() if probe else {},
                    contention.speed_probe()[0] if probe else math.nan)


def next_epoch_turns(progress: Progress, stop: StopFlag) -> Turns[bool]:
    """The run's next epoch as turns (epoch_turns); False if it stopped part-way (SIGTERM or
    max_steps: the checkpoint is written, and so is timeline.json)."""
    run = progress.run
    if not (yield from epoch_turns(run, progress.epoch, progress.skip, progress.partial, stop,
                                   progress.recorder, progress.plan,
                                   position=1 if progress.bar is not None else 0)):
        write_timeline(run)
        if run.env.rank == 0:
            print(f"stopped at global step {run.global_step}{_why_stopped(run)}: checkpoint "
                  f"written to {run.out / ckpt.CHECKPOINT}; continue with --resume auto (or "
                  "--resume with its path)", file=sys.stderr, flush=True)
        return False
    progress.epoch, progress.skip, progress.partial = progress.epoch + 1, 0, None
    return True


def _why_stopped(run: Run) -> str:
    """', max_steps=N reached (...)' for a stop by the step budget, else '' (SIGTERM)."""
    if 0 < run.cfg.max_steps <= run.global_step:
        return (f", max_steps={run.cfg.max_steps} reached (a stop for this call only: a resumed "
                "call trains to the end of its epochs, or to its own max_steps)")
    return ""


def budget_spent(cfg: TrainConfig, state: dict | None, main: bool) -> bool:
    """True if this call's max_steps is already reached by the checkpoint `state` of a run
    with epochs left to train: there is nothing to train (said by the `main` rank)."""
    if state is None or not 0 < cfg.max_steps <= state["global_step"]:
        return False
    if selection.trained(cfg, state["epoch"], selection.Selection.from_dict(
            state.get("selection"))):
        return False  # trained: only finishes
    if main:
        print(f"{state.get('loaded_from', 'checkpoint')}: already at global step "
              f"{state['global_step']}, max_steps={cfg.max_steps} is reached: nothing trained; "
              "resume without max_steps (to the end of the epochs) or with a larger one",
              file=sys.stderr, flush=True)
    return True


def end(progress: Progress, extra: dict | None = None) -> dict:
    """The trained run's outputs (timeline.json, then finish's; `extra` keys added to
    summary.json); rank 0's summary, {} on the others (collectives inside)."""
    run = progress.run
    write_timeline(run)
    probe = run.cfg.probe_host
    end_host = contention.host_sample() if probe else {}
    probes = _all_ranks([progress.probe_start, contention.speed_probe()[0] if probe
                         else math.nan])
    host = {f"{k}_{when}": v.get(k, math.nan) for when, v in (("start", progress.host_start),
                                                               ("end", end_host))
            for k in ("loadavg", "steal", "cpu_total")}
    return finish(run, progress.recorder, {**host, "probe_start_s": max(p[0] for p in probes),
                                           "probe_end_s": max(p[1] for p in probes)}, extra)


@contextlib.contextmanager
def epochs_bar(progress: Progress) -> Generator[tqdm | None, None, None]:
    """A progress bar of the run's epochs on rank 0 (config progress), each epoch's bar of
    steps under it; None where it does not show."""
    run = progress.run
    if not (run.env.rank == 0 and run.cfg.progress) or progress.trained:
        yield None
        return
    bar = tqdm(total=run.cfg.epochs, initial=progress.epoch, desc=run.dataset or "training",
               unit="epoch", file=sys.stderr, position=0, leave=True, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()


def show_validation(progress: Progress) -> None:
    """The epoch's validation errors (and the best epoch's) on the bar of epochs."""
    bar, rows = progress.bar, progress.recorder.epochs
    if bar is None or not rows:
        return
    bar.update(progress.epoch - bar.n)
    last, sel = rows[-1], progress.run.selection
    if last.get("valid_mae_forces") not in ("", None):
        text = (f"valid E {1000 * float(last['valid_mae_energy_per_atom']):.2f} meV/atom, "
                f"F {1000 * float(last['valid_mae_forces']):.1f} meV/Å")
        if sel.best_epoch is not None:
            text += f", best epoch {sel.best_epoch}"
        bar.set_postfix_str(text)


def train(run: Run, state: dict | None, stop: StopFlag, last: bool = True) -> bool:
    """Train `run` (restored from `state` if given) to the end or to a stop (SIGTERM, seen
    through `stop`, or max_steps); True if it completed. A run whose checkpoint ends its last
    epoch only finishes. After the outputs of the `last` run of the process, SIGTERM is
    ignored; after an earlier one `stop` keeps recording it (the caller stops between runs)."""
    if budget_spent(run.cfg, state, run.env.rank == 0):
        return False
    progress = begin(run, state)
    with epochs_bar(progress) as progress.bar:
        while not progress.trained:
            if not drive(next_epoch_turns(progress, stop)):
                return False
            show_validation(progress)
    end(progress)
    # Every output is complete (rank 0 wrote them; other ranks only wait for the end now). A
    # SIGTERM from here on, e.g. in the interpreter's teardown after Python's handlers are
    # gone, must not make the process exit 143: Snakemake would delete the finished outputs.
    if last:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return True
