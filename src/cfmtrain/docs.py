"""`cfmtrain docs`: the generated parts of the documentation, from files in the repository.

The README's results table and docs/benchmarks.md's tables come from the reference CSVs in
docs/results/ (with their stamp, docs/results/manifest.csv), docs/tutorial.md's tables from its
models' evaluation.csv there too; docs/configuration.md's reference comes from
workflow/schemas/config.schema.yaml, the defaults of its sections that are a command's settings
from their dataclasses (cfmtrain.config_sections) and the training dataclasses of
cfmtrain.train.config; the input formats (docs/own-data.md's table, a
schema description's `{formats}`) from their table, cfmtrain.frames.formats; docs/cli.md from
every command's parser (cfmtrain.commands, cfmtrain.bench.cli) and docs/api.md from the
docstrings of cfmtrain.kernels' and cfmtrain.balance's public names. `--check` changes
nothing and exits 1 when a generated part differs; `--collect` first copies the measured CSVs
from results/ in.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import hashlib
import importlib
import inspect
import json
import re
import shutil
import tempfile
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import yaml

from cfmtrain import children
from cfmtrain.bench.cli import BENCHMARKS
from cfmtrain.commands import COMMANDS
from cfmtrain.config_sections import with_defaults
from cfmtrain.paper import (
    BASELINE,
    BOTH,
    CAPACITY,
    EPOCH_MINUTES,
    PAPER_GRAPHS,
    PAPER_RANKS,
    SPEEDUP,
    STRONG_EFFICIENCY,
    TABLE3,
    TABLE3_GRAPHS,
    WEAK_SCALING,
)
from cfmtrain.readers.read import formats
from cfmtrain.sources.registry import DATASETS
from cfmtrain.train import presets
from cfmtrain.train.config import (
    RANGES,
    BatchConfig,
    ModelConfig,
    OptimConfig,
    StageTwoConfig,
    TrainConfig,
)

REFERENCE = Path("docs/results")
MANIFEST = REFERENCE / "manifest.csv"
SCHEMA = Path("workflow/schemas/config.schema.yaml")
CONFIG = Path("config/config.yaml")  # the shipped config: the defaults docs/configuration.md shows
LOADER = "cfmtrain (arrays in memory)"  # cfmtrain.bench.loader.OURS (tests/workflow/test_docs.py)


@dataclasses.dataclass(frozen=True)
class Result:
    """One row of the README's results table: what it is, the reference CSV it is read from,
    where the command writes that CSV and the command, and how the value is read."""

    label: str
    csv: str
    source: str
    command: str
    value: Callable[[pd.DataFrame], str]
    columns: tuple[str, ...]  # the benchmark page's table of this CSV: its columns,
    rows: str = ""  # and the rows it shows (a pandas query; "" shows all)


def _x(value: float) -> str:
    return f"{value:.2f}x" if value == value else "n/a"


def _ablation(f: pd.DataFrame) -> str:
    both = f[f.variant == BOTH.name]
    return "; ".join(f"{r.dataset} at {r.ranks} rank(s) {_x(r.speedup)} ({r.speedup_p10:.2f}-"
                     f"{r.speedup_p90:.2f} over {r.rounds:.0f} paired rounds)"
                     for r in both.itertuples()) + " (`both` over `baseline`, epoch time)"


def _paired(r: pd.Series) -> str:
    """A row's paired speed-up: its median with the 10-90% range of its rounds."""
    return (f"{_x(r.ratio_median)} ({r.ratio_p10:.2f}-{r.ratio_p90:.2f} over {r.rounds:.0f} "
            f"paired rounds)")


def _step(f: pd.DataFrame) -> str:
    r = f[(f.op == "model") & (f.impl == "fused") & (f["pass"] == "train_step")].iloc[0]
    mace = f[(f.op == "model") & (f.impl == "mace") & (f["pass"] == "train_step")].iloc[0]
    return (f"{_paired(r)}; medians {r.median_s:.2f} s against {mace.median_s:.2f} s per "
            f"step (paper model, {r['atoms']:.0f} atoms, {r['dtype']}); {r.gflop_s:.0f} GFLOP/s, "
            f"{r.pct_of_matmul_peak:.0f}% of the run's {r['dtype']} matmul peak")


def _md(f: pd.DataFrame) -> str:
    fused = f[(f.impl == "fused") & (f.status == "ok")]
    parts = [f"{r.system} {_paired(r)}" for _, r in fused.iterrows()]
    r = fused.iloc[0]
    return f"{'; '.join(parts)} ({r['shape']} shape, about {r['target_atoms']:.0f} atoms)"


def _accuracy(f: pd.DataFrame) -> str:
    r = f.set_index("run").loc[BOTH.name]
    return (f"`both` {_x(r.speedup)} sooner to `mace_run_train`'s final force MAE; MAEs at "
            f"equal epochs {r.mae_e_ratio:.2f}x (energy), {r.mae_f_ratio:.2f}x (forces); its "
            f"epochs {_paired(r)}")


def _loader(f: pd.DataFrame) -> str:
    ours = f[f.method == LOADER]
    return "; ".join(f"{_x(r.vs_mace)} mace-torch's DataLoader at {r.graphs_per_batch} graphs "
                     f"per batch ({r.graphs_per_s:,.0f} graphs/s)" for r in ours.itertuples())


def _balance(f: pd.DataFrame) -> str:
    """Algorithm 1 with its refinements on 1M graphs, at the most ranks of the CSV."""
    million = f[f.graphs == 1_000_000]
    at = million[million.ranks == million.ranks.max()].set_index("strategy")
    r, fixed = at.loc["algorithm1+refine"], at.loc["fixed_count"]
    return (f"{r.pack_bins_cpu_s:.3f} s of CPU to pack 1M graphs for {int(at.ranks.iloc[0])} "
            f"ranks; step balance {r.step_balance:.4f} (fixed count: {fixed.step_balance:.3f}); "
            f"bins = lower bound + {int(r.excess_bins)}")


