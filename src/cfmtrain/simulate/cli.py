"""`cfmtrain simulate`: fit cost models on the calibration, judge them on the speed-ups paired
rounds measured (one group held out), and simulate per-epoch time at 1 to 740+ ranks (strong and
weak scaling, every batching strategy)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd

from cfmtrain import paper
from cfmtrain.atomic import atomic_path
from cfmtrain.paper import CUTOFF
from cfmtrain.settings import add_settings, from_args
from cfmtrain.simulate import allreduce, strategies, versus_paper
from cfmtrain.simulate import sizes as sizes_mod
from cfmtrain.simulate.costmodel import BAND_LEVEL, CostModel, fit_cost_model
from cfmtrain.simulate.ratios import RatioCheck, load_group, ratio_checks, ratio_verdict
from cfmtrain.simulate.records import FitRow, StrategyRow, StrongRow, ValidationRow, WeakRow
from cfmtrain.simulate.settings import SimulateSettings
from cfmtrain.simulate.sharing import fit_sharing
from cfmtrain.simulate.simulator import scaling_table
from cfmtrain.simulate.validate import cross_validate, variant_models
from cfmtrain.sweep.calibrate import CalibrationPoint
from cfmtrain.tables import Record, read_table, records, write_table
from cfmtrain.train.config import TrainConfig, load_config
from cfmtrain.train.runs import Run, load_runs

# the cost model of the strategies: fused kernels first, else the baseline's
COST_PREFERENCE = (paper.BOTH, paper.KERNEL, paper.BASELINE, paper.BALANCER)
CASES = {"cpu": "CPU (measured)", "accelerator": "accelerator (assumed)"}  # the `case` column


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain simulate`: its inputs and output, then its settings."""
    a = parser.add_argument
    a("--runs", nargs="+", required=True,
      help="summary.json of measured training cells (data wait; validation.csv)")
    a("--groups", nargs="+", required=True,
      help="group folders (paired.csv and a run per variant): the ratios the verdict rests on")
    a("--calibration", type=Path, required=True,
      help="the step-time calibration (cfmtrain sweep calibrate) the cost laws are fitted on")
    a("--graphs", nargs="+", required=True,
      help="graph store folder(s): the data set's sizes and edges per atom of each subset")
    a("--output-dir", type=Path, required=True)
    add_settings(parser, SimulateSettings)


