"""Results tables are declared once: every table one stage writes and another reads has a record
(a dataclass deriving cfmtrain.tables.Record, beside its writer), and read_table/write_table
check and write its columns.

test_a_column_is_spelled_only_beside_its_record holds readers to that: a reader takes a
column's name from the record (`frame.col`, `Record.col.name`), never from a string of its own.
The rule, scoped so that a generic word (`ranks`, `status`) used for something else is not
taken for a column:
- the records are the classes of src/cfmtrain that derive Record (directly or through another
  record); a record's columns are its dataclass fields, inherited ones included;
- a file is checked against the records of the modules it imports (a reader needs the record
  for read_table; a module of records that imports others', as train.runs does steps' and
  epochs', gives access to their tables too), unless the record is in the file's own room (the
  package of its writer, which owns its vocabulary);
- in a checked file a string literal (docstrings aside) is a column when it is where pandas
  or a row takes a column name: a subscript (`df["col"]`, `df[["a", "b"]]`, `.loc[:, "col"]`),
  the key of `.get("col")`, the left of `"col" in df`, a column argument (`groupby`,
  `sort_values`, `set_index`, `drop_duplicates`, `duplicated`, `drop`, `merge`, `pivot_table`,
  `reindex`; `columns=`, `on=`, `by=`, `subset=`, `usecols=`, `fieldnames=`; the column of a
  named aggregation, `agg(x=("col", "max"))`), or one of two or more columns of the same
  record in one tuple or list of strings (a column list);
- such a literal fails when it names a column of a checked record and the file does not
  declare a record with that column itself (two tables may share a column name).
Dict keys are not checked: a writer builds its rows as records, whose constructor refuses a
key that is not a column.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest
from helpers import REPO

from cfmtrain.tables import Record, read_table, records, write_table

SRC = REPO / "src"
PANDAS_COLUMN_CALLS = {"groupby", "sort_values", "set_index", "drop_duplicates", "duplicated",
                       "drop", "merge", "pivot_table", "reindex", "get"}
COLUMN_KEYWORDS = {"columns", "on", "by", "subset", "usecols", "fieldnames"}


@dataclasses.dataclass
class Source:
    """One module's source: its name, room and tree."""

    path: str
    module: str
    tree: ast.Module

    @property
    def room(self) -> str:
        return self.module.split(".")[1] if "." in self.module else self.module


@dataclasses.dataclass
class Declared:
    """A class of the sources: where, its own annotated fields and its bases' names."""

    source: Source
    fields: list[str]
    bases: list[str]