def _simulate(f: pd.DataFrame) -> str:
    """`both` over `baseline` at the paper's 740 ranks, the band from both ends (as simulated
    Figure 8)."""
    at = f[(f.ranks == PAPER_RANKS) & (f.case == "CPU (measured)")].set_index("variant")
    base, both = at.loc[BASELINE.name], at.loc[BOTH.name]
    if not (base.supported and both.supported):
        why = "; ".join(dict.fromkeys(f"{at.loc[v].unsupported_reason}"
                                      for v in (BASELINE.name, BOTH.name)
                                      if not at.loc[v].supported))
        return f"unsupported ({why}): the simulator gives no number"
    held = (f"; held-out group {both.held_out} predicted within "
            f"{100 * both.held_out_error:.1f}% of its paired speed-ups"
            if "held_out" in at.columns and isinstance(both.held_out, str) else "")
    return (f"{_x(base.epoch_s / both.epoch_s)} (band {base.epoch_s_low / both.epoch_s_high:.1f}"
            f"-{base.epoch_s_high / both.epoch_s_low:.1f}) `both` over `baseline`, Table 3 "
            f"mixture, {PAPER_GRAPHS / 1e6:g}M graphs (the paper: {SPEEDUP:g}x)" + held)


def _scale(f: pd.DataFrame) -> str:
    """At the largest count: start-up, memory and data wait of the training ranks."""
    n = int(f.graphs.max())
    at = f[f.graphs == n].set_index("stage")
    steps, opened = at.loc["steps"], at.loc["open"]
    smaller = f.graphs[f.graphs < n]
    growth = (f"; opening the store {_x(opened.ratio_median)} the time at {smaller.max():,} "
              f"graphs ({opened.ratio_p10:.2f}-{opened.ratio_p90:.2f}, {opened.rounds:.0f} "
              f"paired rounds)" if len(smaller) and opened.ratio_median > 0 else "")
    return (f"{n:,} graphs: launch to first step {at.loc['first_step', 'seconds']:.0f} s, "
            f"peak RSS {steps.peak_rss_gb:.2f} GB a training rank ({steps.pss_gb_all_ranks:.2f}"
            f" GB PSS over both), data wait {100 * steps.data_wait_share:.1f}% of step time, "
            f"epoch plan {100 * at.loc['epoch_overhead', 'epoch_share']:.2g}% of an epoch"
            + growth
            + "".join(f"; graphs built {_x(r.ratio_median)} faster in 2 processes than 1 "
                      f"({r.ratio_p10:.2f}-{r.ratio_p90:.2f}, {r.rounds:.0f} paired rounds)"
                      for r in f[f.stage == "graphs_2_processes"].itertuples()))


RESULTS = (
    Result("Ablation (Figure 6)", "ablation.csv", "results/figures/fig06_ablation.csv",
           "make run", _ablation,
           ("dataset", "ranks", "variant", "epoch_time_s", "speedup", "speedup_p10",
            "speedup_p90", "rounds")),
    Result("Training step against mace-torch", "kernels_paper-model.csv",
           "results/bench/kernels_paper-model.csv",
           "cfmtrain bench kernels --preset paper-model --ops model --impls fused mace", _step,
           ("op", "impl", "atoms", "dtype", "pass", "median_s", "speedup_vs_mace",
            "ratio_median", "ratio_p10", "ratio_p90", "max_rel_diff_vs_mace", "peak_rss_mb",
            "gflop_s", "pct_of_matmul_peak")),
    Result("Molecular dynamics against mace-torch", "md_1k.csv", "results/bench/md_1k.csv",
           "cfmtrain bench md --systems fcc water --shapes mp0-medium --atoms 1000 --steps 5 "
           "--impls fused mace symmetrix --rounds 10 "
           "--output results/bench/md_1k.csv --figure results/figures/fig_md_1k.png", _md,
           ("system", "shape", "impl", "atoms", "median_step_s", "speedup_vs_mace",
            "ratio_median", "ratio_p10", "ratio_p90", "forces_rel_diff_vs_mace", "peak_rss_mb")),
    Result("Time to accuracy on mini", "accuracy_mini.csv",
           "results/bench/accuracy_mini_medium_overall.csv",
           "snakemake --profile profiles/local accuracy", _accuracy,
           ("run", "seeds", "epoch_s", "time_to_target_s", "speedup", "mae_e_ratio",
            "mae_f_ratio", "data_wait_pct")),
    Result("Time to accuracy on real DFT data, the model target's settings",
           "accuracy_real_dft_model.csv", "results/bench/accuracy_real_dft_model_overall.csv",
           "snakemake --profile profiles/local accuracy --configfile config/real_dft.yaml "
           "config/real_dft_model.yaml", _accuracy,
           ("run", "seeds", "equal_epochs", "epoch_s", "time_to_target_s", "speedup",
            "mae_e_ratio", "mae_f_ratio", "data_wait_pct")),
    Result("Loader", "loader_quick.csv", "results/bench/loader_quick.csv",
           "cfmtrain bench loader --preset quick", _loader,
           ("method", "graphs_per_batch", "graphs_per_s", "vs_mace", "identical_to_mace")),
    Result("Balancer, 1M graphs", "balance_full.csv", "results/bench/balance_full.csv",
           "cfmtrain bench balance --preset full", _balance,
           ("graphs", "ranks", "strategy", "cpu_s", "excess_bins", "step_balance",
            "repeated"), "graphs == 1_000_000"),
    Result("Data path at scale", "scale.csv", "results/bench/scale.csv",
           "cfmtrain bench scale --graphs 10000 100000 1000000 --steps 50", _scale,
           ("graphs", "stage", "seconds", "peak_rss_gb", "pss_gb_all_ranks", "disk_gb",
            "data_wait_share", "epoch_share", "ratio_median", "rounds")),
    Result(f"Simulator at {PAPER_RANKS} ranks", "simulate_strong.csv",
           "results/simulate/mini_s/table3/strong.csv",
           "snakemake --profile profiles/local simulate", _simulate,
           ("ranks", "variant", "case", "epoch_s", "epoch_s_low", "epoch_s_high", "balance",
            "supported"),
           f"ranks in (16, 64, {PAPER_RANKS}) and case == 'CPU (measured)' and supported"),
)
# docs/kernels.md's table of the MD engines (the MD result's CSV, its per-engine columns)
ENGINES = ("system", "impl", "atoms", "us_per_atom", "ratio_median", "ratio_p10", "ratio_p90",
           "ratio_vs_symmetrix_median", "ratio_vs_symmetrix_p10", "ratio_vs_symmetrix_p90",
           "convert_s", "setup_s", "first_call_s", "peak_rss_mb", "energy_rel_diff_vs_mace")
