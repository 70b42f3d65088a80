"""The paper's facts live in cfmtrain.paper only: no other module of src/cfmtrain restates its
scale, model size, graph count, timings or variant names, and the schema's defaults agree."""

from __future__ import annotations

import ast

import yaml
from helpers import REPO

from cfmtrain import paper
from cfmtrain.plots import common
from cfmtrain.simulate import versus_paper
from cfmtrain.simulate.settings import DEFAULT_RANKS, SimulateSettings
from cfmtrain.train.config import TrainConfig

PACKAGE = REPO / "src/cfmtrain"
# the paper's numbers no other module may write (4.69 as in "4.69M", 0.865 its efficiency)
NUMBERS = {paper.PAPER_RANKS, paper.PAPER_PARAMETERS, paper.PAPER_GRAPHS, 4.69, 4.69e6,
           2.65e6, paper.STRONG_EFFICIENCY}
# keyword arguments whose value merely spells like a variant (matplotlib's which="both")
FOREIGN_KEYWORDS = {"which"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def offences(source: str) -> list[str]:
    """The paper's numbers and variant names written as literals in `source`, with their lines;
    docstrings, comments and the values of FOREIGN_KEYWORDS are not looked at."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | {id(k.value) for k in ast.walk(tree)
                                if isinstance(k, ast.keyword) and k.arg in FOREIGN_KEYWORDS}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in skip:
            continue
        value = node.value
        if isinstance(value, str) and value in paper.VARIANTS:
            found.append(f"line {node.lineno}: variant name {value!r}")
        elif (isinstance(value, (int, float)) and not isinstance(value, bool)
              and value in NUMBERS):
            found.append(f"line {node.lineno}: the paper's {value!r}")
    return found


def test_no_module_but_paper_restates_the_papers_facts():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "paper.py":
            continue
        found += [f"{path.relative_to(REPO)} {o}" for o in offences(path.read_text())]
    assert not found, "import these from cfmtrain.paper:\n" + "\n".join(found)


def test_a_reintroduced_literal_is_found():
    source = ('"""At 740 ranks both beat baseline."""\n'
              'def f(ax):\n    """baseline"""\n    ax.grid(which="both")  # 740\n')
    assert offences(source) == []
    assert offences(source + 'RANKS = 740\n') == ["line 5: the paper's 740"]
    assert offences('x = 2_650_000\ny = {"both": 1}\n') == [
        "line 1: the paper's 2650000", "line 2: variant name 'both'"]
    assert len(offences('if cfg.variant in ("kernel", "both"): pass\n')) == 2


def test_variants_keep_their_traits_labels_and_colours():
    traits = {v.name: (v.balanced, v.fused, v.matched) for v in paper.ALL_VARIANTS}
    assert traits == {"baseline": (False, False, False), "balancer": (True, False, False),
                      "kernel": (False, True, False), "both": (True, True, False),
                      "matched": (False, False, True)}
    assert paper.ABLATION == ("baseline", "balancer", "kernel", "both")
    assert paper.VARIANTS == (*paper.ABLATION, "matched")
    assert common.VARIANT_ORDER == ("baseline", "matched", "balancer", "kernel", "both")
    assert [common.color(v) for v in common.VARIANT_ORDER] == [
        "tab:gray", "tab:brown", "tab:blue", "tab:orange", "tab:green"]
    assert common.label("both") == "MACE + balancer + kernels"
    assert common.label("matched") == "MACE (fixed count, matched atoms)"
    for v in paper.ALL_VARIANTS:
        cfg = TrainConfig(variant=v.name)
        assert (cfg.balanced, cfg.fused) == (v.balanced, v.fused)
        assert paper.variant(v.name) is v
    assert versus_paper.HEADLINE == ("baseline", "both")


def test_the_papers_timings_are_compared():
    assert paper.EPOCH_MINUTES == {("baseline", 740): 12.0, ("both", 740): 2.0,
                                   ("baseline", 64): 100.0, ("both", 64): 18.0,
                                   ("both", 16): 80.0}
    assert paper.STRONG_EFFICIENCY == round(80 / (740 / 16 * 2), 3)
    quantities = list(versus_paper.comparison(_empty_strong()).quantity)
    assert quantities[0] == "baseline min/epoch, 740 ranks"
    assert quantities[-1] == "strong-scaling efficiency 16 -> 740, balancer+kernels"


def _empty_strong():
    import pandas as pd

    return pd.DataFrame(columns=["run", "ranks", "epoch_s", "epoch_s_low", "epoch_s_high"])


def test_the_schema_defaults_are_the_papers():
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    props = schema["properties"]
    simulate = SimulateSettings()  # the schema's simulate settings have no defaults of their own
    expected = {"total_graphs": paper.PAPER_GRAPHS, "ranks": list(DEFAULT_RANKS),
                "weak": [f"{g}:{r}" for g, r in paper.WEAK_SCALING],
                "parameters": paper.PAPER_PARAMETERS, "capacity": paper.CAPACITY}
    for key, value in expected.items():
        assert getattr(simulate, key) == value, f"simulate.{key} default"
    assert props["simulate"]["properties"]["variants"]["default"] == list(paper.ABLATION)
    assert paper.PAPER_RANKS in DEFAULT_RANKS
    figures = props["figures"]
    assert figures["properties"]["variants"]["default"] == list(paper.ABLATION)
    assert figures["properties"]["variants"]["contains"] == {"const": paper.BASELINE.name}
    assert props["cutoff"]["default"] == paper.CUTOFF
    assert props["balance"]["properties"]["capacity"]["default"] == paper.CAPACITY