def sources(root: Path = SRC) -> list[Source]:
    """Every module of cfmtrain, parsed."""
    found = []
    for path in sorted((root / "cfmtrain").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append(Source(path.relative_to(root).as_posix(), module,
                            ast.parse(path.read_text())))
    return found


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _is_classvar(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def declared(found: list[Source]) -> dict[str, Declared]:
    """Every class of the sources by name, with its own dataclass fields."""
    classes = {}
    for source in found:
        for node in ast.walk(source.tree):
            if isinstance(node, ast.ClassDef):
                own = [item.target.id for item in node.body if isinstance(item, ast.AnnAssign)
                       and isinstance(item.target, ast.Name) and not _is_classvar(item.annotation)]
                classes[node.name] = Declared(source, own, [_name(b) for b in node.bases])
    return classes


def chain(name: str, classes: dict[str, Declared], seen: frozenset = frozenset()) -> list[str]:
    """The class and its bases among the sources, bases first (a base named as the class, a
    library's, is not followed)."""
    if name not in classes or name in seen:
        return []
    order = [c for base in classes[name].bases for c in chain(base, classes, seen | {name})]
    return [*dict.fromkeys(order), name]


def record_columns(classes: dict[str, Declared]) -> dict[str, tuple[list[str], set[str]]]:
    """Each record's (columns, files declaring them)."""
    found = {}
    for name in classes:
        line = chain(name, classes)
        if name == "Record" or not any(classes[c].bases and "Record" in classes[c].bases
                                       for c in line):
            continue
        columns = [f for c in line for f in classes[c].fields]
        found[name] = (columns, {classes[c].source.path for c in line})
    return found


def imported_modules(tree: ast.Module) -> set[str]:
    """The cfmtrain modules a tree imports (`from a import b`: a, and a.b should b be one)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n.startswith("cfmtrain")}


def _strings(node: ast.expr | None) -> list[ast.Constant]:
    """The string constant `node` is, or those of the tuple or list it is."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.Tuple | ast.List):
        return [e for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def column_places(tree: ast.Module) -> tuple[list[ast.Constant], list[list[ast.Constant]]]:
    """(string constants where a column is named, the all-string tuples and lists)."""
    single, lists = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            index = node.slice
            single += _strings(index)
            if isinstance(index, ast.Tuple):  # .loc[rows, "col"] or .loc[rows, ["a", "b"]]
                for part in index.elts:
                    single += _strings(part)
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            single += _strings(node.left)
        elif isinstance(node, ast.Call):
            method = _name(node.func)
            if method in PANDAS_COLUMN_CALLS and node.args:
                single += _strings(node.args[0])
            for keyword in node.keywords:
                if keyword.arg in COLUMN_KEYWORDS:
                    single += _strings(keyword.value)
                elif method in ("agg", "aggregate") and isinstance(keyword.value, ast.Tuple):
                    single += _strings(keyword.value.elts[0])
        elif isinstance(node, ast.Tuple | ast.List) and len(node.elts) >= 2 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            lists.append(list(node.elts))
    return single, lists


def respelt(found: list[Source]) -> list[str]:
    """Every column a checked file spells as a string where a column is named (the rule of the
    module docstring), as 'file:line: "column" of Record'."""
    classes = declared(found)
    columns = record_columns(classes)
    homes = {}  # column -> files declaring a record with it
    for cols, files in columns.values():
        for column in cols:
            homes.setdefault(column, set()).update(files)
    modules = {s.module: s for s in found}
    # the records a module offers: its own and, for a module of records, those it imports
    own = {s.module: {n for n, d in classes.items() if n in columns and d.source is s}
           for s in found}
    offered = {m: set(names) for m, names in own.items()}
    for source in found:
        if own[source.module]:
            for imported in imported_modules(source.tree):
                offered[source.module] |= own.get(imported, set())
    problems = []
    for source in found:
        checked = {name for imported in imported_modules(source.tree) if imported in modules
                   for name in offered[imported]
                   if classes[name].source.room != source.room}
        if not checked:
            continue
        single, lists = column_places(source.tree)
        for name in sorted(checked):
            names = set(columns[name][0])
            hits = [c for c in single if c.value in names]
            for items in lists:
                inside = [c for c in items if c.value in names]
                hits += inside if len(inside) >= 2 else []
            problems += [f'{source.path}:{c.lineno}: "{c.value}" of {name}'
                         for c in hits if source.path not in homes[c.value]]
    return sorted(set(problems))


def test_every_listed_table_has_a_record():
    columns = record_columns(declared(sources()))
    for name in ("StepRecord", "EpochRecord", "RunSummary", "RoundRecord", "PairedRecord",
                 "BatchPoint", "CapacityPoint", "CalibrationPoint", "StrongRow", "WeakRow",
                 "StrategyRow", "ValidationRow", "FitRow"):
        assert name in columns, name
    assert "epoch_time_s" in columns["RunSummary"][0] and "kernels" in columns["FitRow"][0]
    assert columns["StrongRow"][0][:2] == ["run", "variant"]  # inherited from EpochRow


def test_a_column_is_spelled_only_beside_its_record():
    assert respelt(sources()) == []


@pytest.mark.slow
def test_a_reader_that_spells_a_column_again_fails():
    found = sources()
    reader = ("from cfmtrain.measure.group_tables import read_paired\n"
              "def best(paths):\n"
              "    table = read_paired(paths)\n"
              "    return table.sort_values('ratio_median')[['variant', 'reference']]\n")
    spelt = respelt([*found, Source("cfmtrain/plots/best.py", "cfmtrain.plots.best",
                                    ast.parse(reader))])
    spelt = [p for p in spelt if p.startswith("cfmtrain/plots/best.py")]
    assert spelt == ['cfmtrain/plots/best.py:4: "ratio_median" of PairedRecord',
                     'cfmtrain/plots/best.py:4: "reference" of PairedRecord',
                     'cfmtrain/plots/best.py:4: "variant" of PairedRecord',
                     'cfmtrain/plots/best.py:4: "variant" of RoundRecord']  # the same module's
    # through a module that hands out another room's table (train.runs: steps.csv)
    reader = ("from cfmtrain.train.runs import load_run\n"
              "def waits(path):\n"
              "    return load_run(path).steps().groupby('rank').wait_s.mean()\n")
    spelt = respelt([*found, Source("cfmtrain/bench/waits.py", "cfmtrain.bench.waits",
                                    ast.parse(reader))])
    spelt = [p for p in spelt if p.startswith("cfmtrain/bench/waits.py")]
    assert spelt == ['cfmtrain/bench/waits.py:3: "rank" of StepRecord']


@dataclasses.dataclass(frozen=True)
class Point(Record):
    name: str
    seconds: float
    count: int

    TABLE = "point table"
    WRITER = "the test"
    OPTIONAL = ("count",)


def test_write_and_read_a_table(tmp_path):
    path = tmp_path / "points.csv"
    table = write_table(path, [Point("a", 0.1 + 0.2, 3), Point("b", math.nan, 4)], Point)
    assert path.read_text() == "name,seconds,count\na,0.30000000000000004,3\nb,,4\n"
    assert read_table(path, Point).equals(table)
    assert records(table, Point)[0] == Point("a", 0.1 + 0.2, 3)
    assert Point.col.seconds == "seconds" and Point.of({"name": "c", "more": 1}).count != 0
    with pytest.raises(AttributeError, match="Point has no column 'second'"):
        _ = Point.col.second
    write_table(path, [], Point)
    assert path.read_text() == "name,seconds,count\n"
    assert read_table(path, Point, empty_ok=True).empty
    with pytest.raises(ValueError, match="points.csv: no rows"):
        read_table(path, Point)
    pd.DataFrame({"name": ["a"], "count": [1]}).to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"points.csv: not a point table, missing columns "
                                         r"\['seconds'\] \(written by the test; has \['name', "
                                         r"'count'\]\)"):
        read_table(path, Point)
    pd.DataFrame({"name": ["a"], "seconds": [1.0]}).to_csv(path, index=False)
    assert list(read_table(path, Point).columns) == ["name", "seconds"]  # count: optional
    with pytest.raises(FileNotFoundError, match="nothing.csv: missing .written by the test"):
        read_table(tmp_path / "nothing.csv", Point)