VERSUS_PAPER = Result("The paper beside the simulator", "simulate_versus_paper.csv",
                      "results/simulate/mini_s/table3/versus_paper.csv",
                      "snakemake --profile profiles/local simulate", lambda f: "",
                      ("case", "quantity", "paper", "simulated", "low", "high"))
HOST = Result("Host check", "host.csv", "results/bench/host.csv",
              "cfmtrain bench host --probes 20", lambda f: host_check(f),
              ("probe", "wall_s", "cpu_s", "matmul_s", "gather_s"))
# Figure 12's table, drawn in docs/figures/ (the `balance` target writes it per data set)
FIGURE12 = Result("Graphs per rank (Figure 12)", "fig12_graphs_per_rank_mini.csv",
                  "results/figures/fig12_graphs_per_rank_mini.csv",
                  "snakemake --profile profiles/local balance", lambda f: "",
                  ("panel", "step", "rank", "graph", "subset", "size"))
# docs/tutorial.md's tables: the evaluation.csv of its models, each in the block of its csv's name
EVALUATION = ("config_type", "graphs", "atoms", "mae_energy_meV_per_atom",
              "rmse_energy_meV_per_atom", "mae_forces_meV_per_A", "rmse_forces_meV_per_A",
              "mae_stress_meV_per_A3", "rmse_stress_meV_per_A3")
TUTORIAL = (
    Result("The tutorial's model", "tutorial_cuni.csv", "results/model/cuni/evaluation.csv",
           "snakemake --profile profiles/local model --configfile examples/own_data.yaml "
           "examples/tutorial.yaml", lambda f: "", EVALUATION),
    Result("Fine-tuned from the foundation", "tutorial_cuni_ft.csv",
           "results/model/cuni_ft/evaluation.csv",
           "snakemake --profile profiles/local model --configfile examples/fine_tune.yaml",
           lambda f: "", EVALUATION),
)


COLLECTED = (*RESULTS, VERSUS_PAPER, HOST, FIGURE12, *TUTORIAL)  # what --collect copies


def host_check(f: pd.DataFrame) -> str:
    """`cfmtrain bench host`'s verdict on its CSV: steady when the probes spread <= 10%."""
    spread = (f.wall_s.max() - f.wall_s.min()) / f.wall_s.median()
    return f"{'steady' if spread <= 0.10 else 'UNSTEADY'} (probe spread {100 * spread:.0f}%)"


# ------------------------------------------------------------------ tables


def _cell(value: Any) -> str:
    """A table cell: floats to 4 digits, pipes escaped, < and > as entities outside code."""
    if isinstance(value, float):
        value = "" if value != value else f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    parts = str(value).replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if k % 2 else p.replace("<", "&lt;").replace(">", "&gt;")
                    for k, p in enumerate(parts))


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows])


def _manifest(root: Path) -> pd.DataFrame:
    path = root / MANIFEST
    return pd.read_csv(path, dtype=str) if path.is_file() else pd.DataFrame(
        columns=["file", "commit", "date", "host"])


def _measured(root: Path) -> pd.DataFrame:
    """The manifest's rows of the reference set (the tutorial's tables carry their own)."""
    m = _manifest(root)
    return m[~m.file.isin([r.csv for r in (*TUTORIAL, FIGURE12)])]


def stamp(root: Path, link: str) -> str:
    """The reference set's provenance in one line: its dates, and where each CSV's commit and
    host check are listed (`link`)."""
    m = _measured(root)
    if m.empty:
        return "No reference measurements yet."
    dates = sorted(set(m.date))
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return (f"Measured {when} on a shared 2-core x86-64 host; each CSV's commit and host check: "
            f"[provenance]({link}).")


def provenance_table(root: Path) -> str:
    """docs/benchmarks.md's table of the reference CSVs: the commit each was measured at ("+
    changes": with uncommitted code changes), its date and the host check run before it."""
    m = _measured(root)
    if m.empty:
        return "No reference measurements yet."
    return markdown_table(["CSV", "commit", "date", "host check"],
                          [[f"[{r.file}](results/{r.file})", r.commit, r.date, r.host]
                           for r in m.itertuples()])


