"""Training and benchmark commands run with the tuned glibc allocator settings: the real CLI,
started with a clean environment, runs each command in a supervised child process (for the
cause of a crash, cfmtrain.crash) that has them for heavy commands, and glibc honours them.

Observed from inside each process: a `sitecustomize` on PYTHONPATH (imported by every Python
start, the child included) records the pid, the settings and whether a 64 MiB malloc
came from the brk heap (MALLOC_MMAP_MAX_=0) rather than from mmap (glibc's default).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cfmtrain.malloc_env import MALLOC_ENV

HOOK = '''
import ctypes, json, os

def _in_heap(address):
    for line in open("/proc/self/maps"):
        fields = line.split()
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= address < high:
            return fields[-1] == "[heap]"
    return False

_libc = ctypes.CDLL(None)
_libc.malloc.restype, _libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]
_block = _libc.malloc(64 << 20)
_record = {
    "pid": os.getpid(),
    "cmdline": open("/proc/self/cmdline").read().split("\\0")[:-1],
    "env": {k: os.environ.get(k) for k in KEYS},
    "heap": _in_heap(_block),
}
_libc.free(_block)
with open(LOG, "a") as _f:
    _f.write(json.dumps(_record) + "\\n")
'''


def run_cli(tmp_path: Path, *argv: str, **extra_env: str) -> list[dict]:
    """Run `python -m cfmtrain argv` with only PATH, HOME and the hook in its environment;
    returns one record per Python start in that process tree."""
    hook_dir, log = tmp_path / "hook", tmp_path / "starts.jsonl"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(
        f"KEYS = {sorted(MALLOC_ENV)!r}\nLOG = {str(log)!r}\n{HOOK}")
    log.unlink(missing_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(hook_dir),
           **extra_env}
    done = subprocess.run([sys.executable, "-m", "cfmtrain", *argv], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "usage: cfmtrain" in done.stdout
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["bench", "graphs", "--help"], ["train", "--help"]])
def test_heavy_commands_run_with_the_allocator_settings(tmp_path, argv):
    supervisor, child = run_cli(tmp_path, *argv)  # exactly two starts: the CLI, its child
    assert supervisor["pid"] != child["pid"], "the command runs in a supervised child"
    assert supervisor["env"] == dict.fromkeys(MALLOC_ENV) and not supervisor["heap"]
    assert child["env"] == MALLOC_ENV
    assert child["heap"], "glibc still served a 64 MiB malloc by mmap: settings not applied"
    assert child["cmdline"][-len(argv):] == argv and child["cmdline"][1:3] == ["-m", "cfmtrain"]


@pytest.mark.slow
def test_light_commands_keep_the_environment_and_heavy_ones_start_once(tmp_path):
    starts = run_cli(tmp_path, "generate", "--help")
    assert len(starts) == 2
    assert all(s["env"] == dict.fromkeys(MALLOC_ENV) and not s["heap"] for s in starts)
    starts = run_cli(tmp_path, "bench", "graphs", "--help", **MALLOC_ENV)
    assert len(starts) == 2, "a tuned environment is not re-executed once more"
    assert all(s["env"] == MALLOC_ENV and s["heap"] for s in starts)
