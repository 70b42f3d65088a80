"""A command's settings are declared once, in its dataclass (type, default, help): its flags hold
no default of their own, the schema's sections of them hold none (cfmtrain.config_sections
fills them in), no object default of the schema repeats its keys' defaults, and each rule
passes its config section as one `--settings`. A default written a second time fails here."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import json
import shlex
import subprocess
import sys
import typing

import jsonschema
import pytest
import yaml
from helpers import REPO

from cfmtrain import config_sections, settings
from cfmtrain.bench import accuracy, balance, graphs, kernels, loader
from cfmtrain.bench.accuracy_settings import AccuracySettings
from cfmtrain.bench.settings import RENAMED, BenchSettings
from cfmtrain.config_sections import SECTIONS
from cfmtrain.settings import DEST, add_settings, flag, from_args, given, leaves, setting
from cfmtrain.simulate import allreduce
from cfmtrain.simulate.settings import DEFAULT_RANKS, SimulateSettings
from cfmtrain.sweep import cli as sweep_cli
from cfmtrain.sweep.settings import SweepSettings
from cfmtrain.typed import ConfigError

SCHEMA = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
# each settings section's keys that are the workflow's own (which data set, which variants)
WORKFLOW_KEYS = {"simulate": {"dataset", "variants", "measured_ranks"}, "sweep": {"dataset"},
                 "accuracy": {"datasets"}, "scale": set(), "bench": set()}
# the command of each settings section: its module (add_arguments, run); the benchmarks'
# settings extend the section `bench`
COMMANDS = {"simulate": "cfmtrain.simulate.cli", "sweep": "cfmtrain.sweep.cli",
            "accuracy": "cfmtrain.bench.accuracy", "scale": "cfmtrain.bench.scale",
            **{f"bench {b}": f"cfmtrain.bench.{b}" for b in ("graphs", "balance", "loader")}}
# the only hand-written defaults of those commands: options that are no setting (a list to
# append to, a folder); any other is a setting, to be declared in the command's dataclass
HAND_DEFAULTS = {("cfmtrain.sweep.cli", "--override"), ("cfmtrain.sweep.cli", "--set"),
                 ("cfmtrain.bench.accuracy", "--set"), ("cfmtrain.bench.accuracy", "--output-dir"),
                 *(("cfmtrain.bench.scale", f) for f in ("--work", "--output", "--figure"))}


def parser_of(module_name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module(module_name).add_arguments(parser)
    return parser


def _schema_settings(node: dict, cls: type, prefix: str = ""):
    """(dotted key, schema, is a nested dataclass) of every setting of `cls` in the schema."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in node.get("properties", {}):
            sub = node["properties"][field.name]
            nested = dataclasses.is_dataclass(hints[field.name])
            yield f"{prefix}{field.name}", sub, nested
            if nested:
                yield from _schema_settings(sub, hints[field.name], f"{prefix}{field.name}.")


# ------------------------------------------------------------------ the schema


@pytest.mark.parametrize("name", SECTIONS)
def test_the_schema_holds_no_default_of_a_setting(name):
    """A setting's default is its dataclass's: the schema's would be a second one."""
    section = SCHEMA["properties"][name]
    assert section.get("default", {}) == {}, f"{name}: an object default"
    keys = list(_schema_settings(section, SECTIONS[name]))
    assert keys  # the section has settings in the schema
    repeated = [f"{name}.{key}" for key, sub, _ in keys if "default" in sub]
    assert not repeated, f"defaults of the dataclass written again in the schema: {repeated}"


def test_a_default_written_into_the_schema_is_found():
    schema = config_sections.with_defaults(SCHEMA)
    section = schema["properties"]["simulate"]
    assert section["properties"]["ranks"]["default"] == list(DEFAULT_RANKS)
    assert [key for key, sub, _ in _schema_settings(section, SimulateSettings)
            if "default" in sub][:2] == ["distribution", "total_graphs"]