def results_table(root: Path) -> str:
    rows = []
    for r in RESULTS:
        path = root / REFERENCE / r.csv
        value = (r.value(pd.read_csv(path)) if path.is_file()
                 else "not in the reference set: run the command")
        csv = (f"[{r.csv}](docs/results/{r.csv})" if path.is_file()
               else f"`{r.source}`, not collected")
        rows.append([r.label, value, f"`{r.command}`", csv])
    return (stamp(root, "docs/benchmarks.md#provenance") + "\n\n"
            + markdown_table(["result", "value", "command", "CSV"], rows))


def versus_paper_table(root: Path) -> str:
    """The paper's reported quantities beside the simulator's (docs/experiments.md)."""
    path = root / REFERENCE / VERSUS_PAPER.csv
    if not path.is_file():
        return f"Not in the reference set (`{VERSUS_PAPER.source}` after the command)."
    f = pd.read_csv(path)
    rows = [[r.case, r.quantity, f"{r.paper:.3g}",
             f"{r.simulated:.3g}" if r.supported else "unsupported",
             f"{r.low:.3g} – {r.high:.3g}" if r.supported else ""] for r in f.itertuples()]
    return (f"From [{VERSUS_PAPER.csv}](results/{VERSUS_PAPER.csv}) "
            f"(`{VERSUS_PAPER.source}`).\n\n"
            + markdown_table(["case", "quantity", "paper", "simulated", "band"], rows))


def reference_table(root: Path, r: Result) -> str:
    """A reference CSV as a table of its columns, with where it comes from and when."""
    path = root / REFERENCE / r.csv
    if not path.is_file():
        return f"Not in the reference set (`{r.source}` after `{r.command}`)."
    f, m = pd.read_csv(path), _manifest(root).set_index("file")
    when = (f", measured at commit {m.loc[r.csv, 'commit']} on {m.loc[r.csv, 'date']}"
            if r.csv in m.index else "")
    shown = [c for c in r.columns if c in f.columns]
    return (f"From [{r.csv}](results/{r.csv}) (`{r.source}`{when}).\n\n"
            + markdown_table(shown, f[shown].values.tolist()))


def bench_tables(root: Path) -> str:
    parts = [f"### Provenance\n\n{provenance_table(root)}"]
    for r in (*RESULTS, HOST):
        path = root / REFERENCE / r.csv
        parts.append(f"### {r.label}\n\n```bash\n{r.command}\n```")
        if not path.is_file():
            parts.append(f"Not in the reference set (`{r.source}` after the command).")
            continue
        f = pd.read_csv(path)
        shown = [c for c in r.columns if c in f.columns]
        rows = f.query(r.rows) if r.rows else f
        parts.append(f"From [{r.csv}](results/{r.csv}) (`{r.source}`): {r.value(f)}.\n\n"
                     + markdown_table(shown, rows[shown].values.tolist()))
    return "\n\n".join(parts)


# ------------------------------------------------------------------ config reference

FORMATS_FIELD = "{formats}"  # in a schema description: the input formats, from their table


def formats_line() -> str:
    """The input formats as one line, `format (suffixes)` each (cfmtrain.frames.formats)."""
    return ", ".join(f"{title} ({', '.join(sfx)})" for title, sfx in formats())


def formats_table() -> str:
    """docs/own-data.md's table of the input formats, by suffix."""
    return markdown_table(["suffix", "format"],
                          [[", ".join(f"`{s}`" for s in sfx), title] for title, sfx in formats()])


def preset_table() -> str:
    """docs/tutorial.md's table of the model preset and what fine-tuning changes in it."""
    model, fine = presets.flat(presets.MODEL), presets.flat(presets.FINE_TUNE)
    default = presets.flat(dataclasses.asdict(TrainConfig()))
    rows = [[f"`{key}`", f"`{model[key]}`" if key in model else f"`{default[key]}` (default)",
             f"`{fine[key]}`" if key in fine else ""]
            for key in [*model, *(k for k in fine if k not in model)]]
    return markdown_table(["key of `train.settings`", "model preset", "fine-tuning"], rows)


def _schema_type(node: dict) -> str:
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    if "oneOf" in node:
        return " or ".join(_schema_type(alt) for alt in node["oneOf"])
    kind = node.get("type", "object" if "properties" in node else "")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    if kind == "array" and "items" in node:
        return f"list of {_schema_type(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"mapping to {_schema_type(node['additionalProperties'])}"
    if kind == "object" and node.get("required") and "additionalProperties" in node:
        return "mapping with " + ", ".join(f"`{k}`" for k in node["required"])
    return "mapping" if kind == "object" else kind


def _flat(value: Any) -> str:
    """A default as one line of YAML ("" for none)."""
    if value is None:
        return ""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    return text.strip().removesuffix("...").strip()


def schema_rows(node: dict, prefix: str = "", shipped: Any = None) -> Iterator[list[str]]:
    """(key, type, default, description) of every key under `node`, depth first; the default is
    the shipped config's value (`shipped`, config/config.yaml) where it sets the key, else the
    schema's."""
    for name, child in node.get("properties", {}).items():
        key = f"{prefix}{name}"
        nested = _nested(child)
        value = (shipped[name] if isinstance(shipped, dict) and name in shipped
                 else child.get("default"))
        default = "" if nested and "properties" in nested else _flat(value)
        yield [f"`{key}`", _schema_type(child), f"`{default}`" if default else "",
               " ".join(str(child.get("description", "")).replace(FORMATS_FIELD, formats_line())
                        .split())]
        if nested is not None:
            inner = f"{key}.<name>." if child.get("additionalProperties") is nested else (
                f"{key}[]." if child.get("items") is nested else f"{key}.")
            yield from schema_rows(nested, inner, shipped.get(name) if isinstance(
                shipped, dict) and child is nested else None)


