"""A failed `download` job's partial data survive Snakemake's cleanup of its
output folder, and the rerun resumes them. A real `snakemake` run of the workflow's rule, whose
`cfmtrain download` fetches a registry entry (added by a sitecustomize) from a local server."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers import REPO

try:
    from http_server import FileServer, ServedFile
except ImportError:  # tests imported as a package
    from tests.http_server import FileServer, ServedFile

pytestmark = pytest.mark.workflow  # runs Snakemake

CUT = 150_001

# registers the entry `remote_test` (URL from the environment) in each Python the run starts
SITECUSTOMIZE = textwrap.dedent('''\
    import os

    if os.environ.get("CFMTRAIN_TEST_URL"):
        from cfmtrain.sources.registry import DatasetEntry, SourceFile, _register

        _register(DatasetEntry(
            name="remote_test", paper_name="test", citation="test", doi=None, license="test",
            source="download", format="extxyz", converter="ase",
            files=(SourceFile(url=os.environ["CFMTRAIN_TEST_URL"], filename="frames.extxyz"),),
        ))
''')


def snakemake(workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
         "--directory", str(workdir), "--cores", "1", "results/downloads/remote"],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["datasets"]["remote"] = {"kind": "download", "registry": "remote_test", "shards": 1}
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "site").mkdir()
    (tmp_path / "site/sitecustomize.py").write_text(SITECUSTOMIZE)
    return tmp_path


def test_partial_download_survives_a_failed_job_and_the_rerun_resumes(workdir):
    payload = os.urandom(400_000)
    # the first request is cut after CUT bytes, and every later one fails with 403 (not retried)
    served = ServedFile(payload, cut_after=CUT, etag='"v1"', later_status=403)
    with FileServer({"frames.extxyz": served}) as server:
        env = {**os.environ, "CFMTRAIN_TEST_URL": server.url("frames.extxyz"),
               "PYTHONPATH": os.pathsep.join(
                   [str(workdir / "site"), *filter(None, [os.environ.get("PYTHONPATH")])]),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        first = snakemake(workdir, env)
        log = (workdir / "logs/download/remote.log").read_text()
        assert first.returncode != 0, first.stdout + first.stderr
        assert "HTTP 403" in log and "rerun to resume" in log, log
        assert not (workdir / "results/downloads/remote").exists()  # removed by Snakemake
        partial = workdir / "results/downloads/.partial/remote"
        assert sorted(p.name for p in partial.iterdir()) == [
            "frames.extxyz.part", "frames.extxyz.part.json"]
        assert (partial / "frames.extxyz.part").stat().st_size == CUT

        served.later_status = None  # the server is back
        second = snakemake(workdir, env)
        assert second.returncode == 0, second.stdout + second.stderr
    final = workdir / "results/downloads/remote/frames.extxyz"
    assert final.read_bytes() == payload
    assert [(r.range, r.if_range, r.status) for r in server.log] == [
        (None, None, 200), (f"bytes={CUT}-", '"v1"', 403), (f"bytes={CUT}-", '"v1"', 206)]
    assert (final.parent / "frames.extxyz.sha256").read_text().split()[0] == \
        hashlib.sha256(payload).hexdigest()
    assert not partial.exists()
