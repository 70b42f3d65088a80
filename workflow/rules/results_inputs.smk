# Input functions and targets of the sweep, simulate and figures rules (kept apart from the
# rules, as `snakemake --lint` asks). Include before sweep.smk, simulate.smk and figures.smk.

# --- sweep.smk
def sweep_targets():
    s = config["sweep"]
    return [
        f"results/sweep/{s['dataset']}/batch_{s['preset']}.csv",
        f"results/sweep/{s['dataset']}/capacity_{s['preset']}.csv",
        f"results/sweep/{s['dataset']}/capacity_{s['preset']}.json",
    ]


def sweep_args(wildcards):
    """`--settings` of both sweeps: config `sweep`'s settings at the wildcard's preset."""
    return command(*settings_option(config, "sweep", preset=wildcards.preset))


# --- simulate.smk
SIMULATE_TABLES = ("strong.csv", "weak.csv", "strategies.csv", "validation.csv", "fit.csv",
                   "ratios.csv", "strong_accelerator.csv", "weak_accelerator.csv")


def simulate_targets():
    s = config["simulate"]
    return [
        f"results/simulate/{s['dataset']}/{s['distribution']}/{name}"
        for name in (*SIMULATE_TABLES, "paper.md")
    ]


def simulate_runs(wildcards):
    """The measured cells the cost models are fitted on: every variant at every rank count."""
    s = config["simulate"]
    return [cell_summary(wildcards.trainset, v, r) for v in s["variants"]
            for r in s["measured_ranks"]]


def simulate_groups(wildcards):
    """Every group of config `train.matrix` (its paired.csv): the speed-ups the simulator is
    judged on, the matrix's last group held out unless `simulate.held_out` names another."""
    return [f"{group_folder(d, r)}/paired.csv" for d, r in matrix_groups()]


def simulate_calibration(wildcards):
    """The step-time calibration of the trainset's cells' model (rule sweep_calibrate)."""
    return f"results/sweep/{wildcards.trainset}/calibration_{config['sweep']['preset']}.csv"


def simulate_args(wildcards):
    """`--settings` of the simulator: config `simulate`'s settings at the wildcard's
    distribution."""
    return command(*settings_option(config, "simulate", distribution=wildcards.distribution))


# --- figures.smk
def figure_targets():
    """Every figure of `figures` (not the per-data-set Figures 5 and 12: see stats_targets and
    balance_targets), its table and its images, and the kernel benchmark figure."""
    kernels = f"results/figures/fig_kernels_{config['bench']['preset']}.png"  # bench_kernels
    return [f"results/figures/{n}.{ext}" for n in FIGURE_INPUTS
            for ext in ("csv", "png", "pdf")] + [kernels]


def with_pairs(pairs):
    """Every figure variant's run on each (data set, ranks), then each group's paired.csv."""
    f = config["figures"]
    runs = [cell_summary(d, v, r) for d, r in pairs for v in f["variants"]]
    return runs + [f"{group_folder(d, r)}/paired.csv" for d, r in pairs]


def sizes_cells(wildcards):
    """Figures 6 and 10: every variant on each (data set, ranks) pair of `figures.sizes`."""
    return with_pairs([(p["dataset"], p["ranks"]) for p in config["figures"]["sizes"]])


def scaling_cells(wildcards):
    """Figures 7 and 8: every variant at every measured rank count of `figures.dataset`."""
    f = config["figures"]
    return with_pairs([(f["dataset"], r) for r in f["ranks"]])


def pair_cells(wildcards):
    """Figures 9 and 13: the fixed-count baseline and balancer+kernels at `figures.pair_ranks`."""
    f = config["figures"]
    return [cell_summary(f["dataset"], v, f["pair_ranks"]) for v in (BASELINE.name, BOTH.name)]


def sweep_table(kind):
    s = config["sweep"]
    return f"results/sweep/{s['dataset']}/{kind}_{s['preset']}"


def simulated_table(name):
    s = config["simulate"]
    return f"results/simulate/{s['dataset']}/{s['distribution']}/{name}.csv"


# figure name (rule, files, caption, `cfmtrain figure`) -> its inputs
FIGURE_INPUTS = {
    "fig06_ablation": sizes_cells,
    "fig07_strong_scaling": scaling_cells,
    "fig08_speedup": scaling_cells,
    "fig09_loss": pair_cells,
    "fig10_weak_scaling": sizes_cells,
    "fig11_batch_size": lambda wc: [sweep_table("batch") + ".csv"],
    "fig11_capacity": lambda wc: [sweep_table("capacity") + ext for ext in (".csv", ".json")],
    "fig13_straggler": pair_cells,
    "fig07_strong_scaling_simulated": lambda wc: [simulated_table("strong")],
    "fig08_speedup_simulated": lambda wc: [simulated_table("strong")],
    "fig10_weak_scaling_simulated": lambda wc: [simulated_table("weak")],
}


def fig12_layout_args(wildcards):
    """Figure 12's options of `cfmtrain figure`, from config `balance` (as balance_report)."""
    b = config["balance"]
    f = b["figure"]
    return command("--capacity", b["capacity"], "--measure", b["measure"], "--a", b["a"],
                   "--b", b["b"], "--seed", b["seed"], "--oversize", b["oversize"],
                   "--ranks", f["ranks"], "--steps", f["steps"],
                   "--graphs-per-batch", f["graphs_per_batch"])