def _nested(node: dict) -> dict | None:
    """The object schema whose keys are listed under this key: its own, its values' or its
    items'."""
    for candidate in (node, node.get("additionalProperties"), node.get("items")):
        if isinstance(candidate, dict) and "properties" in candidate:
            return candidate
    return None


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"mapping {_type_name(args[0])} to {_type_name(args[1])}"
    return getattr(hint, "__name__", str(hint))


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class's source: the comment lines above it and the one
    after it on its line."""
    comments, pending = {}, []
    for line in inspect.getsource(cls).splitlines():
        text = line.strip()
        if text.startswith("#"):
            pending.append(text.lstrip("# "))
            continue
        match = re.match(r"(\w+): [^=]+=(.*)$", text)
        if match:
            trailing = re.search(r"\s#\s(.*)$", match.group(2))
            comments[match.group(1)] = " ".join(pending + ([trailing.group(1)] if trailing
                                                           else []))
        pending = []
    return comments


SECTIONS = {hint: name for name, hint in typing.get_type_hints(TrainConfig).items()
            if dataclasses.is_dataclass(hint)}  # ModelConfig -> "model", ...
PER_CELL = {"variant": "set per cell by the matrix, not a `train.settings` key",
            "train_fraction": "set per cell by the size suffix, not a `train.settings` key"}


def settings_rows(cls: type = TrainConfig, prefix: str = "") -> Iterator[list[str]]:
    """(key, type, default, range, description) of every training config key."""
    hints, comments = typing.get_type_hints(cls), field_comments(cls)
    for field in dataclasses.fields(cls):
        hint, key = hints[field.name], f"{prefix}{field.name}"
        if dataclasses.is_dataclass(hint):
            yield from settings_rows(hint, f"{key}.")
            continue
        default = (field.default if field.default is not dataclasses.MISSING
                   else field.default_factory())  # type: ignore[misc]
        note = " ".join(filter(None, [comments.get(field.name, ""), PER_CELL.get(key, "")]))
        yield [f"`{key}`", _type_name(hint), f"`{json.dumps(default)}`",
               RANGES[key][1] if key in RANGES else "", note]


def config_reference(root: Path) -> str:
    schema = with_defaults(yaml.safe_load((root / SCHEMA).read_text()))
    sections = ["## Workflow config\n\nThe keys of `config/*.yaml` (a `--configfile` merges over "
                "`config/config.yaml`). Unknown keys are errors. A default is the value of the "
                "shipped `config/config.yaml`, or the schema's where that file leaves the key "
                "out.\n\n"
                + markdown_table(["key", "type", "default", "description"], list(schema_rows(
                    schema, shipped=yaml.safe_load((root / CONFIG).read_text()))))]
    for cls in (TrainConfig, ModelConfig, BatchConfig, OptimConfig, StageTwoConfig):
        section = SECTIONS.get(cls)
        rows = [row for row in settings_rows() if row[0].startswith(f"`{section}.")
                or (section is None and "." not in row[0])]
        sections.append(f"## `train.settings`: {cls.__name__}\n\n{inspect.getdoc(cls)}\n\n"
                        + markdown_table(["key", "type", "default", "range", "description"],
                                         rows))
    return "\n\n".join(sections)


# ------------------------------------------------------------------ command line


class _Wide(argparse.HelpFormatter):
    """Help text at a fixed width, whatever the terminal."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=100)


def _parser(prog: str, module: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=_Wide)
    importlib.import_module(module).add_arguments(parser)
    return parser


def _arguments(parser: argparse.ArgumentParser) -> str:
    """A parser's arguments as a table: each one's flags (or name) with its value, and its help
    (defaults filled in)."""
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            value = "" if action.nargs == 0 else " " + formatter._format_args(
                action, formatter._get_default_metavar_for_optional(action))
            name = ", ".join(action.option_strings) + value
        else:
            name = formatter._format_args(action, action.dest)
        text = formatter._expand_help(action) if action.help else ""
        rows.append([f"`{name}`" + (" (required)" if action.required and action.option_strings
                                    else ""), text])
    return markdown_table(["argument", "help"], rows) if rows else "No arguments."


def cli_reference() -> str:
    """docs/cli.md's reference: every command and benchmark, its one-line help and its
    arguments, from the parsers the command line itself builds."""
    parts = []
    for name, (module, help_text, _) in COMMANDS.items():
        parts.append(f"## `cfmtrain {name}`\n\n{help_text[0].upper()}{help_text[1:]}.\n\n"
                     + _arguments(_parser(f"cfmtrain {name}", module, help_text)))
        if name != "bench":
            continue
        for bench, bench_module in BENCHMARKS.items():
            doc = (inspect.getdoc(importlib.import_module(bench_module)) or "").split("\n\n")[0]
            parts.append(f"### `cfmtrain bench {bench}`\n\n{' '.join(doc.split())}\n\n"
                         + _arguments(_parser(f"cfmtrain bench {bench}", bench_module, doc)))
    return "\n\n".join(parts)


# ------------------------------------------------------------------ API

API = ("cfmtrain.kernels", "cfmtrain.balance")


class _Annotation(str):
    """An annotation kept as text (postponed evaluation), written without quotes."""

    def __repr__(self) -> str:
        return str(self)