def run(args: argparse.Namespace) -> int:
    """Write costmodels.json, fit.csv, validation.csv, ratios.csv, strong.csv, weak.csv,
    strategies.csv (the CPU case), strong_accelerator.csv, weak_accelerator.csv,
    versus_paper.csv and paper.md."""
    s = from_args(SimulateSettings, args)
    runs = load_runs(args.runs)
    laws = fit_laws(read_calibration(args.calibration), str(args.calibration))
    local = allreduce.Network(s.validation_alpha, s.validation_beta, s.network.algorithm)
    grad_local = (s.validation_parameters * allreduce.FLOAT32_BYTES
                  if s.validation_parameters else gradient_bytes_of(runs))
    validation = cross_validate(laws, runs, kernels_of, local, grad_local)
    groups = [load_group(g) for g in args.groups]
    measured = [r for g in groups for r in g.runs.values()]
    sharing = {path: fit_sharing(law, [r for r in measured if kernels_of(r.variant) == path])
               for path, law in laws.items()}
    models = {v: dataclasses.replace(m, **sharing[kernels_of(v)])
              for v, m in variant_models(laws, runs, kernels_of).items()}
    held_out = s.held_out or groups[-1].name
    checks = ratio_checks(laws, groups, kernels_of, local, grad_local, held_out, s.ratio_widen)
    judged = ratio_verdict(checks, held_out, s.max_held_out_error)
    verdicts = {v: verdict(m, judged, s.min_r2) for v, m in models.items()}
    for model in models.values():
        model.model_error = judged["worst_ratio_error"]
    out = args.output_dir
    _write_json(out / "costmodels.json", {v: dataclasses.asdict(m) for v, m in models.items()})
    write_table(out / "fit.csv", [fit_row(m, verdicts[v]) for v, m in models.items()], FitRow)
    _write_csv(out / "validation.csv", validation, ValidationRow)
    _write_csv(out / "ratios.csv", checks, RatioCheck)
    full = _distribution(args.graphs, s)
    network = allreduce.Network(s.network.alpha_s, s.network.beta_bytes_per_s,
                                s.network.algorithm)
    grad = s.parameters * allreduce.FLOAT32_BYTES
    sections, versus = [], []
    for case, label in CASES.items():
        # the accelerator case: one rank per device, none sharing it
        cased = {v: dataclasses.replace(m, saturation_atoms=s.saturation_atoms,
                                        ranks_per_node=1, shared_slowdown=1.0)
                 if case == "accelerator" else m for v, m in models.items()}
        plans = variant_plans(cased, s, full)
        suffix = "" if case == "cpu" else f"_{case}"
        strong = _judged(scaling_table(full, plans, s.ranks, network, grad), verdicts, label)
        _write_csv(out / f"strong{suffix}.csv",
                   strong.assign(strategy=strong.run.map(_strategy_names(s))), StrongRow)
        _write_csv(out / f"weak{suffix}.csv",
                   _judged(_weak(full, plans, s, network, grad), verdicts, label), WeakRow)
        if case == "cpu":
            _write_csv(out / "strategies.csv", _judged(scaling_table(
                full, strategy_plans(cased, s), s.ranks, network, grad), verdicts, label),
                StrategyRow)
        sections.append(versus_paper.section(f"{label[0].upper()}{label[1:]}", strong))
        versus += versus_paper.rows(label, strong)
    write_table(out / "versus_paper.csv", versus, versus_paper.VersusPaperRow)
    text = versus_paper.markdown(sections, assumptions(s, args.calibration, full, models,
                                                       judged, validation))
    with atomic_path(out / "paper.md") as tmp:
        tmp.write_text(text)
    print(text)
    print(checks.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


CALIBRATION = CalibrationPoint.col
# A step's cost is its training thread's CPU time (median over its repeats): load from other
# processes inflates wall time, not that; the cells are validated in wall time.
COST = CALIBRATION.step_cpu_s


def read_calibration(path: Path) -> pd.DataFrame:
    """The calibration's timed points (status ok); an unusable file is an error naming it."""
    frame = read_table(path, CalibrationPoint, empty_ok=True)
    ok = frame[frame.status == "ok"]
    if ok.empty:
        raise ValueError(f"{path}: no timed point (status ok); statuses "
                         f"{sorted(set(frame.status.astype(str)))}")
    return ok


def fit_laws(points: pd.DataFrame, source: str) -> dict[str, CostModel]:
    """One cost law per compute path (`kernels`) of the calibration, fitted on CPU time."""
    laws = {}
    for kernels, group in points.groupby(CALIBRATION.kernels):
        try:
            laws[str(kernels)] = fit_cost_model(group, str(kernels), [source], COST)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None
    return laws


def kernels_of(variant: str) -> str:
    """The compute path of a variant, as the calibration names it (cfmtrain.train decides)."""
    return "fused" if TrainConfig(variant=variant).fused else "mace"


def verdict(model: CostModel, judged: dict, min_r2: float) -> dict:
    """Whether a variant's model supports extrapolation: its calibration fit's R² at least
    `min_r2`, and the ratio checks of all groups passed (`judged`, ratios.ratio_verdict); else
    why not. `worst_ratio_error` is the checks' worst relative error, which widens the bands."""
    reasons = []
    if not model.r2 >= min_r2:
        reasons.append(f"calibration fit R² {model.r2:.3f} < {min_r2:g}")
    if not judged["supported"]:
        reasons.append(judged["unsupported_reason"])
    return {"worst_ratio_error": judged["worst_ratio_error"], "held_out": judged["held_out"],
            "held_out_error": judged["held_out_error"], "supported": not reasons,
            "unsupported_reason": "; ".join(reasons)}


def _judged(table: pd.DataFrame, verdicts: dict, case: str) -> pd.DataFrame:
    """The table with the case and each row's variant's verdict."""
    if table.empty:
        return table
    return table.assign(case=case,
                        supported=table.variant.map(lambda v: verdicts[v]["supported"]),
                        unsupported_reason=table.variant.map(
                            lambda v: verdicts[v]["unsupported_reason"]),
                        held_out=table.variant.map(lambda v: verdicts[v]["held_out"]),
                        held_out_error=table.variant.map(lambda v: verdicts[v]["held_out_error"]))


def variant_plans(models: dict[str, CostModel], s: SimulateSettings,
                  full: sizes_mod.Sizes) -> dict:
    """Each measured variant with its own batching and its own cost model."""
    fixed = strategies.fixed_count(s.graphs_per_batch, s.seed)
    balanced = strategies.packed("algorithm1", s.capacity, s.seed)
    plans = {}
    for name, model in models.items():
        v = paper.variant(name)
        if v.matched:
            per_bin = len(full.atoms) / balanced(full, 1).steps
            plans[name] = (strategies.fixed_count(max(1, round(per_bin)), s.seed), model)
        else:
            plans[name] = (balanced if v.balanced else fixed, model)
    return plans


def strategy_plans(models: dict[str, CostModel], s: SimulateSettings) -> dict:
    """Every strategy under the fused-kernel cost model (else the baseline's)."""
    cost = next((v.name for v in COST_PREFERENCE if v.name in models), next(iter(models)))
    plans = {f"fixed_count ({cost} cost)":
             (strategies.fixed_count(s.graphs_per_batch, s.seed), models[cost])}
    for name in s.strategies:
        plans[f"{name} ({cost} cost)"] = (strategies.packed(name, s.capacity, s.seed),
                                          models[cost])
    return plans


def _strategy_names(s: SimulateSettings) -> dict[str, str]:
    """Each variant's batching, as the strategy column names it."""
    def name(v: paper.Variant) -> str:
        if v.matched:
            return "fixed_count matched"
        if v.balanced:
            return f"algorithm1 {s.capacity}"
        return f"fixed_count {s.graphs_per_batch}"
    return {v.name: name(v) for v in paper.ALL_VARIANTS}


def _weak(full: sizes_mod.Sizes, plans: dict, s: SimulateSettings,
          network: allreduce.Network, grad: float) -> pd.DataFrame:
    frames = []
    for spec in s.weak:
        size_text, _, ranks_text = spec.partition(":")
        size, ranks = float(size_text), int(ranks_text)
        count = round(size * len(full.atoms)) if size <= 1 else int(size)
        if not 1 <= count <= len(full.atoms) or ranks < 1:
            raise ValueError(f"--weak {spec}: need 1 <= graphs <= {len(full.atoms)} and ranks >= 1")
        subset = full.nested(count, s.seed)
        frames.append(scaling_table(subset, plans, [ranks], network, grad).assign(
            dataset=f"{count / 1e6:.2f}M graphs" if count >= 1e5 else f"{count} graphs",
            graphs=count))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _distribution(graphs: list[str], s: SimulateSettings) -> sizes_mod.Sizes:
    store = sizes_mod.store_sizes(graphs)
    if s.distribution == "dataset":
        return store
    return sizes_mod.table3_mixture(sizes_mod.neighbours_per_atom(store), s.total_graphs,
                                    s.seed)


def gradient_bytes_of(runs: list[Run]):
    """A function run -> bytes of its gradients, counting the parameters of the run's model."""
    cache: dict[str, float] = {}

    def count(run: Run) -> float:
        key = json.dumps([run.summary.get("config", {}).get("model"), run.summary.get("stats")],
                         sort_keys=True)
        if key not in cache:
            cache[key] = _count_parameters(run)
        return cache[key]
    return count


def _count_parameters(run: Run) -> float:
    """Bytes of the gradients of the run's model, rebuilt from its saved config and statistics."""
    from cfmtrain.train.model import DataStats, build_model  # lazy: mace; light command

    if "config" not in run.summary or "stats" not in run.summary:
        raise ValueError(f"{run.folder}/summary.json: no config/stats to count parameters from")
    cfg = load_config(base=run.summary["config"])
    stats = run.summary["stats"]
    zs = list(stats["zs"])
    model = build_model(cfg.model, DataStats(zs, [0.0] * len(zs), float(stats[
        "avg_num_neighbors"]), 0.0, 1.0), cfg.model.r_max or CUTOFF, 0)
    width = 8 if cfg.model.dtype == "float64" else 4
    return float(sum(p.numel() for p in model.parameters() if p.requires_grad) * width)


def fit_row(model: CostModel, judged: dict) -> FitRow:
    """fit.csv's row of a variant's model and the verdict on it."""
    return FitRow(**{**dataclasses.asdict(model), "covariance": json.dumps(model.covariance),
                     "sources": " ".join(model.sources)},
                  kernels=kernels_of(model.variant), **judged)


def assumptions(s: SimulateSettings, calibration: Path, full: sizes_mod.Sizes,
                models: dict[str, CostModel], judged: dict,
                validation: pd.DataFrame) -> list[str]:
    """The stated assumptions of the simulation, for paper.md."""
    fits = ", ".join(
        f"{v}: R² {m.r2:.3f}, mean rel. error {100 * m.mean_rel_error:.1f}% over {m.samples} "
        f"points" for v, m in models.items())
    cpu = validation.cpu_rel_error.abs().max() if len(validation) else float("nan")
    return [
        f"Size distribution: {full.description}; edges = atoms x measured edges per atom of "
        "each subset in the configured graph store.",
        "Per-rank compute = c0 + c_atoms*atoms + c_edges*edges, the law of the variant's "
        "compute path (mace-torch's modules or the fused kernels) fitted on this machine's "
        "calibration (median training-thread CPU time per step of batches of sparse and dense "
        f"graphs, {calibration}; its median wall/CPU ratio {_wall_cpu(calibration):.2f}): "
        f"{fits}; scaled to the single-rank runs' own compute ({_sharing_text(models)}). Ranks "
        "share a node as the measured runs did: while the other ranks of its node compute, a "
        "rank computes `shared_slowdown` times slower (fitted on the multi-rank runs' steps), "
        "alone at its solo speed. A step = the data wait (the mean of the variant's runs) + "
        "the slowest node's compute + the all-reduce. Against the "
        f"measured runs' compute CPU time the law is off by at most {100 * cpu:.1f}% "
        "(validation.csv, which also reports their absolute wall times: information, not a "
        "veto, since a shared host's speed drifts within minutes).",
        f"Support: a variant is simulated only when its fit's R² >= {s.min_r2:g} and the "
        "speed-ups paired rounds measured are predicted (ratios.csv): every group's variants "
        "over the baseline, from the group's own batches, inside their 10-90% range widened "
        f"by {100 * s.ratio_widen:g}%, and the held-out group {judged['held_out']} (its data "
        "wait from the other groups alone) within "
        f"{100 * s.max_held_out_error:g}% of its paired medians: "
        f"{100 * judged['held_out_error']:.1f}% here.",
        f"Band (epoch_s_low/high): the fit's {100 * BAND_LEVEL:g}% confidence interval (delta "
        "method on the coefficients' covariance, Student t), widened by the worst relative "
        f"error of the ratio checks ({100 * judged['worst_ratio_error']:.1f}%); a ratio's band "
        "pairs the ends of its two bands.",
        "CPU case (measured): a batch's cost falls with its size down to c0. Absolute times are "
        "this machine's per-rank speed, not an A100's: compare ratios (speedup, efficiency).",
        f"Accelerator case (assumed, not measured): a batch below {s.saturation_atoms:g} "
        "atoms costs as much as that many (the flat part of the paper's Figure 11 on an A100), "
        "above it the CPU law, each rank on a device of its own (no node sharing); "
        "strong_accelerator.csv, weak_accelerator.csv.",
        f"Step time = the slowest node + one {s.network.algorithm} all-reduce of "
        f"{s.parameters:.3g} float32 parameters (alpha {s.network.alpha_s:g} s, beta "
        f"{s.network.beta_bytes_per_s:.3g} B/s; "
        "Slingshot-11-class public figures), no overlap with backward.",
        f"Batching: fixed count {s.graphs_per_batch} graphs per rank (DistributedSampler), "
        f"Algorithm 1 at capacity {s.capacity} atoms (cfmtrain.balance), bin k to rank k % R.",
        "No constant is fitted to the paper's numbers; they appear only in this table.",
    ]


def _sharing_text(models: dict[str, CostModel]) -> str:
    """Each compute path's scale, node slowdown and ranks per node, for paper.md."""
    paths = {kernels_of(v): m for v, m in models.items()}
    return "; ".join(f"{p}: scale {m.scale:.2f}, {m.ranks_per_node} ranks a node slowed "
                     f"{m.shared_slowdown:.2f}x" for p, m in paths.items())


def _wall_cpu(path: Path) -> float:
    """Median wall over CPU time of the calibration's points (1: no other load)."""
    points = read_calibration(path)
    return float((points.step_s / points.step_cpu_s).median())


def _write_csv(path: Path, frame: pd.DataFrame, record: type[Record]) -> None:
    """A simulator table (`frame`, with `record`'s columns exactly) as a CSV."""
    write_table(path, records(frame, record), record)


def _write_json(path: Path, data: dict) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
