# Figures 6-11 and 13 and the simulated Figures 7, 8 and 10, drawn only from results files
# (training summaries, sweep and simulator tables): regenerating a figure never retrains.


for _figure in FIGURE_INPUTS:

    rule:
        name:
            f"figure_{_figure}"
        input:
            FIGURE_INPUTS[_figure][1],
        output:
            png=report(
                f"results/figures/{_figure}.png",
                caption=figure_caption_path(_figure),
                category="Figures",
                subcategory="simulated" if _figure.endswith("_simulated") else "measured",
            ),
            pdf=f"results/figures/{_figure}.pdf",
        log:
            f"logs/figures/{_figure}.log",
        params:
            name=FIGURE_INPUTS[_figure][0],
        threads: 1
        conda:
            "../../envs/cfmtrain.yaml"
        shell:
            "python -m cfmtrain figure {params.name:q} --inputs {input:q}"
            " --output {output.png:q} > {log:q} 2>&1"