def _signature(obj: Any) -> str:
    """`(name: type = default, ...) -> type`, the annotations as written in the source."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    bare = lambda a: _Annotation(a) if isinstance(a, str) else a  # noqa: E731
    return str(sig.replace(parameters=[p.replace(annotation=bare(p.annotation))
                                       for p in sig.parameters.values()],
                           return_annotation=bare(sig.return_annotation)))


def _api_entry(name: str, obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        methods = [f"- `{m}{_signature(f)}`: {' '.join((inspect.getdoc(f) or '').split())}"
                   for m, f in vars(obj).items()
                   if not m.startswith("_") and inspect.isfunction(f)]
        return "\n\n".join(filter(None, [f"### `{name}`", f"class `{name}{_signature(obj)}`",
                                          doc, "\n".join(methods)]))
    if callable(obj):
        return f"### `{name}`\n\n`{name}{_signature(obj)}`\n\n{doc}"
    keys = ", ".join(f"`{k}`" for k in obj) if isinstance(obj, dict | tuple | list) else ""
    return f"### `{name}`\n\n{type(obj).__name__}" + (f": {keys}" if keys else "")


def api_reference() -> str:
    """docs/api.md's reference: the public names (`__all__`) of the modules of API, each with its
    signature and docstring."""
    parts = []
    for name in API:
        module = importlib.import_module(name)
        parts.append(f"## `{name}`\n\n{inspect.getdoc(module)}")
        parts += [_api_entry(attr, getattr(module, attr))
                  for attr in sorted(module.__all__, key=str.lower)]
    return "\n\n".join(parts)


# ------------------------------------------------------------------ the paper, item by item


def _from(root: Path, csv: str, value: Callable[[pd.DataFrame], str]) -> str:
    path = root / REFERENCE / csv
    return f"{value(pd.read_csv(path))} ([{csv}](results/{csv}))" if path.is_file() else (
        "not in the reference set: run the command")


def _none(root: Path) -> str:
    return "no reference CSV: run the command"


def _versus(quantity: str) -> Callable[[pd.DataFrame], str]:
    def value(f: pd.DataFrame) -> str:
        r = f[(f.case == "CPU (measured)") & (f.quantity == quantity)].iloc[0]
        return f"{r.simulated:.3g} (band {r.low:.3g}-{r.high:.3g}), simulated"
    return value


def _fig12(f: pd.DataFrame) -> str:
    first = f[f.step == 0].groupby(["panel", "rank"])["size"].sum().groupby(level="panel")
    return "; ".join(f"{panel}: {lo:.0f}-{hi:.0f} atoms a rank in step 0"
                     for panel, (lo, hi) in first.agg(["min", "max"]).iterrows())


_MEASURED = "measured on a 2-core CPU host (gloo), the embedded `mini` data"
_SIMULATED = ("simulated: the cost model fitted on the `mini` cells measured here, extrapolated "
              "to the paper's Table 3 mixture (not measured at that scale)")
# (item, command, our value from the reference CSVs, the paper's value, what differs)
PAPER_ITEMS: tuple[tuple[str, str, Callable[[Path], str], str, str], ...] = (
    ("Table 3: the data sets", "snakemake --profile profiles/local stats", _none,
     f"{len(TABLE3)} data sets, {TABLE3_GRAPHS:,} graphs of "
     f"{min(r.atoms[0] for r in TABLE3)}-{max(r.atoms[1] for r in TABLE3)} atoms",
     "`mini`: about 1,000 graphs in the same eight subsets, generated with ASE's EMT and TIP3P "
     "calculators, not DFT"),
    ("Figure 5: graph sizes", "snakemake --profile profiles/local stats", _none,
     "the sizes of Table 3", "`mini`'s sizes"),
    ("Figure 6: the ablation", "make run",
     lambda root: _from(root, "ablation.csv", _ablation),
     f"`both` {SPEEDUP:g}x over `baseline` at {PAPER_RANKS} GPUs "
     f"({EPOCH_MINUTES[(BASELINE.name, PAPER_RANKS)]:g} against "
     f"{EPOCH_MINUTES[(BOTH.name, PAPER_RANKS)]:g} min per epoch)",
     _MEASURED + ", 1-2 ranks against the paper's GPUs"),
    ("Figure 7: strong scaling", "snakemake --profile profiles/local figures",
     lambda root: _from(root, VERSUS_PAPER.csv, _versus(
         "strong-scaling efficiency 16 -> 740, balancer+kernels")),
     f"`both`'s efficiency 16 to {PAPER_RANKS} GPUs {100 * STRONG_EFFICIENCY:.1f}%",
     "measured figure: 1-2 ranks on `mini`; the value: " + _SIMULATED),
    ("Figure 8: speed-up at scale", "snakemake --profile profiles/local simulate",
     lambda root: _from(root, "simulate_strong.csv", _simulate),
     f"{SPEEDUP:g}x at {PAPER_RANKS} GPUs, {PAPER_GRAPHS / 1e6:g}M graphs", _SIMULATED),
    ("Figure 9: loss curves", "snakemake --profile profiles/local figures",
     lambda root: _from(root, "accuracy_mini.csv", lambda f: (
         "`both`'s MAEs at equal epochs {:.2f}x (energy), {:.2f}x (forces) mace_run_train's"
         .format(*f.set_index("run").loc[BOTH.name, ["mae_e_ratio", "mae_f_ratio"]]))),
     "the variants' losses alike", _MEASURED + "; a few epochs, not converged"),
    ("Figure 10: weak scaling", "snakemake --profile profiles/local figures", _none,
     ", ".join(f"{g / 1e6:g}M graphs on {r} GPUs" for g, r in WEAK_SCALING),
     "measured figure: `mini`'s nested subsets on 1-2 ranks; the simulated one: " + _SIMULATED),
    ("Figure 11: batch size and bin capacity", "snakemake --profile profiles/local sweeps",
     _none, f"bins of {CAPACITY} atoms", _MEASURED),
    ("Figure 12: graphs per rank", "snakemake --profile profiles/local balance",
     lambda root: _from(root, FIGURE12.csv, _fig12),
     f"Algorithm 1 fills every rank's bin to about {CAPACITY} atoms; a fixed graph count does "
     "not", "the same algorithm on `mini`'s graph sizes (8 ranks, first 2 steps)"),
    ("Algorithm 1 at scale", "cfmtrain bench balance --preset full",
     lambda root: _from(root, "balance_full.csv", _balance),
     f"{PAPER_RANKS} ranks, {PAPER_GRAPHS / 1e6:g}M graphs",
     "1M graphs of Table 3's size distribution, packed on one CPU core"),
    ("Figure 13: stragglers", "snakemake --profile profiles/local figures", _none,
     "the fixed count's slowest rank sets each step", _MEASURED),
    ("The fused kernels' training step", "cfmtrain bench kernels --preset paper-model --ops "
     "model --impls fused mace", lambda root: _from(root, "kernels_paper-model.csv", _step),
     "fused GPU kernels (cuEquivariance)",
     "compiled CPU kernels against mace-torch on CPU, the paper's model shape"),
    ("Time to accuracy", "snakemake --profile profiles/local accuracy",
     lambda root: _from(root, "accuracy_mini.csv", _accuracy), "the same accuracy sooner",
     _MEASURED + ", against mace-torch's `mace_run_train`"),
)


def paper_table(root: Path) -> str:
    """docs/paper.md's table: each of the paper's figures and tables, its command here, our value
    from the reference CSVs, the paper's (cfmtrain.paper) and what differs."""
    return markdown_table(["paper", "command", "here", "the paper", "what differs"],
                          [[item, f"`{command}`", ours(root), theirs, differs]
                           for item, command, ours, theirs, differs in PAPER_ITEMS])


