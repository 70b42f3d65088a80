"""Running one sweep series in a subprocess with the tuned allocator, and turning its JSON lines
(or its death) into rows: ok, oom (out of memory), error, or skipped after an oom/error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cfmtrain import children
from cfmtrain.diskfull import writing
from cfmtrain.malloc_env import MALLOC_ENV


def run_series(spec: dict, labels: list[dict], timeout_s: float = 3600) -> list[dict]:
    """Rows for the batches of `spec` (one per entry of `labels`, merged into each row)."""
    if len(labels) != len(spec["batches"]):
        raise ValueError("run_series: one label per batch")
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    env = {**os.environ, **MALLOC_ENV}
    try:
        with writing(f.name), f:  # a full temporary folder names the file
            json.dump(spec, f)
        proc = children.run([sys.executable, "-m", "cfmtrain.sweep.measure", f.name],
                            capture_output=True, text=True, env=env, timeout=timeout_s)
    finally:
        Path(f.name).unlink()
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            results[record.pop("index")] = record
    failure = _failure(proc)
    rows, stopped = [], False
    for index, label in enumerate(labels):
        record = results.get(index)
        if record is None:  # the worker died before this batch: its cause, then skipped
            record = {"status": "skipped"} if stopped else failure
            stopped = True
        rows.append({**label, **record})
    return rows


def _failure(proc: subprocess.CompletedProcess) -> dict:
    """What happened to the first batch without a result line."""
    if proc.returncode in (-9, 137):  # SIGKILL: the kernel's OOM killer
        return {"status": "oom", "error": "killed (SIGKILL, likely the OOM killer)"}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    if proc.returncode == 0:
        return {"status": "skipped"}
    return {"status": "error", "error": f"exit {proc.returncode}: {tail}"}