@pytest.mark.parametrize("name", SECTIONS)
def test_a_sections_keys_are_settings_or_the_workflows(name):
    section = SCHEMA["properties"][name]
    fields = {f.name for f in dataclasses.fields(SECTIONS[name])}
    assert set(section["properties"]) - fields == WORKFLOW_KEYS[name]
    for key, sub, nested in _schema_settings(section, SECTIONS[name]):
        if nested:  # every setting of a nested dataclass is a key of the config
            hint = typing.get_type_hints(SECTIONS[name])[key.split(".")[-1]]
            assert set(sub["properties"]) == {f.name for f in dataclasses.fields(hint)}, key


@pytest.mark.parametrize("name", SECTIONS)
def test_the_settings_defaults_pass_the_schema(name):
    """Types, ranges and choices of the schema hold for the dataclass's defaults."""
    section = SCHEMA["properties"][name]
    values = {k: v for k, v in settings.defaults(SECTIONS[name]).items()
              if k in section["properties"]}
    jsonschema.Draft202012Validator(section).validate(values)
    for key, sub, _ in _schema_settings(section, SECTIONS[name]):
        hint = dict((k, h) for k, h, _ in leaves(SECTIONS[name])).get(key)
        if "enum" in sub and typing.get_origin(hint) is typing.Literal:
            assert list(sub["enum"]) == list(typing.get_args(hint)), key


def _repeats(node: dict, path: str = "") -> list[str]:
    """Object defaults of the schema that repeat a default of one of their own keys."""
    found = []
    props = node.get("properties", {})
    default = node.get("default")
    if isinstance(default, dict) and props:
        found += [f"{path}{k}" for k in default if "default" in props.get(k, {})]
    extra = node.get("additionalProperties")
    if isinstance(default, dict) and isinstance(extra, dict):  # named entries: datasets.mini
        found += [f"{path}{name}.{k}" for name, entry in default.items()
                  if isinstance(entry, dict) for k in entry
                  if "default" in extra.get("properties", {}).get(k, {})]
    for key, sub in props.items():
        found += _repeats(sub, f"{path}{key}.")
    for sub in (node.get("additionalProperties"), node.get("items")):
        if isinstance(sub, dict):
            found += _repeats(sub, f"{path}[].")
    return found


def test_no_object_default_repeats_its_keys_defaults():
    """An omitted section gets its keys' defaults from `default: {}` (Snakemake's validation
    sets defaults depth first); an object default listing them again is a second copy."""
    assert _repeats(SCHEMA) == []
    assert _repeats({"properties": {"s": {"default": {"a": 1}, "properties": {
        "a": {"default": 1}}}}}) == ["s.a"]
    assert _repeats({"default": {"x": {"a": 1, "b": 2}}, "additionalProperties": {
        "properties": {"a": {"default": 1}, "b": {}}}}) == ["x.a"]


# ------------------------------------------------------------------ the commands


@pytest.mark.parametrize("name", COMMANDS)
def test_a_commands_flags_hold_no_default_of_a_setting(name):
    """The settings' flags are generated, without a default (the dataclass's applies); no
    hand-written option of the command is a setting."""
    parser = parser_of(COMMANDS[name])
    generated = [a for a in parser._actions if a.dest.startswith(DEST)]
    keys = {a.dest.removeprefix(DEST) for a in generated}
    assert {key for key, _, _ in leaves(SECTIONS[name.split()[0]])} <= keys
    assert all(a.default is argparse.SUPPRESS for a in generated)
    flags = {flag(k) for k in keys} | {f"--{k.split('.')[-1].replace('_', '-')}" for k in keys}
    for action in parser._actions:
        if action.dest.startswith(DEST) or action.dest == settings.UPDATES:
            continue
        assert action.dest not in keys and not set(action.option_strings) & flags, action.dest


