"""`cfmtrain train`: data-parallel MACE training on a graph store, one variant of the ablation.

Launch one process per rank with `cfmtrain launch --ranks R -- train ...` (torchrun locally,
srun under Slurm); a plain `cfmtrain train` is one rank. With `--repeats N` the same
processes train the run N times, each afresh, into OUTPUT/rep1 ... OUTPUT/repN (`cfmtrain
cell` measures a cell so, without N process starts).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
import warnings
from pathlib import Path

import mace  # noqa: F401  (before e3nn: mace sets up torch.load for e3nn's constants)
import torch

from cfmtrain.paper import VARIANTS
from cfmtrain.ranks import distenv
from cfmtrain.train import selection
from cfmtrain.train.build import build_run, data_of
from cfmtrain.train.checkpoint import load_checkpoint, load_latest
from cfmtrain.train.config import ConfigError, load_config, run_settings, to_dict
from cfmtrain.train.diskfull import DiskFullError
from cfmtrain.train.loop import StopFlag
from cfmtrain.train.model import check_model_config
from cfmtrain.train.resume import changed_settings, refuse_changes
from cfmtrain.train.runner import train
from cfmtrain.train.summary import write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain train`."""
    parser.add_argument("--graphs", type=Path, nargs="+", required=True,
                        help="graph store: a shard folder, or several (a union, in order)")
    parser.add_argument("--split", type=Path, required=True, help="split .npz (cfmtrain split)")
    parser.add_argument("--output", type=Path, required=True, help="run folder to write")
    parser.add_argument("--variant", choices=VARIANTS, help="ablation variant (config: variant)")
    parser.add_argument("--config", type=Path, help="YAML file of training config keys")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config key, e.g. optim.lr=0.01")
    parser.add_argument("--resume", metavar="auto|PATH",
                        help="continue from a checkpoint; auto: the run folder's, if there is one "
                             "of an unfinished run with the same settings")
    parser.add_argument("--dataset", help="data set name recorded in summary.json "
                                          "(default: the graph folder's name)")
    parser.add_argument("--cutoff", type=float, help="the cutoff (A) the graphs must have been "
                        "built at (the workflow passes config `cutoff`; default: any)")
    parser.add_argument("--replay-graphs", type=Path, nargs="+", metavar="FOLDER",
                        help="a replay set's graph store (e.g. part of a foundation model's "
                             "training data): replay_ratio of its training graphs per training "
                             "graph are mixed into every epoch, and its validation graphs "
                             "evaluated before and after (replay_mae.csv); needs --replay-split")
    parser.add_argument("--replay-split", type=Path, help="the replay set's split .npz")
    parser.add_argument("--repeats", type=int, metavar="N",
                        help="train the run N times, each afresh (a fresh model, the same "
                             "seed), into OUTPUT/rep1 ... OUTPUT/repN; --resume applies to "
                             "each (default: once, into OUTPUT itself)")


def repeat_outputs(output: Path, repeats: int | None) -> list[Path]:
    """The run folders: OUTPUT itself without --repeats, else OUTPUT/rep1 ... OUTPUT/repN."""
    if repeats is None:
        return [output]
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    return [output / f"rep{k}" for k in range(1, repeats + 1)]


def _resume_state(args: argparse.Namespace, overrides: list[str], rank: int = 0) -> dict | None:
    """The checkpoint to resume from: --resume PATH, or with auto the run folder's newest
    loadable one (an unloadable one is moved aside by rank 0, see checkpoint.load_latest).
    A checkpoint of other data, or of other settings than the run's (but epochs and the
    per-call keys: resume.changed_settings), is refused naming it and each difference when
    given by path; with auto it is named with the same reasons and the run starts afresh, as
    it does from a checkpoint past the run's epochs, or of a finished and complete run
    (summary.json written) or an exported one (final.model written, summary.json removed by a
    forced rerun). A finished run stopped before its export is resumed: it only validates,
    exports and writes its outputs. The settings of a resume by path are the checkpoint's
    with this call's on top; with auto, this call's alone (the workflow passes them all)."""
    if args.resume is None:
        return None
    data = data_of(graphs_of(args), args.split, args.cutoff, replay_of(args))
    if args.resume != "auto":
        state = load_checkpoint(Path(args.resume))
        if state.get("data") != data:
            raise ValueError(f"{args.resume}: trained on other data (its graphs or split differ "
                             "from --graphs and --split): resuming it would mix data sets; "
                             "start afresh without --resume")
        wanted = load_config(args.config, overrides, base=run_settings(state["config"]))
        refuse_changes(args.resume, changed_settings(state["config"], to_dict(wanted)))
        return state
    found = load_latest(args.output, main=rank == 0)
    if found is None:
        return None
    path, state = found
    changed = changed_settings(state["config"], to_dict(load_config(args.config, overrides)))
    # the epochs the resumed run would train to (_settings): the checkpoint's unless given
    epochs = load_config(args.config, overrides, base=run_settings(state["config"])).epochs
    epoch = state["epoch"]
    stopped = selection.Selection.from_dict(state.get("selection")).stopped_at is not None
    finished = (epoch == epochs or stopped) and state["batches_done"] == 0
    why = None
    if state.get("data") != data:
        why = ("its training data changed (the graphs or the split differ from the "
               "checkpoint's: new labels, structures, cutoff or split)")
    elif changed:
        why = f"this run's settings differ from the checkpoint's ({'; '.join(changed)})"
    elif not stopped and (epoch > epochs or (epoch == epochs and not finished)):
        why = f"it is past the run's {epochs} epochs"
    elif finished and (args.output / "summary.json").exists():
        why = "its run is finished"
    elif finished and (args.output / "final.model").exists():
        # exported, then summary.json removed: Snakemake's --forcerun (or a changed rule) asks
        # for the run again; a stop before the export leaves no final.model and is finished
        why = "its run is finished (final.model written, summary.json removed: a rerun)"
    if why:
        if rank == 0:
            print(f"{path}: not resumed, {why}: starting afresh", file=sys.stderr)
        return None
    return state


