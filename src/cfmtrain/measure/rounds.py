"""`cfmtrain rounds`: the variants of one ablation group (a data set at a rank count) trained
side by side in paired rounds, so that their speed-ups hold on a shared host.

Launch it as `cfmtrain train` is launched (`cfmtrain launch --ranks R -- rounds ...`). Every
rank builds one run per variant, each into OUTPUT/<variant>, then trains them epoch by epoch:
a round is one epoch of every variant, their steps interleaved (measure.paired's
run_interleaved: the next step goes to the variant with the least share of its epoch done,
ties in an order shuffled per round with --seed), so the four epochs span the same minutes,
and each epoch's time counts its own steps only. A minute of a busy neighbour then slows
every variant alike, and cancels in each round's ratio. Every epoch of a run replays the
batches of its sampler's first epoch, so each round times the same work: a new shuffle would
move a fixed-count epoch by its straggler waits (10-20% from epoch to epoch on mini_m at 2
ranks), which is the plan's doing, not the variant's. The first epoch is the untimed warm-up
round, so config `epochs` E gives E - 1 timed rounds.

Rank 0 writes each variant's usual run outputs (summary.json with epoch_time_s the median of
its rounds, min and max beside it; steps.csv, epochs.csv, final.model, ...), OUTPUT/rounds.csv
(each round's epoch time, wall and CPU seconds of every variant, in the order they ran) and,
last, OUTPUT/paired.csv: each variant's per-round ratio against `baseline` (median, 10-90%
range, rounds) and `both`'s against every other variant. A group is measured whole: it starts
afresh when run again, as rounds measured across a stop would not be paired.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from pathlib import Path

from cfmtrain.measure.group_tables import (
    REFERENCE,
    PairedRecord,
    RoundRecord,
    paired_rows,
    round_rows,
)
from cfmtrain.measure.paired import Rounds, run_interleaved
from cfmtrain.paper import ABLATION, VARIANTS
from cfmtrain.ranks import distenv
from cfmtrain.tables import write_table
from cfmtrain.train import cli as train_cli
from cfmtrain.train.build import build_run
from cfmtrain.train.checkpoint import CHECKPOINT, PREVIOUS
from cfmtrain.train.config import ConfigError, TrainConfig, load_config, to_dict
from cfmtrain.train.epochs import EpochRecord
from cfmtrain.train.loop import StopFlag
from cfmtrain.train.model import check_model_config
from cfmtrain.train.runner import Progress, Turns, begin, end, next_epoch_turns
from cfmtrain.train.runs import epoch_times
from cfmtrain.train.summary import FIRST_TIMED_EPOCH, write_json

PLAN = 0  # every epoch of a group replays its sampler's first epoch: each round, the same work


class Stopped(Exception):
    """A variant's epoch stopped part-way (SIGTERM or max_steps)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cfmtrain rounds`."""
    parser.add_argument("--graphs", type=Path, nargs="+", required=True,
                        help="graph store: a shard folder, or several (a union, in order)")
    parser.add_argument("--split", type=Path, required=True, help="split .npz (cfmtrain split)")
    parser.add_argument("--output", type=Path, required=True,
                        help="group folder: OUTPUT/<variant>/, rounds.csv, paired.csv")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(ABLATION),
                        help="the group's variants, baseline among them (default: the four "
                             "of the ablation)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the order shuffled in each round (default 0)")
    parser.add_argument("--config", type=Path, help="YAML file of training config keys")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config key, e.g. epochs=8")
    parser.add_argument("--dataset", help="data set name recorded in summary.json "
                                          "(default: the graph folder's name)")
    parser.add_argument("--cutoff", type=float, help="the cutoff (A) the graphs must have been "
                        "built at (default: any)")


def configs(args: argparse.Namespace) -> dict[str, TrainConfig]:
    """Each variant's config; ConfigError for a group that cannot be paired."""
    variants = list(dict.fromkeys(args.variants))
    if REFERENCE not in variants or len(variants) < 2:
        raise ConfigError(f"--variants {' '.join(variants)}: a group needs {REFERENCE} and at "
                          "least one other variant")
    cfgs = {}
    for variant in variants:
        # progress bars of interleaved epochs would overwrite each other
        cfg = load_config(args.config, [*args.overrides, f"variant={variant}", "progress=false"])
        check_model_config(cfg.model)
        cfgs[variant] = cfg
    epochs = cfgs[REFERENCE].epochs
    if epochs <= FIRST_TIMED_EPOCH:
        raise ConfigError(f"epochs={epochs}: the first epoch is the untimed warm-up round; "
                          f"give at least {FIRST_TIMED_EPOCH + 1} for one timed round")
    if cfgs[REFERENCE].max_steps:
        raise ConfigError("max_steps stops a run part-way: a group trains whole epochs")
    return cfgs