def _hand_defaults(module_name: str) -> set[tuple[str, str]]:
    """(module, flag) of each add_argument call in the module's source with a default."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    return {(module_name, call.args[0].value) for call in ast.walk(tree)
            if isinstance(call, ast.Call) and getattr(call.func, "attr", getattr(
                call.func, "id", "")) in ("add_argument", "a")
            and any(k.arg == "default" for k in call.keywords)
            and call.args and isinstance(call.args[0], ast.Constant)}


def test_no_hand_written_default_but_of_options_that_are_no_setting():
    """A hand-written default of a command that has settings is an option that is no setting
    (HAND_DEFAULTS); any other belongs in the command's dataclass."""
    found = set().union(*(_hand_defaults(m) for m in COMMANDS.values()))
    assert found == HAND_DEFAULTS, "declare a setting's default in the command's dataclass"
    source = "def add_arguments(parser):\n    parser.add_argument('--tolerance', default=0.1)\n"
    tree = ast.parse(source)
    assert [c.args[0].value for c in ast.walk(tree) if isinstance(c, ast.Call)
            and any(k.arg == "default" for k in c.keywords)] == ["--tolerance"]


def test_the_kernel_benchmarks_preset_is_the_default_targets():
    """`bench kernels` keeps its own options (and presets beyond the section's), its preset's
    default is the section's."""
    parser = parser_of("cfmtrain.bench.kernels")
    preset = next(a for a in parser._actions if a.dest == "preset")
    assert preset.default == BenchSettings().preset
    assert _hand_defaults("cfmtrain.bench.kernels") >= {("cfmtrain.bench.kernels", "--preset")}
    assert '"quick"' not in inspect.getsource(kernels.add_arguments)


def test_presets_and_algorithms_are_the_settings_choices():
    def choices(cls: type, key: str) -> set:
        return set(typing.get_args(dict((k, h) for k, h, _ in leaves(cls))[key]))

    assert set(sweep_cli.PRESETS) == choices(SweepSettings, "preset")
    old_names = {old for old, new in RENAMED.items() if "accuracy" in new}
    assert set(accuracy.PRESETS) | {"model"} | old_names == choices(AccuracySettings, "preset")
    for module in (graphs, balance, loader):
        assert set(module.PRESETS) == choices(BenchSettings, "preset"), module.__name__
    assert set(allreduce.ALGORITHMS) == choices(SimulateSettings, "network.algorithm")


# ------------------------------------------------------------------ the builder


@dataclasses.dataclass
class Inner:
    """A nested section."""

    rate: float = setting(1e-3, "a rate")


@dataclasses.dataclass
class Example:
    """Settings of every kind."""

    count: int = setting(3, "a count")
    sizes: list[int] = setting([1, 2], "sizes")
    mode: typing.Literal["a", "b"] = setting("a", "a mode")
    name: str | None = setting(None, "a name")
    on: bool = setting(True, "a switch")
    inner: Inner = setting(Inner(), "nested")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_settings(parser, Example)
    return parser.parse_args(argv)


def test_flags_come_from_the_fields():
    parser = argparse.ArgumentParser()
    add_settings(parser, Example)
    text = parser.format_help()
    for line in ("--count COUNT", "--sizes [SIZES ...]", "--mode {a,b}", "--name NAME",
                 "--on, --no-on", "--inner-rate RATE", "(default: [1, 2])", "(default: 0.001)"):
        assert line in text, line
    assert from_args(Example, parse()) == Example()
    got = from_args(Example, parse("--count", "4", "--sizes", "5", "6", "--mode", "b",
                                   "--name", "none", "--no-on", "--inner-rate", "1e-2"))
    assert got == Example(4, [5, 6], "b", None, False, Inner(0.01))
    assert from_args(Example, parse("--sizes")).sizes == []


def test_settings_option_then_flags_win():
    args = parse("--settings", '{"count": 5, "inner": {"rate": 0.5}}', "--settings", "count=6",
                 "--settings", "inner.rate=2e-1", "--count", "7")
    got = from_args(Example, args)
    assert (got.count, got.inner.rate) == (7, 0.2)
    assert given(args) == {"count", "inner", "inner.rate"}
    assert given(parse()) == set()


@pytest.mark.parametrize("argv, message", [
    (["--count", "x"], "config count: expected an integer, got 'x'"),
    (["--sizes", "1", "y"], "config sizes: expected an integer"),
    (["--settings", "coun=1"], "unknown key 'coun'"),
    (["--settings", '{"inner": {"rate": "fast"}}'], "config inner.rate: expected a finite"),
    (["--settings", "{not json"], "Expecting property name"),
])
def test_a_wrong_setting_is_an_argparse_error_naming_the_key(argv, message):
    with pytest.raises(argparse.ArgumentError, match=message):
        parse(*argv)