def graphs_of(args: argparse.Namespace) -> Path | list[Path]:
    """--graphs: one store folder, or a union's folders."""
    return args.graphs[0] if len(args.graphs) == 1 else list(args.graphs)


def replay_of(args: argparse.Namespace) -> tuple[list[Path], Path] | None:
    """(--replay-graphs, --replay-split), None without replay; one without the other is an
    error."""
    graphs, split = getattr(args, "replay_graphs", None), getattr(args, "replay_split", None)
    if (graphs is None) != (split is None):
        raise ValueError("--replay-graphs and --replay-split go together: give both, or neither")
    return (list(graphs), split) if graphs else None


def quiet_warnings() -> None:
    """Silence TorchScript's deprecation noise, printed once per model otherwise."""
    for noise in ("The TorchScript type system", "`torch.jit.script` is deprecated"):
        warnings.filterwarnings("ignore", message=noise)


def leave(env: distenv.DistEnv, code: int, barrier: bool = False) -> int:
    """End the process group (after a barrier: every rank's outputs are complete) and return
    `code`; with several ranks the process exits at once instead (see _hard_exit)."""
    if env.world_size > 1:
        if barrier:
            torch.distributed.barrier()
        _hard_exit(code)
    distenv.destroy()
    return code


def leave_on_crash(env: distenv.DistEnv) -> None:
    """An unexpected error: with several ranks, print it and exit 1 at once (a rank left
    waiting in a collective would hang); with one, end the process group (the caller
    re-raises)."""
    if env.world_size > 1:
        traceback.print_exc()
        _hard_exit(1)
    distenv.destroy()


def run(args: argparse.Namespace) -> int:
    """Set up torch.distributed, build the run on every rank, train, export; with --repeats,
    once per repeat in the same process group, stopping at a repeat that does not complete
    (SIGTERM or max_steps: it leaves its checkpoint) or at a SIGTERM after a complete one."""
    quiet_warnings()
    overrides = list(args.overrides) + ([f"variant={args.variant}"] if args.variant else [])
    env = distenv.DistEnv.from_environ()
    try:
        outputs = repeat_outputs(args.output, args.repeats)
        first = _settings(argparse.Namespace(**{**vars(args), "output": outputs[0]}),
                          overrides, env.rank)
    except (ValueError, ConfigError, FileNotFoundError) as err:
        print(f"cfmtrain train: {err}", file=sys.stderr)
        return 2
    device = distenv.init_process_group(env, timeout_s=first[1].timeout_s)
    stop = StopFlag()
    stop.install()
    stats = None  # the repeats' training set is the same: its statistics are computed once
    try:
        for k, output in enumerate(outputs):
            settings = first if k == 0 else _settings(
                argparse.Namespace(**{**vars(args), "output": output}), overrides, env.rank)
            complete, stats = _train_one(args, output, *settings, env, device, stop,
                                         last=k == len(outputs) - 1, stats=stats)
            if not complete or (k < len(outputs) - 1 and stop.agreed()):
                break
    except (ValueError, FileNotFoundError) as err:  # bad data or files: named, one line
        if env.rank == 0:
            print(f"cfmtrain train: {err}", file=sys.stderr, flush=True)
        return leave(env, 2)
    except DiskFullError as err:  # only rank 0 writes: it names the file, one line
        print(f"cfmtrain train: {err}", file=sys.stderr, flush=True)
        return leave(env, 1)
    except BaseException:
        leave_on_crash(env)
        raise
    return leave(env, 0, barrier=True)


def _settings(args: argparse.Namespace, overrides: list[str], rank: int) -> tuple:
    """(the checkpoint to resume from or None, the run's config) for the run folder
    `args.output`; ConfigError, CheckpointError (a ValueError) or FileNotFoundError if
    unusable."""
    state = _resume_state(args, overrides, rank)
    cfg = load_config(args.config, overrides,
                      base=run_settings(state["config"]) if state else None)
    check_model_config(cfg.model)
    return state, cfg


def _train_one(args: argparse.Namespace, output: Path, state: dict | None, cfg, env, device,
               stop, last: bool, stats: dict | None = None) -> tuple[bool, dict]:
    """One run into `output` on this rank, its model built from the checkpoint's statistics, or
    `stats` (an earlier repeat's), or computed; (True if it completed (summary.json written),
    the statistics)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    output.mkdir(parents=True, exist_ok=True)
    if env.rank == 0:
        write_json(output / "config.json", to_dict(cfg))
    run_state = build_run(cfg, graphs_of(args), args.split, output, env, device,
                          stats=state["stats"] if state else stats, cutoff=args.cutoff,
                          replay=replay_of(args))
    run_state.dataset = args.dataset or args.graphs[0].resolve().name
    return train(run_state, state, stop, last=last), dataclasses.asdict(run_state.stats)


def _hard_exit(code: int) -> None:
    """Exit without interpreter teardown: destroying DDP's reducer after the process group can
    deadlock (gloo's worker thread waits for the GIL that the joining main thread holds), which
    was seen here at the end of a finished 2-rank run. Every output is written by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
