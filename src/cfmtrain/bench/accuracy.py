"""`cfmtrain bench accuracy`: time to accuracy. cfmtrain `baseline`, cfmtrain `both` and
mace-torch's own `mace_run_train` train on the same graphs, split, model, epochs, E0s and batch
settings; each run's validation energy and force MAE after every epoch with the wall time, and
for each run the time to reach mace_run_train's final validation force MAE. A cfmtrain run
that has not reached it after the shared epochs may continue for a few more (--extra-epochs),
so that a near tie at the last epoch does not read as "never"; the comparison at equal epochs
uses the shared epochs only.

With several seeds (--seeds 0 1 2) the three runs are trained once per seed, each seed's
runs against that seed's mace_run_train, and the goals are judged on the medians over the seeds:
early in training two equally good runs differ by more than the 10% the MAE goal allows, so one
seed cannot tell a real gap from the trajectory's luck; mace_run_train's own spread over the
seeds is reported beside the ratios as that noise floor.

The three runs of a seed train in paired rounds: a round is one epoch of each, in an order
shuffled with the seed, the others waiting stopped (accuracy_runs.train_paired). The times of
all three then span the same minutes of a shared host, and each round's ratio of epoch times
(ratio_median, ratio_p10, ratio_p90 over the rounds) holds while the host's speed moves.

Writes results/bench/accuracy_<name>.csv (one row per seed, run and epoch),
accuracy_<name>_summary.csv (one row per seed and run), accuracy_<name>_rounds.csv (one row per
seed, round and run), accuracy_<name>_overall.csv (one row per run: medians and min-max over
the seeds, paired ratios over all rounds), accuracy_<name>.json (settings, E0s, summaries, goals)
and results/figures/fig_accuracy_<name>.png (+ .pdf); the runs' folders are kept in
results/bench/accuracy_<name>/seed<k>/. A seed whose three runs finished writes seed.json there
(its curves, summary and the settings they were trained with): a rerun with the same settings,
graphs and split (after a stop, or with more seeds) takes it instead of training it again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from cfmtrain.bench.accuracy_runs import MACE, Bench, CurvePoint, run_cfmtrain, train_paired
from cfmtrain.bench.accuracy_settings import AccuracySettings, Preset
from cfmtrain.bench.settings import preset_name
from cfmtrain.bench.table import report
from cfmtrain.graphs.store import GraphStore
from cfmtrain.measure.paired import Ratio, Rounds
from cfmtrain.paper import BASELINE, BOTH
from cfmtrain.plots.accuracy import draw_accuracy
from cfmtrain.ranks.distenv import available_cpus
from cfmtrain.settings import add_settings, from_args
from cfmtrain.train import presets
from cfmtrain.train.build import load_parts, training_stats
from cfmtrain.train.config import ConfigError, load_config, to_dict
from cfmtrain.train.summary import write_json

RUNS = (BASELINE.name, BOTH.name, MACE)
# Model sizes and epochs; every other training setting is the config's default. medium: on mini
# with 2 ranks on 2 cores an epoch takes ~170 s (baseline), ~33 s (both) and ~135 s
# (mace_run_train), so 2 epochs (~15 minutes in all); --epochs 20 takes ~2 hours.
PRESETS: dict[Preset, dict] = {
    "quick": {"hidden_irreps": "8x0e+8x1o", "max_ell": 1, "correlation": 2, "epochs": 5},
    "medium": {"hidden_irreps": "32x0e+32x1o", "max_ell": 2, "correlation": 3, "epochs": 2},
}
SPEEDUP_GOAL = 3.0  # the goal: `both` reaches mace_run_train's final accuracy >= 3x sooner
MAE_TOLERANCE = 0.10  # ... and every run's MAE at equal epochs is within 10% of mace's
E0_TOLERANCE_EV = 1e-3
DATA_WAIT_GOAL_PCT = 5.0  # ... and cfmtrain's steps wait for data at most this share of the time


def time_to_reach(wall: np.ndarray, mae: np.ndarray, target: float) -> tuple[float, float, int]:
    """When a curve (cumulative wall time, MAE after each epoch) first reaches `target`:
    (time interpolated linearly between the epoch before and the first epoch at or below the
    target, that epoch's time, its number of epochs); (NaN, NaN, 0) if it never does. If the
    first epoch already reaches it, both times are that epoch's."""
    wall, mae = np.asarray(wall, float), np.asarray(mae, float)
    hits = np.flatnonzero(mae <= target)
    if not len(hits):
        return math.nan, math.nan, 0
    k = int(hits[0])
    if k == 0:
        return float(wall[0]), float(wall[0]), 1
    fraction = (mae[k - 1] - target) / (mae[k - 1] - mae[k])
    return float(wall[k - 1] + fraction * (wall[k] - wall[k - 1])), float(wall[k]), k + 1


def reached(curve: pd.DataFrame, target: float) -> bool:
    """True if a run's curve reaches the force MAE `target` at some epoch."""
    return bool((curve.valid_mae_f_meV_per_A <= target).any())


def summarize(curve: pd.DataFrame, infos: dict[str, dict]) -> pd.DataFrame:
    """One row per run: epochs trained, steps and seconds per epoch, the MAEs after as many
    epochs as mace_run_train trained (`equal_epochs`) and their ratio to mace_run_train's, and
    the time to reach mace_run_train's final force MAE with mace_run_train's time over the
    run's (`speedup`: how many times sooner)."""
    ref = curve[curve.run == MACE].sort_values(CurvePoint.col.epoch)
    target, last_epoch = float(ref.valid_mae_f_meV_per_A.iloc[-1]), int(ref.epoch.iloc[-1])
    ref_last = ref.iloc[-1]
    ref_time = time_to_reach(ref.wall_s, ref.valid_mae_f_meV_per_A, target)[0]
    rows = []
    for run in RUNS:
        rows_of_run = curve[curve.run == run].sort_values(CurvePoint.col.epoch)
        walls = np.diff(np.concatenate([[0.0], rows_of_run.wall_s]))
        at = rows_of_run[rows_of_run.epoch == last_epoch].iloc[0]
        t, t_epoch, epochs = time_to_reach(rows_of_run.wall_s,
                                           rows_of_run.valid_mae_f_meV_per_A, target)
        rows.append({
            "run": run, "epochs": len(rows_of_run),
            "steps_per_epoch": infos[run]["steps_per_epoch"],
            "epoch_s": float(walls[1:].mean() if len(walls) > 1 else walls.mean()),
            "train_s": float(rows_of_run.wall_s.iloc[-1]),
            "process_wall_s": infos[run]["process_wall_s"],
            "stopped_s": infos[run].get("stopped_s", 0.0),  # waiting for the others' turns
            "data_wait_pct": infos[run].get("data_wait_pct", math.nan),
            "equal_epochs": last_epoch + 1,
            "mae_e_meV_per_atom": float(at.valid_mae_e_meV_per_atom),
            "mae_f_meV_per_A": float(at.valid_mae_f_meV_per_A),
            "mae_e_ratio": float(at.valid_mae_e_meV_per_atom / ref_last.valid_mae_e_meV_per_atom),
            "mae_f_ratio": float(at.valid_mae_f_meV_per_A / ref_last.valid_mae_f_meV_per_A),
            "target_mae_f_meV_per_A": target, "reached": not math.isnan(t),
            "time_to_target_s": t, "time_to_target_epoch_s": t_epoch,
            "epochs_to_target": epochs, "speedup": ref_time / t})
    return pd.DataFrame(rows)


def round_rows(rounds: Rounds) -> pd.DataFrame:
    """One row per paired round and run: the round, the run's place in it and its epoch's own
    seconds (the turn's wall and CPU time are the controller's, not the run's: left out)."""
    return pd.DataFrame(rounds.rows("run", "epoch_s"))[["round", "position", "run", "epoch_s"]]


def paired_columns(rounds: pd.DataFrame, runs) -> dict[str, list]:
    """For each of `runs`, the paired speed-up of its epochs over mace_run_train's in the same
    rounds (`rounds`: round_rows, of one seed or several): ratio_median, ratio_p10, ratio_p90,
    rounds."""
    times = rounds.pivot_table(index=["seed", "round"], columns="run", values="epoch_s")
    columns = [Ratio.of(times[MACE] / times[run]).columns() for run in runs]
    return {key: [c[key] for c in columns] for key in columns[0]}


def overall(summary: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per run over the seeds of `summary` (one row per seed and run): the median and
    min-max of the speed-up, time to target and epoch time; the median MAEs at equal epochs,
    their ratio to mace_run_train's median (`mae_*_ratio`) and the range of the per-seed
    ratios; each run's own spread of its MAEs over the seeds, (max - min) / median
    (`mae_*_spread`: mace_run_train's is the noise floor of any comparison); the worst data
    wait; how many seeds reached the target; and the paired speed-up of its epochs over
    mace_run_train's over every seed's `rounds` (round_rows)."""
    ref = summary[summary.run == MACE]
    rows = []
    for run in RUNS:
        of = summary[summary.run == run]
        row = {"run": run, "seeds": len(of), "reached": int(of.reached.sum()),
               "equal_epochs": int(of.equal_epochs.iloc[0]),
               "steps_per_epoch": int(of.steps_per_epoch.median()),
               "data_wait_pct": float(of.data_wait_pct.max())}
        for key in ("speedup", "time_to_target_s", "epoch_s"):
            values = of[key].to_numpy(float)  # NaN (never reached) sorts as slowest
            row[key] = float(np.median(np.nan_to_num(values, nan=-np.inf if key == "speedup"
                                                     else np.inf)))
            if not np.isfinite(row[key]):
                row[key] = math.nan
            found = values[np.isfinite(values)]
            row[f"{key}_min"], row[f"{key}_max"] = ((float(found.min()), float(found.max()))
                                                    if len(found) else (math.nan, math.nan))
        for kind, column in (("e", "mae_e_meV_per_atom"), ("f", "mae_f_meV_per_A")):
            median = float(of[column].median())
            row[column] = median
            row[f"mae_{kind}_ratio"] = median / float(ref[column].median())
            row[f"mae_{kind}_ratio_min"] = float(of[f"mae_{kind}_ratio"].min())
            row[f"mae_{kind}_ratio_max"] = float(of[f"mae_{kind}_ratio"].max())
            row[f"mae_{kind}_spread"] = float((of[column].max() - of[column].min()) / median)
        rows.append(row)
    return pd.DataFrame(rows).assign(**paired_columns(rounds, RUNS))


def goal_lines(summary: pd.DataFrame, rounds: pd.DataFrame) -> list[str]:
    """The goals, each with its numbers and met / not met, from the per-seed summary:
    medians over the seeds, with the per-seed range where there are several."""
    rows = overall(summary, rounds).set_index("run")
    several = int(rows.seeds.max()) > 1

    def spread(row, key: str, fmt: str) -> str:
        low, high = row[f"{key}_min"], row[f"{key}_max"]
        return f" ({format(low, fmt)}-{format(high, fmt)} over {int(row.seeds)} seeds)" \
            if several else ""

    lines = []
    for run, row in rows.iterrows():
        reach = (f"{row.time_to_target_s:.1f} s{spread(row, 'time_to_target_s', '.1f')}, "
                 f"{row.speedup:.2f}x mace_run_train's speed{spread(row, 'speedup', '.2f')}"
                 if row.reached == row.seeds else
                 f"reached in {int(row.reached)} of {int(row.seeds)} seeds")
        lines.append(f"{run}: time to mace_run_train's final force MAE: {reach}; after "
                     f"{int(row.equal_epochs)} epochs MAE E {row.mae_e_meV_per_atom:.2f} meV/atom "
                     f"({row.mae_e_ratio:.3f}x mace_run_train's{spread(row, 'mae_e_ratio', '.3f')}"
                     f"), F {row.mae_f_meV_per_A:.2f} meV/Å ({row.mae_f_ratio:.3f}x"
                     f"{spread(row, 'mae_f_ratio', '.3f')})")
    lines += [f"{run}: epoch time in paired rounds: {row.ratio_median:.2f}x mace_run_train's "
              f"({row.ratio_p10:.2f}-{row.ratio_p90:.2f}, 10-90% of {int(row.rounds)} rounds)"
              for run, row in rows.drop(index=MACE).iterrows()]
    both, base = rows.loc[BOTH.name], rows.loc[BASELINE.name]
    lines.append(f"both against baseline after {int(both.equal_epochs)} epochs: MAE E "
                 f"{both.mae_e_meV_per_atom / base.mae_e_meV_per_atom:.3f}x, F "
                 f"{both.mae_f_meV_per_A / base.mae_f_meV_per_A:.3f}x"
                 f"{' (medians over the seeds)' if several else ''}")
    if several:
        ref = rows.loc[MACE]
        lines.append(f"noise floor: mace_run_train's own MAEs after {int(ref.equal_epochs)} epochs "
                     f"vary over the seeds by {ref.mae_e_spread:.0%} (E) and "
                     f"{ref.mae_f_spread:.0%} (F) of their median")
    both = rows.loc[BOTH.name]
    met = bool(both.reached == both.seeds and both.speedup >= SPEEDUP_GOAL)
    lines.append(f"goal: both reaches mace_run_train's final force MAE >= {SPEEDUP_GOAL:g}x "
                 f"sooner{' (median over the seeds)' if several else ''}: "
                 f"{'met' if met else 'not met'}")
    waits = rows.data_wait_pct.dropna()
    met = bool((waits <= DATA_WAIT_GOAL_PCT).all())
    lines.append(f"goal: data wait <= {DATA_WAIT_GOAL_PCT:g}% of cfmtrain's step time: "
                 f"{'met' if met else 'not met'} (worst {waits.max():.2f}%)")
    ratios = rows[["mae_e_ratio", "mae_f_ratio"]].to_numpy()
    met = bool((ratios <= 1 + MAE_TOLERANCE).all())
    lines.append(f"goal: every run's MAEs at equal epochs within {MAE_TOLERANCE:.0%} of "
                 f"mace_run_train's{' (medians over the seeds)' if several else ''} (ratio <= "
                 f"{1 + MAE_TOLERANCE:g}; worst {ratios.max():.3f}): {'met' if met else 'not met'}")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Data, outputs, then the settings (sizes, preset, ranks, seeds)."""
    data = parser.add_mutually_exclusive_group(required=True)
    data.add_argument("--dataset", help="a data set whose graphs are in results/graphs/<name> "
                                        "(with its split.npz)")
    data.add_argument("--graphs", type=Path, nargs="+",
                      help="graph store folder(s), several make a union; needs --split")
    parser.add_argument("--split", type=Path, help="split .npz (default: <graphs>/split.npz)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="another training config key, for all runs")
    parser.add_argument("--name", help="output name (default: <data set>_<preset>)")
    parser.add_argument("--output-dir", type=Path, default=Path("results/bench"),
                        help="where the CSVs, JSON and run folders go")
    parser.add_argument("--figure", type=Path,
                        help="figure (default: results/figures/fig_accuracy_<name>.png)")
    parser.add_argument("--model-settings", type=model_settings_block, metavar="JSON|FILE",
                        help="with --preset model: training keys over the model preset, as "
                             "config model.settings takes them (a JSON mapping, or a YAML "
                             "file of one)")
    add_settings(parser, AccuracySettings)


def model_settings_block(text: str) -> dict:
    """--model-settings: a JSON mapping, or a YAML file holding one, checked as training
    settings over the model preset (an error names the key)."""
    path = Path(text)
    try:
        value = (yaml.safe_load(path.read_text()) if not text.lstrip().startswith("{")
                 and path.is_file() else json.loads(text))
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not a JSON mapping or a YAML file ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r}: not a mapping of training keys")
    try:
        load_config(base=presets.model_settings(value))
    except ConfigError as err:
        raise argparse.ArgumentTypeError(f"{text}: {err}") from None
    if (value.get("model") or {}).get("init_model"):
        raise argparse.ArgumentTypeError(f"{text}: model.init_model: the race trains every run "
                                         "from scratch (mace_run_train too)")
    return value


def _base(args: argparse.Namespace, s: AccuracySettings) -> dict | None:
    """The settings the preset `model` starts from: the model preset with --model-settings
    over it; None for the other presets (the training config's defaults)."""
    if s.preset != "model":
        return None
    return presets.model_settings(getattr(args, "model_settings", None) or {})


def _settings(args: argparse.Namespace, s: AccuracySettings, seed: int) -> list[str]:
    """Training config overrides shared by every run of one seed (over _base)."""
    model = {"hidden_irreps": s.hidden_irreps, "max_ell": s.max_ell,
             "correlation": s.correlation}
    if s.preset == "model":  # the model's own sizes and epochs, unless given
        settings = [f"model.{k}={v}" for k, v in model.items() if v is not None]
        settings += [f"epochs={s.epochs}"] if s.epochs else []
    else:
        preset = PRESETS[s.preset]
        settings = [f"model.{k}={v if v is not None else preset[k]}" for k, v in model.items()]
        settings.append(f"epochs={s.epochs or preset['epochs']}")
    settings += [f"seed={seed}", "progress=false", "measure_straggler=false",
                 "eval_interval=1",  # a point of the curve per epoch, as mace_run_train's
                 "warm_up=false",  # first-touch costs inside the timed epochs, as mace-torch's
                 "patience=0", "keep_best=false",  # every run trains the same epochs
                 "timeout_s=86400"]  # a collective may wait while another run has its turn
    if s.graphs_per_batch:
        settings.append(f"batch.graphs_per_batch={s.graphs_per_batch}")
    return settings + list(args.overrides)


SEED_RECORD = "seed.json"


def seed_key(args: argparse.Namespace, s: AccuracySettings, seed: int, store, threads: int
             ) -> dict:
    """What a seed's runs depend on: training settings, ranks, threads, extra epochs, and the
    graph shards and split (path, size, modification time)."""
    def stamp(path: Path) -> list:
        info = Path(path).stat()
        return [str(Path(path).resolve()), info.st_size, info.st_mtime_ns]

    return {"settings": _settings(args, s, seed), "base": _base(args, s), "ranks": s.ranks,
            "threads": threads,
            "extra_epochs": s.extra_epochs,
            "files": [stamp(f) for f in store.files] + [stamp(args.split_path)]}


def finished_seed(work: Path, key: dict) -> tuple[pd.DataFrame, pd.DataFrame, dict] | None:
    """A seed's (curves, summary, facts) from work/seed.json if it was trained with `key`."""
    import json

    try:
        record = json.loads((work / SEED_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if record.get("key") != json.loads(json.dumps(key)):
        return None
    return (pd.DataFrame(record["curve"]), pd.DataFrame(record["summary"]), record["facts"])


def run_seed(args: argparse.Namespace, s: AccuracySettings, seed: int, store,
             graphs: list[Path], work: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The three runs of one seed in work/: (their curves, their summary, facts for the JSON);
    a cfmtrain run short of mace_run_train's final force MAE trains up to --extra-epochs more.
    A seed finished before with the same settings (work/seed.json) is taken as it is."""
    key = seed_key(args, s, seed, store, s.threads or available_cpus())
    done = finished_seed(work, key)
    if done is not None:
        print(f"seed {seed}: its runs finished before with these settings ({work / SEED_RECORD})",
              flush=True)
        return done
    (work / SEED_RECORD).unlink(missing_ok=True)
    cfg = load_config(None, _settings(args, s, seed), base=_base(args, s))
    parts = load_parts(store, args.split_path, cfg)
    stats = training_stats(cfg, store, parts)  # every run gets exactly these E0s
    e0s = dict(zip(stats.zs, stats.e0s, strict=True))
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, e0s=e0s, e0s_fixed=[]))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(cfg=cfg, graphs=[g.resolve() for g in graphs],
                  split=args.split_path.resolve(), ranks=s.ranks,
                  threads=s.threads or available_cpus(), work=work)
    print(f"seed {seed}: training cfmtrain {' and '.join(RUNS[:2])} ({s.ranks} ranks) and "
          f"mace_run_train (E0s {e0s}) in {cfg.epochs} paired rounds of one epoch...",
          flush=True)
    results, rounds = train_paired(bench, store, parts, e0s, RUNS[:2])
    target = float(results[MACE].curve.valid_mae_f_meV_per_A.iloc[-1])
    for variant in RUNS[:2]:
        for epochs in range(cfg.epochs + 1, cfg.epochs + s.extra_epochs + 1):
            if reached(results[variant].curve, target):
                break
            print(f"seed {seed}: cfmtrain {variant}: epoch {epochs} (mace_run_train's final "
                  f"force MAE {target:.2f} meV/Å not reached yet)...", flush=True)
            before = results[variant].info
            results[variant] = run_cfmtrain(bench, variant, epochs, resume=True,
                                            stops=before["stops"])
            results[variant].info["process_wall_s"] += before["process_wall_s"]
    e0_diff = max(abs(r.info["e0s"][z] - e0s[z]) for r in results.values() for z in e0s)
    if e0_diff > E0_TOLERANCE_EV:
        print(f"warning: seed {seed}: the runs' E0s differ by up to {e0_diff:.3g} eV", flush=True)
    curve = pd.concat([results[r].curve for r in RUNS], ignore_index=True)
    summary = summarize(curve, {r: results[r].info for r in RUNS})
    facts = {"seed": seed, "work": str(work), "rank_threads": bench.rank_threads,
             "threads": bench.threads, "mace_batch_size": bench.ranks * cfg.batch.graphs_per_batch,
             "capacity": results[BOTH.name].info["capacity"],
             "graphs_per_part": {k: len(v) for k, v in parts.items()},
             "e0s_eV": {str(z): e for z, e in e0s.items()}, "e0s_max_abs_diff_eV": e0_diff,
             "config": to_dict(cfg)}
    table = round_rows(rounds).assign(seed=seed)
    summary = summary.assign(**paired_columns(table, summary.run))
    curve, summary = curve.assign(seed=seed), summary.assign(seed=seed)
    facts["rounds"] = table.to_dict("records")
    write_json(work / SEED_RECORD, {"key": key, "curve": curve.to_dict("records"),
                                    "summary": summary.to_dict("records"), "facts": facts})
    return curve, summary, facts


def run(args: argparse.Namespace) -> int:
    """Train the three runs per seed, write the curves, the summaries and the figure, state the
    goals."""
    s = from_args(AccuracySettings, args)
    s.preset = preset_name("accuracy")(s.preset)  # a renamed preset's old name: the new one
    graphs = args.graphs or [Path("results/graphs") / args.dataset]
    args.split_path = args.split or graphs[0] / "split.npz"
    name = args.name or f"{args.dataset or graphs[0].resolve().name}_{s.preset}"
    store = GraphStore(graphs if len(graphs) > 1 else graphs[0])
    root = (args.output_dir / f"accuracy_{name}").resolve()
    if len(set(s.seeds)) != len(s.seeds):
        raise SystemExit(f"cfmtrain bench accuracy: --seeds repeats a seed: {s.seeds}")
    curves, summaries, facts = [], [], []
    for seed in s.seeds:
        curve, summary, fact = run_seed(args, s, seed, store, graphs, root / f"seed{seed}")
        curves.append(curve)
        summaries.append(summary)
        facts.append(fact)
    first = ["seed"]
    curve = pd.concat(curves, ignore_index=True)
    curve = curve[first + [c for c in curve.columns if c not in first]]
    report(curve.to_dict("records"), args.output_dir / f"accuracy_{name}.csv",
           f"time to accuracy on {name}: validation MAE after each epoch")
    summary = pd.concat(summaries, ignore_index=True)
    summary = report(summary[first + [c for c in summary.columns if c not in first]
                             ].to_dict("records"),
                     args.output_dir / f"accuracy_{name}_summary.csv",
                     f"time to accuracy on {name}: per seed and run")
    rounds = pd.DataFrame([r for fact in facts for r in fact["rounds"]])
    report(rounds[first + [c for c in rounds.columns if c not in first]].to_dict("records"),
           args.output_dir / f"accuracy_{name}_rounds.csv",
           f"time to accuracy on {name}: each run's epoch in each paired round")
    totals = report(overall(summary, rounds).to_dict("records"),
                    args.output_dir / f"accuracy_{name}_overall.csv",
                    f"time to accuracy on {name}: per run over {len(s.seeds)} seed(s)")
    lines = goal_lines(summary, rounds)
    print("\n" + "\n".join(lines))
    figure = args.figure or Path("results/figures") / f"fig_accuracy_{name}.png"
    drawn = draw_accuracy(curve, summary, figure, f"time to accuracy: {name}")
    print(f"wrote {', '.join(map(str, drawn))}")
    write_json(args.output_dir / f"accuracy_{name}.json", {
        "name": name, "graphs": [str(g.resolve()) for g in graphs],
        "split": str(args.split_path.resolve()), "ranks": s.ranks, "seeds": s.seeds,
        "per_seed": facts, "goals": lines, "summary": summary.to_dict("records"),
        "overall": totals.to_dict("records"),
        "timing": "the three runs in paired rounds of one epoch each (order shuffled with "
                  "the seed), each waiting stopped during the others' turns; cumulative "
                  "seconds of training epochs with their validation, less the time stopped: "
                  "cfmtrain: epochs.csv wall_s + valid_s; mace_run_train: between its 'Epoch "
                  "N' log lines' time stamps, from its 'Initial' line's. Start-up and the "
                  "final test evaluation excluded (process_wall_s includes them)"})
    return 0