def test_the_option_of_a_section_reads_back_as_its_settings():
    values = {"count": 9, "sizes": [], "name": "x y;z", "inner": {"rate": 5e-7}}
    assert from_args(Example, parse(*settings.option(values))) == settings.load(Example, values)


# ------------------------------------------------------------------ the workflow's config


def test_fill_gives_an_omitted_section_every_default_and_names_a_wrong_key():
    config = {"simulate": {"dataset": "mini", "ranks": [4]}}
    config_sections.fill(config)
    assert config["simulate"] == {"dataset": "mini",
                                  **settings.defaults(SimulateSettings), "ranks": [4]}
    assert config["sweep"] == settings.defaults(SweepSettings)
    assert config["accuracy"] == settings.defaults(AccuracySettings)
    option = config_sections.option(config, "sweep", preset="full")
    assert option[0] == "--settings" and json.loads(option[1])["preset"] == "full"
    assert "dataset" not in json.loads(config_sections.option(config, "simulate")[1])
    with pytest.raises(ConfigError, match=r"config simulate.network.alpha_s: expected a finite"):
        config_sections.fill({"simulate": {"network": {"alpha_s": "fast"}}})


# config sections with values other than the defaults, and the targets of their rules
OVERLAY = {"simulate": {"dataset": "mini_s", "ranks": [16, 740], "weak": ["0.5:2"],
                        "network": {"alpha_s": 1e-6}, "min_r2": 0.9},
           "sweep": {"threads": 1, "small_subset": "water clusters;x", "dtypes": ["float64"]},
           "accuracy": {"seeds": [3, 4], "epochs": 5, "ranks": 1},
           "scale": {"graphs": [300, 600], "steps": 4}}
TARGETS = {"simulate": ("results/simulate/mini_s/dataset/strong.csv", {"distribution": "dataset"}),
           "sweep": ("results/sweep/mini/capacity_full.csv", {"preset": "full"}),
           "accuracy": ("results/bench/accuracy_mini_quick_summary.csv", {"preset": "quick"}),
           "scale": ("results/bench/scale.csv", {})}


@pytest.mark.workflow
def test_each_rule_passes_its_config_section_as_its_settings(tmp_path):
    """The command line of each rule, read by the command's own parser, holds the config
    section's settings (the wildcards' over them) and sets none by a flag of its own."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump(OVERLAY))
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--forceall", "--printshellcmds", "--cores",
         "2", *(t for t, _ in TARGETS.values()), "--configfile", str(overlay)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {}
    for line in result.stdout.splitlines():  # each command's words after its name
        for name, words in (("simulate", "cfmtrain simulate "), ("sweep", "cfmtrain sweep "),
                            ("accuracy", "cfmtrain bench accuracy "),
                            ("scale", "cfmtrain bench scale ")):
            if words in line and " sweep calibrate " not in line:
                argv = shlex.split(line[line.index(words) + len(words):])
                lines[name] = argv[:argv.index(">")]
    assert set(lines) == set(TARGETS)  # the benchmarks of `bench` take the preset as a flag
    config = {k: dict(v) for k, v in OVERLAY.items()}
    config_sections.fill(config)
    for name, argv in lines.items():
        args = parser_of(COMMANDS[name]).parse_args(argv)
        assert not [k for k in vars(args) if k.startswith(DEST)], f"{name}: a setting's flag"
        expected = settings.load(SECTIONS[name], {**config_sections.own(name, config[name]),
                                                  **TARGETS[name][1]})
        if name == "accuracy":  # the job's threads, from the rule
            expected.threads = from_args(AccuracySettings, args).threads
        assert from_args(SECTIONS[name], args) == expected, name
    assert from_args(SweepSettings, parser_of(COMMANDS["sweep"]).parse_args(
        lines["sweep"])).small_subset == "water clusters;x"
