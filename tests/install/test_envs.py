"""The conda environment for cluster users lists exactly pyproject's dependencies, and its
post-deploy script installs cfmtrain; every rule runs in it; `make test` honours
CFMTRAIN_SKIP_SLURM."""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from helpers import REPO


def test_conda_env_matches_pyproject():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "envs" / "cfmtrain.yaml").read_text())
    pip_lists = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert len(pip_lists) == 1
    assert sorted(pip_lists[0]) == sorted(deps)


# --- conda deployment: Snakemake runs envs/cfmtrain.post-deploy.sh in each new environment ---

POST_DEPLOY = REPO / "envs" / "cfmtrain.post-deploy.sh"


def _fake_clone(path: Path) -> Path:
    """A folder that looks like a cfmtrain checkout to the post-deploy script."""
    path.mkdir(parents=True)
    (path / "Snakefile").write_text("# workflow\n")
    (path / "pyproject.toml").write_text('[project]\nname = "cfmtrain"\n')
    return path


def _post_deploy(script: Path, cwd: Path, tmp_path: Path, **env: str):
    """Run the script as Snakemake does (`<shebang interpreter> <file>`), with a `pip` that
    records its arguments; returns (result, recorded pip arguments or None)."""
    bin_dir, record = tmp_path / "bin", tmp_path / "pip-args"
    bin_dir.mkdir(exist_ok=True)
    pip = bin_dir / "pip"
    pip.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{record}"\n')
    pip.chmod(0o755)
    record.unlink(missing_ok=True)
    interpreter = script.read_text().splitlines()[0][2:].split()
    result = subprocess.run([*interpreter, str(script)], cwd=cwd, capture_output=True, text=True,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env}, timeout=60)
    return result, (record.read_text().splitlines() if record.exists() else None)


