"""Training and benchmark commands run with the tuned glibc allocator settings: the real CLI,
started with a clean environment, re-executes itself with them and glibc honours them.

Observed from inside each process: a `sitecustomize` on PYTHONPATH (imported by every Python
start, the re-executed one included) records the pid, the settings and whether a 64 MiB malloc
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


@pytest.mark.parametrize("argv", [["bench", "graphs", "--help"], ["train", "--help"]])
def test_heavy_commands_restart_with_the_allocator_settings(tmp_path, argv):
    first, second = run_cli(tmp_path, *argv)  # exactly two starts: the CLI, then its re-exec
    assert first["pid"] == second["pid"], "re-executed in place (execve), not a child process"
    assert first["env"] == dict.fromkeys(MALLOC_ENV) and not first["heap"]
    assert second["env"] == MALLOC_ENV
    assert second["heap"], "glibc still served a 64 MiB malloc by mmap: settings not applied"
    assert second["cmdline"][-len(argv):] == argv and second["cmdline"][1:3] == ["-m", "cfmtrain"]


def test_light_commands_and_a_tuned_environment_do_not_restart(tmp_path):
    (start,) = run_cli(tmp_path, "generate", "--help")
    assert start["env"] == dict.fromkeys(MALLOC_ENV) and not start["heap"]
    (start,) = run_cli(tmp_path, "bench", "graphs", "--help", **MALLOC_ENV)
    assert start["env"] == MALLOC_ENV and start["heap"]
