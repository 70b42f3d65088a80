"""The pipeline's rule graph (`snakemake --rulegraph dot`) drawn without graphviz: the DOT text's
rules and edges, laid out in layers by longest path from the inputs (networkx), each rule a box."""

from __future__ import annotations

import re
from pathlib import Path

from cfmtrain.plots.common import plt, save


def rulegraph_edges(dot: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The rules (sorted) and edges (producer, consumer; sorted) of a rule graph's DOT text."""
    names = dict(re.findall(r'^\s*(\d+)\[label = "([^"]+)"', dot, re.M))
    edges = sorted({(names[a], names[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dot, re.M)})
    return sorted(names.values()), edges


def draw_rulegraph(dot: str, output: str | Path, title: str) -> list[Path]:
    """Left to right: each rule in the layer of its longest path from a rule without inputs,
    ordered in its layer by its inputs' places; the target rule `all` (which takes everything)
    left out."""
    import networkx as nx

    rules, edges = rulegraph_edges(dot)
    rules = [r for r in rules if r != "all"]
    edges = [(a, b) for a, b in edges if "all" not in (a, b)]
    graph = nx.DiGraph(edges)
    graph.add_nodes_from(rules)
    layers = [sorted(layer) for layer in nx.topological_generations(graph)]
    depth = {rule: k for k, layer in enumerate(layers) for rule in layer}
    for rule in nx.topological_sort(graph):  # longest path: a rule sits right of all its inputs
        depth[rule] = max([depth[p] + 1 for p in graph.predecessors(rule)], default=0)
    columns: dict[int, list[str]] = {}
    place: dict[str, float] = {}
    for rule in sorted(rules, key=lambda r: (depth[r], r)):
        columns.setdefault(depth[rule], []).append(rule)
    for x in sorted(columns):  # each layer ordered by the mean place of its rules' inputs
        inputs = {r: [place[p] for p in graph.predecessors(r)] for r in columns[x]}
        columns[x].sort(key=lambda r: (sum(inputs[r]) / len(inputs[r]) if inputs[r] else 0, r))
        place.update({r: k for k, r in enumerate(columns[x])})
    tallest = max(len(c) for c in columns.values())
    where = {rule: (x, (tallest - 1) / 2 - y) for x, column in columns.items()
             for y, rule in enumerate(column)}
    fig, ax = plt.subplots(figsize=(1.9 * len(columns), 0.55 * tallest + 0.8))
    for a, b in edges:
        ax.annotate("", xy=where[b], xytext=where[a],
                    arrowprops={"arrowstyle": "->", "color": "grey", "lw": 0.7,
                                "shrinkA": 28, "shrinkB": 28})
    for rule, (x, y) in where.items():
        ax.text(x, y, rule, ha="center", va="center", fontsize=7,
                bbox={"boxstyle": "round", "facecolor": "#dde8f5", "edgecolor": "#3b6ea5"})
    ax.set_xlim(-0.6, len(columns) - 0.4)
    ax.set_ylim(-tallest / 2, tallest / 2)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    return save(fig, output)