@pytest.fixture(scope="module")
def workflow():
    """The parsed workflow (Snakemake's API, default config)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, ResourceSettings

    with SnakemakeApi() as api:
        yield api.workflow(resource_settings=ResourceSettings(cores=1),
                           config_settings=ConfigSettings(), snakefile=REPO / "Snakefile",
                           workdir=REPO)._workflow


def test_post_deploy_script_is_valid_bash_next_to_the_env_file(workflow, tmp_path):
    assert subprocess.run(["bash", "-n", str(POST_DEPLOY)]).returncode == 0
    from snakemake.deployment.conda import Env

    # Snakemake's own look-up of the script that belongs to the env file
    env = Env(workflow, env_file=str(REPO / "envs" / "cfmtrain.yaml"), envs_dir=str(tmp_path))
    assert Path(env.post_deploy_file.get_path_or_uri(secret_free=True)) == POST_DEPLOY


def test_post_deploy_installs_the_repository_of_the_script(tmp_path):
    result, args = _post_deploy(POST_DEPLOY, tmp_path, tmp_path)
    assert result.returncode == 0, result.stderr
    assert args == ["install", "--no-build-isolation", "-e", str(REPO)]


def test_post_deploy_copy_finds_the_working_directory_clone(tmp_path):
    clone = _fake_clone(tmp_path / "clone")
    # Snakemake's copy: <workdir>/.snakemake/conda/<hash>.post-deploy.sh, run from <workdir>
    copy = clone / ".snakemake" / "conda" / "0123abcd.post-deploy.sh"
    copy.parent.mkdir(parents=True)
    shutil.copy(POST_DEPLOY, copy)
    result, args = _post_deploy(copy, clone, tmp_path)
    assert result.returncode == 0, result.stderr
    assert args == ["install", "--no-build-isolation", "-e", str(clone.resolve())]
    # --conda-prefix elsewhere: the copy is outside the clone; the working directory decides
    prefix = tmp_path / "prefix" / "0123abcd.post-deploy.sh"
    prefix.parent.mkdir()
    shutil.copy(POST_DEPLOY, prefix)
    (clone / "workflow").mkdir()
    result, args = _post_deploy(prefix, clone / "workflow", tmp_path)
    assert result.returncode == 0, result.stderr
    assert args[-1] == str(clone.resolve())
    # CFMTRAIN_ROOT overrides both
    result, args = _post_deploy(POST_DEPLOY, tmp_path, tmp_path, CFMTRAIN_ROOT=str(clone))
    assert result.returncode == 0 and args[-1] == str(clone.resolve())


def test_post_deploy_without_a_repository_is_a_clear_error(tmp_path):
    script = tmp_path / "prefix" / "0123abcd.post-deploy.sh"
    script.parent.mkdir()
    shutil.copy(POST_DEPLOY, script)
    (tmp_path / "elsewhere").mkdir()
    result, args = _post_deploy(script, tmp_path / "elsewhere", tmp_path)
    assert result.returncode == 1 and args is None
    assert "no cfmtrain repository" in result.stderr and "CFMTRAIN_ROOT" in result.stderr
    result, args = _post_deploy(POST_DEPLOY, tmp_path, tmp_path,
                                CFMTRAIN_ROOT=str(tmp_path / "elsewhere"))
    assert result.returncode == 1 and args is None
    assert "is not a cfmtrain repository" in result.stderr


def test_every_rule_that_runs_cfmtrain_declares_the_env(workflow):
    rules = list(workflow.rules)
    commands = [r for r in rules if r.shellcmd]
    assert len(commands) >= 15 and {"frames", "train_cell", "bench_kernels"} <= {
        r.name for r in commands}
    for rule in commands:
        assert rule.conda_env, f"rule {rule.name} has no conda: environment"
        env = (Path(rule.snakefile).parent / rule.conda_env).resolve()
        assert env == REPO / "envs" / "cfmtrain.yaml", (rule.name, env)
    # the rest are targets: inputs only, nothing to run
    assert all(r.norun for r in rules if r not in commands)


# --- `make test`: CFMTRAIN_SKIP_SLURM=1 skips the Slurm install (which needs root) ---

def _make_test(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    """`make test` on a copy of the Makefile whose scripts and tools only log their call; the
    Slurm installer fails as it does without root."""
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    log = tmp_path / "calls.log"
    stubs = {"scripts/setup.sh": "echo setup", "scripts/slurm/install.sh": "echo slurm; exit 1",
             ".venv/bin/ruff": "echo ruff", ".venv/bin/lint-imports": "echo lint-imports",
             "scripts/check_workflow.sh": "echo check_workflow",
             ".venv/bin/cfmtrain": 'echo "cfmtrain $*"', ".venv/bin/mkdocs": 'echo "mkdocs $*"',
             ".venv/bin/python": 'echo "python $*"'}
    for rel, body in stubs.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n{body.replace('echo', 'echo >>' + str(log), 1)}\n")
        path.chmod(0o755)
    result = subprocess.run(["make", "test"], cwd=tmp_path, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", **env}, timeout=60)
    return result, log.read_text() if log.exists() else ""


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_test_skips_the_slurm_install_only_when_asked(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    result, calls = _make_test(tmp_path / "a", CFMTRAIN_SKIP_SLURM="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls.split("\n") == ["setup", "ruff", "lint-imports", "check_workflow",
                                  "cfmtrain docs --check", "mkdocs build --strict --quiet",
                                  "python -m pytest -q --durations=25", ""]
    result, calls = _make_test(tmp_path / "b")
    assert result.returncode != 0 and calls.split("\n") == ["setup", "slurm", ""]
    result, calls = _make_test(tmp_path / "c", CFMTRAIN_SKIP_SLURM="0")
    assert result.returncode != 0 and "slurm" in calls


# --- scripts/setup.sh: a .venv set up from the same inputs is kept (no pip) ---

def _setup_copy(tmp_path: Path) -> Path:
    """The set-up's inputs copied to tmp_path, with a .venv whose python is this one (which
    imports cfmtrain and its compiled ops) and no pip: any pip call fails."""
    for rel in ("scripts/setup.sh", "scripts/setup_inputs.sh", "pyproject.toml", "setup.py",
                "envs/torch-constraints.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    shutil.copytree(REPO / "kernels", tmp_path / "kernels",
                    ignore=shutil.ignore_patterns("__pycache__"))
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this venv's python
    python.chmod(0o755)
    return tmp_path


def _inputs(copy: Path, **env: str) -> str:
    return subprocess.run(["bash", "scripts/setup_inputs.sh", ".venv/bin/python"], cwd=copy,
                          capture_output=True, text=True, check=True,
                          env={**os.environ, **env}).stdout.strip()


def test_setup_inputs_hash_changes_with_each_input(tmp_path):
    copy = _setup_copy(tmp_path)
    first = _inputs(copy)
    assert len(first) == 40 and _inputs(copy) == first
    assert _inputs(copy, CFMTRAIN_CPU_ARCH="generic") != first
    source = next((copy / "kernels").rglob("*.cpp"))
    source.write_text(source.read_text() + "\n// changed\n")
    assert _inputs(copy) != first


@pytest.mark.slow
def test_setup_skips_pip_only_for_the_same_inputs(tmp_path):
    copy = _setup_copy(tmp_path)
    stamp = copy / ".venv" / ".cfmtrain-setup"
    stamp.write_text(_inputs(copy) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "CFMTRAIN_CPU_ARCH"}
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=copy, capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "set-up up to date" in done.stdout and stamp.exists()
    (copy / "setup.py").write_text((copy / "setup.py").read_text() + "\n# changed\n")
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=copy, capture_output=True,
                          text=True, env=env, timeout=120)
    # the inputs changed: it runs pip (absent here, so it fails) and drops the stale stamp
    assert done.returncode != 0 and ".venv/bin/pip" in done.stderr
    assert not stamp.exists()
