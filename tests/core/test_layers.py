"""The architecture's picture holds: lint-imports' layer contract keeps the data flow's order,
the README's layout map lists the same rooms in the same order, and cfmtrain's modules import
each other at the top except where the package docstring lists a lazy import."""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from helpers import REPO

import cfmtrain

SRC = REPO / "src" / "cfmtrain"


def contract_layers() -> list[list[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = config["tool"]["importlinter"]["contracts"]
    return [re.split(r"\s*[|:]\s*", layer.strip()) for layer in contract["layers"]]


def test_the_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "KEPT" in done.stdout, done.stdout + done.stderr


def test_the_readme_layout_lists_the_contract_layers_in_order():
    text = (REPO / "README.md").read_text()
    table = text.split("## Layout", 1)[1].split("\n\n", 3)[2]
    rows = [re.findall(r"`([a-z_]+)`", line.split("|")[1]) for line in table.splitlines()[2:]]
    layers = [layer for layer in contract_layers() if layer != ["__main__"]]
    assert rows == layers


def test_cfmtrain_imports_inside_functions_are_the_listed_lazy_ones():
    listed = cfmtrain.__doc__.split("Imports inside functions", 1)[1]
    found = set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                if module and module.startswith("cfmtrain"):
                    found.add(path.relative_to(SRC).as_posix())
    assert found, "the lazy imports exist"
    missing = sorted(name for name in found if name not in listed)
    assert not missing, f"in-function cfmtrain imports not listed in the docstring: {missing}"