def _epoch_arm(progress: Progress, stop: StopFlag, main: bool):
    """One epoch of a variant as turns of one step each; its epoch time (its own steps only,
    validation left out; rank 0), else None."""
    def arm() -> Turns[float | None]:
        if not (yield from next_epoch_turns(progress, stop)):
            raise Stopped
        return float(progress.recorder.epochs[-1][EpochRecord.col.wall_s]) if main else None
    return arm


def train_group(args: argparse.Namespace, cfgs: dict[str, TrainConfig], env, device,
                stop: StopFlag) -> Rounds:
    """Build every variant's run, train them in paired rounds, write each one's outputs."""
    main = env.rank == 0
    graphs = args.graphs[0] if len(args.graphs) == 1 else list(args.graphs)
    progress, stats = {}, None
    for variant, cfg in cfgs.items():
        out = args.output / variant
        out.mkdir(parents=True, exist_ok=True)
        if main:
            for stale in (CHECKPOINT, PREVIOUS, "summary.json"):
                (out / stale).unlink(missing_ok=True)
            write_json(out / "config.json", to_dict(cfg))
        run = build_run(cfg, graphs, args.split, out, env, device, stats=stats,
                        cutoff=args.cutoff)
        run.dataset = rounds_dataset(args)
        stats = dataclasses.asdict(run.stats)  # the same training set: computed once
        progress[variant] = begin(run, None)
        progress[variant].plan = PLAN
    arms = {v: _epoch_arm(p, stop, main) for v, p in progress.items()}
    timed = cfgs[REFERENCE].epochs - FIRST_TIMED_EPOCH
    rounds = run_interleaved(arms, timed, seed=args.seed, warmup=FIRST_TIMED_EPOCH)
    for variant, p in progress.items():
        times = rounds.times(variant)
        end(p, {**epoch_times(times), "rounds": int(len(times)), "round_seed": args.seed})
        for stale in (CHECKPOINT, PREVIOUS):  # a group never resumes: its rounds are paired
            if main:
                (p.run.out / stale).unlink(missing_ok=True)
    return rounds


def run(args: argparse.Namespace) -> int:
    """Train the group on this rank; rank 0 writes rounds.csv and paired.csv at the end."""
    train_cli.quiet_warnings()
    env = distenv.DistEnv.from_environ()
    try:
        cfgs = configs(args)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"cfmtrain rounds: {err}", file=sys.stderr)
        return 2
    if env.rank == 0:
        (args.output / PairedRecord.TABLE).unlink(missing_ok=True)  # of an earlier measurement
    device = distenv.init_process_group(env, timeout_s=cfgs[REFERENCE].timeout_s)
    stop = StopFlag()
    stop.install()
    try:
        rounds = train_group(args, cfgs, env, device, stop)
    except Stopped:
        if env.rank == 0:
            print(f"cfmtrain rounds: {args.output}: stopped part-way; running it again "
                  "measures the group afresh", file=sys.stderr, flush=True)
        return train_cli.leave(env, 143 if stop.requested else 1)
    except (ValueError, FileNotFoundError) as err:  # bad data or files: named, one line
        if env.rank == 0:
            print(f"cfmtrain rounds: {err}", file=sys.stderr, flush=True)
        return train_cli.leave(env, 2)
    except BaseException:
        train_cli.leave_on_crash(env)
        raise
    if env.rank == 0:
        write_table(args.output / RoundRecord.TABLE, round_rows(rounds), RoundRecord)
        rows = paired_rows(rounds, rounds_dataset(args), env.world_size)
        write_table(args.output / PairedRecord.TABLE, rows, PairedRecord)
        for row in rows:
            print(f"{row.variant:>9} over {row.reference:<9} {row.ratio_median:.3f}x "
                  f"({row.ratio_p10:.3f}-{row.ratio_p90:.3f}, {row.rounds} rounds)",
                  file=sys.stderr)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # complete: a late stop must not fail it
    return train_cli.leave(env, 0)


def rounds_dataset(args: argparse.Namespace) -> str:
    """The data set name the group's rows carry."""
    return args.dataset or args.graphs[0].resolve().name