def datasets_table() -> str:
    """docs/paper.md's table of the data sets of the registry (cfmtrain.sources.registry)."""
    rows = [[f"`{d.name}`", d.paper_name, d.source, d.license,
             f"[{d.doi}](https://doi.org/{d.doi})" if d.doi else "",
             " ".join(f"<{f.url}>" for f in d.files) or " ".join(d.instructions.split())[:200]]
            for d in DATASETS.values()]
    return markdown_table(["name", "in the paper", "source", "licence", "DOI", "where"], rows)


# ------------------------------------------------------------------ pictures

FIGURES = Path("docs/figures")
DIGESTS = FIGURES / "digests.json"  # each picture's digest of its sources and of its PNG
RULEGRAPH = FIGURES / "rulegraph.dot"  # `snakemake --cores 1 --rulegraph dot all`


def _ablation_png(paths: list[Path], output: Path) -> None:
    from cfmtrain.plots.ablation import draw_ablation  # lazy: matplotlib
    draw_ablation(pd.read_csv(paths[0]), output,
                  "Figure 6: speed-up over baseline (mini, 2-core CPU host)")


def _accuracy_png(paths: list[Path], output: Path) -> None:
    from cfmtrain.plots.accuracy import draw_time_to_target  # lazy: matplotlib
    draw_time_to_target(pd.read_csv(paths[0]), output,
                        "Time to accuracy on mini (2-core CPU host)")


def _graphs_per_rank_png(paths: list[Path], output: Path) -> None:
    from cfmtrain.plots.graphs_per_rank import draw_graphs_per_rank  # lazy: matplotlib
    draw_graphs_per_rank(pd.read_csv(paths[0]), output,
                         "Figure 12: graphs per rank per step on mini, fixed count and Algorithm 1")


def _rulegraph_png(paths: list[Path], output: Path) -> None:
    from cfmtrain.plots.rulegraph import draw_rulegraph  # lazy: matplotlib
    draw_rulegraph(paths[0].read_text(), output, "The rules of target `all` (inputs left)")


@dataclasses.dataclass(frozen=True)
class Picture:
    """A PNG of docs/figures/, drawn by `draw` from its sources (files of the repository) with
    the drawing code of cfmtrain.plots' module `module`."""

    name: str
    sources: tuple[str, ...]
    draw: Callable[[list[Path], Path], None]
    module: str


