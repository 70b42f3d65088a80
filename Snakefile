# cfmtrain: the HPDC 2025 MACE case study as one workflow. Setup and targets only;
# the rules live in workflow/rules/, the logic in the cfmtrain package.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/rebuild.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/graphs.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/balance.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/results_inputs.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/simulate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/accuracy.smk"
include: "workflow/rules/model.smk"


rule all:
    default_target: True
    input:
        graph_targets(),
        stats_targets(),
        balance_targets(),
        bench_targets(),
        ablation_targets(),
        figure_targets(),


rule graphs:
    input:
        graph_targets(),


rule stats:
    input:
        stats_targets(),


rule balance:
    input:
        balance_targets(),


# the baseline check (mace_run_train against our baseline, ~8 minutes) is left out of `all`
rule ablation:
    input:
        ablation_targets(),
        baseline_check_targets(),


rule sweeps:
    input:
        sweep_targets(),


rule simulate:
    input:
        simulate_targets(),


rule figures:
    input:
        figure_targets(),


rule benchmark:
    input:
        bench_targets(),


# molecular dynamics, fused against mace-torch at the paper's model shape (not in `all`)
rule md:
    input:
        "results/bench/md_paper-model.csv",


# the data path against the graph count: generate, graphs, split, training (not in `all`)
rule scale:
    input:
        "results/bench/scale.csv",


# time to accuracy against mace_run_train (three trainings; not in `all`)
rule accuracy:
    input:
        ACCURACY_TARGETS,


# a model to publish per data set of config `model.datasets`, evaluated (not in `all`)
rule model:
    input:
        model_targets(),
