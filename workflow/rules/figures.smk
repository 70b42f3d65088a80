# Every figure of the paper, one rule each, named as its files and its caption
# (workflow/report/<name>.rst) and as `cfmtrain figure <name>`: the rule writes the figure's tidy
# table (<name>.csv) and draws the PNG and PDF from it. Figures 6-11 and 13 and the simulated
# Figures 7, 8 and 10 are drawn only from results files (training cells, sweep and simulator
# tables): regenerating a figure never retrains. Figures 5 and 12 are per data set, from the
# graph store's per-graph table.


for _figure, _inputs in FIGURE_INPUTS.items():

    rule:
        name:
            _figure
        input:
            _inputs,
        output:
            csv=f"results/figures/{_figure}.csv",
            png=report(
                f"results/figures/{_figure}.png",
                caption=f"../report/{_figure}.rst",
                category="Figures",
                subcategory="simulated" if _figure.endswith("_simulated") else "measured",
            ),
            pdf=f"results/figures/{_figure}.pdf",
        log:
            f"logs/figures/{_figure}.log",
        params:
            name=_figure,
        threads: 1
        conda:
            "../../envs/cfmtrain.yaml"
        shell:
            "python -m cfmtrain figure {params.name:q} --inputs {input:q}"
            " --output {output.png:q} > {log:q} 2>&1"


rule fig05_sizes:
    input:
        graph_shards,
    output:
        csv="results/figures/fig05_sizes_{dataset}.csv",
        png=report(
            "results/figures/fig05_sizes_{dataset}.png",
            caption="../report/fig05_sizes.rst",
            category="Data",
        ),
        pdf="results/figures/fig05_sizes_{dataset}.pdf",
    log:
        "logs/figures/fig05_sizes_{dataset}.log",
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain figure fig05_sizes --inputs {input:q}"
        " --dataset {wildcards.dataset:q} --output {output.png:q} > {log:q} 2>&1"


rule fig12_graphs_per_rank:
    input:
        graph_shards,
    output:
        csv="results/figures/fig12_graphs_per_rank_{dataset}.csv",
        png=report(
            "results/figures/fig12_graphs_per_rank_{dataset}.png",
            caption="../report/fig12_graphs_per_rank.rst",
            category="Balance",
        ),
        pdf="results/figures/fig12_graphs_per_rank_{dataset}.pdf",
    log:
        "logs/figures/fig12_graphs_per_rank_{dataset}.log",
    params:
        layout=fig12_layout_args,
    threads: 1
    conda:
        "../../envs/cfmtrain.yaml"
    shell:
        "python -m cfmtrain figure fig12_graphs_per_rank --inputs {input:q}"
        " --dataset {wildcards.dataset:q} {params.layout} --output {output.png:q} > {log:q} 2>&1"