PICTURES = (
    Picture("ablation", (f"{REFERENCE}/ablation.csv",), _ablation_png, "cfmtrain.plots.ablation"),
    Picture("accuracy", (f"{REFERENCE}/accuracy_mini.csv",), _accuracy_png,
            "cfmtrain.plots.accuracy"),
    Picture("graphs_per_rank", (f"{REFERENCE}/{FIGURE12.csv}",), _graphs_per_rank_png,
            "cfmtrain.plots.graphs_per_rank"),
    Picture("rulegraph", (str(RULEGRAPH),), _rulegraph_png, "cfmtrain.plots.rulegraph"),
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def picture_digest(root: Path, picture: Picture) -> str:
    """What a picture is drawn from: its sources' bytes, the drawing module's source, the
    shared figure code's and this function's caller (the picture's own drawing call)."""
    parts = [(root / s).read_bytes() for s in picture.sources]
    parts += [inspect.getsource(importlib.import_module(m)).encode()
              for m in (picture.module, "cfmtrain.plots.common")]
    parts.append(inspect.getsource(picture.draw).encode())
    return _sha(b"\0".join(parts))


def stale_pictures(root: Path) -> list[Picture]:
    """The pictures whose PNG is missing, or not drawn from their current sources and code."""
    path = root / DIGESTS
    known = json.loads(path.read_text()) if path.is_file() else {}
    stale = []
    for p in PICTURES:
        png = root / FIGURES / f"{p.name}.png"
        if not all((root / s).is_file() for s in p.sources):
            continue  # not in the reference set: nothing to draw from
        entry = known.get(p.name, {})
        if (not png.is_file() or entry.get("source") != picture_digest(root, p)
                or entry.get("png") != _sha(png.read_bytes())):
            stale.append(p)
    return stale


def draw_pictures(root: Path, pictures: list[Picture]) -> None:
    """Draw each picture's PNG into docs/figures/ (palette PNG, small) and record its digests."""
    from PIL import Image

    path = root / DIGESTS
    known = json.loads(path.read_text()) if path.is_file() else {}
    (root / FIGURES).mkdir(parents=True, exist_ok=True)
    for p in pictures:
        with tempfile.TemporaryDirectory() as tmp:
            drawn = Path(tmp) / f"{p.name}.png"
            p.draw([root / s for s in p.sources], drawn)
            with Image.open(drawn) as image:
                small = image.convert("RGB").quantize(colors=64, dither=Image.Dither.NONE)
            png = root / FIGURES / f"{p.name}.png"
            small.save(png, optimize=True)
        known[p.name] = {"source": picture_digest(root, p), "png": _sha(png.read_bytes())}
    path.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")


# ------------------------------------------------------------------ files


def _block(name: str) -> re.Pattern:
    """The generated block `name` of a page, between its markers."""
    return re.compile(rf"(<!-- cfmtrain docs: {name} -->\n)"  # the lines up to the first end
                      r"(?:(?!<!-- cfmtrain docs: end -->)[^\n]*\n)*"  # (an empty block too)
                      r"(<!-- cfmtrain docs: end -->)")


def outputs(root: Path) -> dict[Path, Callable[[str], str]]:
    """Each generated file and how its new text follows from its current text."""
    def fill(name: str, body: str) -> Callable[[str], str]:
        def apply(text: str) -> str:
            if not _block(name).search(text):
                raise ValueError(f"no `<!-- cfmtrain docs: {name} -->` ... end markers")
            return _block(name).sub(lambda m: f"{m.group(1)}{body}\n{m.group(2)}", text)
        return apply

    reference = config_reference(root)
    return {root / "README.md": fill("results", results_table(root)),
            root / "docs/benchmarks.md": fill("benchmarks", bench_tables(root)),
            root / "docs/configuration.md": fill("config", reference),
            root / "docs/own-data.md": fill("formats", formats_table()),
            root / "docs/experiments.md": fill("versus-paper", versus_paper_table(root)),
            root / "docs/paper.md": lambda text: fill("datasets", datasets_table())(
                fill("paper", paper_table(root))(text)),
            root / "docs/tutorial.md": lambda text: functools.reduce(
                lambda t, r: fill(r.csv.removesuffix(".csv"), reference_table(root, r))(t),
                TUTORIAL, fill("preset", preset_table())(text)),
            root / "docs/cli.md": fill("cli", cli_reference()),
            root / "docs/api.md": fill("api", api_reference()),
            root / "docs/kernels.md": fill("engines", reference_table(root, dataclasses.replace(
                next(r for r in RESULTS if r.csv == "md_1k.csv"), columns=ENGINES)))}


def _git(root: Path, *args: str) -> str:
    return children.run(["git", *args], cwd=root, capture_output=True, text=True,
                        check=True).stdout.strip()


def collect(root: Path, results: Path, names: list[str]) -> list[str]:
    """Copy the measured CSVs (all found, or those named) from the results folder into
    docs/results/, replacing them, and record each one's commit and date (the commit checked
    out when the file was written; "+ changes" if the tree now has uncommitted code changes)
    and the host check of results/bench/host.csv (`cfmtrain bench host`, run before)."""
    dirty = bool(_git(root, "status", "--porcelain", "--", "src", "kernels", "workflow",
                      "setup.py"))
    host_csv = results / Path(HOST.source).relative_to("results")
    host = host_check(pd.read_csv(host_csv)) if host_csv.is_file() else "not run"
    manifest = _manifest(root)
    copied = []
    for r in COLLECTED:
        source = results / Path(r.source).relative_to("results")
        if (names and r.csv.removesuffix(".csv") not in names) or not source.is_file():
            continue
        written = datetime.datetime.fromtimestamp(source.stat().st_mtime, datetime.UTC)
        commit = _git(root, "rev-list", "-1", "--abbrev-commit", f"--before={written:%s}",
                      "HEAD") + (" + changes" if dirty else "")
        shutil.copyfile(source, root / REFERENCE / r.csv)
        manifest = pd.concat([manifest[manifest.file != r.csv], pd.DataFrame([{
            "file": r.csv, "commit": commit, "date": f"{written:%Y-%m-%d}", "host": host}])])
        copied.append(r.csv)
    manifest.sort_values("file").to_csv(root / MANIFEST, index=False)
    return copied


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a generated part is not up to date")
    parser.add_argument("--collect", nargs="*", metavar="NAME",
                        help="first copy the CSVs measured under results/ into docs/results/ "
                             "(all found, or those named: " + ", ".join(
                                 r.csv.removesuffix(".csv") for r in COLLECTED) + ")")
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="the results folder --collect reads")
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository")


def run(args: argparse.Namespace) -> int:
    root = args.root
    if args.collect is not None and not args.check:
        print("collected:", ", ".join(collect(root, args.results, args.collect)) or "nothing")
    stale = []
    for path, make in outputs(root).items():
        old = path.read_text() if path.is_file() else ""
        new = make(old)
        if new != old:
            stale.append(str(path.relative_to(root)))
            if not args.check:
                path.write_text(new)
    pictures = stale_pictures(root)
    stale += [str(FIGURES / f"{p.name}.png") for p in pictures]
    if pictures and not args.check:
        draw_pictures(root, pictures)
    verb = "not up to date" if args.check else "written"
    print(f"{verb}: {', '.join(stale)}" if stale else "generated parts up to date")
    return 1 if args.check and stale else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cfmtrain docs", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
