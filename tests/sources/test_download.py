"""The downloader against a real HTTP server on 127.0.0.1: resume, Range quirks, checksums, errors.

Also the registry and the `cfmtrain download` command line.
"""

from __future__ import annotations

import hashlib

import pytest
from helpers import FAST, leftovers, sha256

from cfmtrain.cli import main as cli_main
from cfmtrain.sources.download import DownloadError, download, sidecar_path
from cfmtrain.sources.registry import DATASETS, get_dataset

try:
    from http_server import FileServer, ServedFile
except ImportError:  # tests imported as a package
    from tests.http_server import FileServer, ServedFile

def test_normal_download_sha256_and_md5(tmp_path, payload):
    with FileServer({"a.bin": ServedFile(payload)}) as server:
        got = download(server.url("a.bin"), tmp_path / "a.bin", sha256(payload), **FAST)
        got_md5 = download(server.url("a.bin"), tmp_path / "b.bin",
                           hashlib.md5(payload).hexdigest(), algorithm="md5", **FAST)
        got_prefixed = download(server.url("a.bin"), tmp_path / "c.bin",
                                "md5:" + hashlib.md5(payload).hexdigest(), **FAST)
    assert got.read_bytes() == payload
    assert got_md5.read_bytes() == payload and got_prefixed.read_bytes() == payload
    assert leftovers(tmp_path) == ["a.bin", "b.bin", "c.bin"]
    assert [r.status for r in server.log] == [200, 200, 200]


def test_existing_verified_file_is_not_downloaded_again(tmp_path, payload):
    with FileServer({"a.bin": ServedFile(payload)}) as server:
        download(server.url("a.bin"), tmp_path / "a.bin", sha256(payload), **FAST)
        download(server.url("a.bin"), tmp_path / "a.bin", sha256(payload), **FAST)
    assert len(server.log) == 1


def test_cut_transfer_resumes_with_range(tmp_path, payload):
    cut = 100_000
    with FileServer({"a.bin": ServedFile(payload, cut_after=cut)}) as server:
        got = download(server.url("a.bin"), tmp_path / "a.bin", sha256(payload), **FAST)
    assert got.read_bytes() == payload
    assert [(r.range, r.status) for r in server.log] == [(None, 200), (f"bytes={cut}-", 206)]
    assert leftovers(tmp_path) == ["a.bin"]


def test_interrupted_run_keeps_part_and_next_run_resumes(tmp_path, payload):
    cut = 123_457
    dest = tmp_path / "a.bin"
    with FileServer({"a.bin": ServedFile(payload, cut_after=cut)}) as server:
        with pytest.raises(DownloadError, match="failed after 1 attempts") as err:
            download(server.url("a.bin"), dest, sha256(payload), **{**FAST, "retries": 0})
        assert server.url("a.bin") in str(err.value) and str(dest) in str(err.value)
        # nothing under the final name; the part and its validators wait for the next run
        assert leftovers(tmp_path) == ["a.bin.part", "a.bin.part.json"]
        assert (tmp_path / "a.bin.part").stat().st_size == cut
        download(server.url("a.bin"), dest, sha256(payload), **FAST)
    assert dest.read_bytes() == payload
    assert server.log[-1].range == f"bytes={cut}-" and server.log[-1].status == 206


def test_server_ignoring_range_restarts_from_zero(tmp_path, payload):
    dest = tmp_path / "a.bin"
    # A stale partial file whose bytes are wrong: appending to it would fail the checksum.
    (tmp_path / "a.bin.part").write_bytes(b"\0" * 5000)
    with FileServer({"a.bin": ServedFile(payload, ignore_range=True)}) as server:
        download(server.url("a.bin"), dest, sha256(payload), **FAST)
    assert dest.read_bytes() == payload
    assert [(r.range, r.status) for r in server.log] == [("bytes=5000-", 200)]


def test_complete_part_answered_416_is_accepted(tmp_path, payload):
    (tmp_path / "a.bin.part").write_bytes(payload)
    with FileServer({"a.bin": ServedFile(payload)}) as server:
        got = download(server.url("a.bin"), tmp_path / "a.bin", sha256(payload), **FAST)
    assert got.read_bytes() == payload
    assert [r.status for r in server.log] == [416]


def test_part_longer_than_file_restarts(tmp_path, payload):
    (tmp_path / "a.bin.part").write_bytes(payload + b"garbage")
    with FileServer({"a.bin": ServedFile(payload)}) as server:
        got = download(server.url("a.bin"), tmp_path / "a.bin", sha256(payload), **FAST)
    assert got.read_bytes() == payload
    assert [r.status for r in server.log] == [416, 200]


def test_transient_503_is_retried(tmp_path, payload):
    with FileServer({"a.bin": ServedFile(payload, fail_first=2)}) as server:
        got = download(server.url("a.bin"), tmp_path / "a.bin", sha256(payload), **FAST)
    assert got.read_bytes() == payload
    assert [r.status for r in server.log] == [503, 503, 200]


def test_corrupted_file_is_refused(tmp_path, payload):
    corrupted = payload[:1000] + b"X" + payload[1001:]
    dest = tmp_path / "a.bin"
    with FileServer({"a.bin": ServedFile(corrupted)}) as server:
        with pytest.raises(DownloadError, match="checksum mismatch") as err:
            download(server.url("a.bin"), dest, sha256(payload), **FAST)
    message = str(err.value)
    assert server.url("a.bin") in message and str(dest) in message
    assert sha256(payload) in message and sha256(corrupted) in message
    assert not dest.exists() and not (tmp_path / "a.bin.part").exists()
    assert leftovers(tmp_path) == ["a.bin.corrupt"]  # kept only under a non-final name


def test_404_is_a_clear_error(tmp_path):
    dest = tmp_path / "missing.bin"
    with FileServer({}) as server:
        with pytest.raises(DownloadError, match="HTTP 404") as err:
            download(server.url("missing.bin"), dest, None, **FAST)
    assert server.url("missing.bin") in str(err.value) and str(dest) in str(err.value)
    assert leftovers(tmp_path) == []
    assert len(server.log) == 1  # a 404 is not retried


def test_null_checksum_records_sha256_and_warns(tmp_path, payload):
    dest = tmp_path / "a.bin"
    with FileServer({"a.bin": ServedFile(payload)}) as server:
        with pytest.warns(UserWarning, match="no published checksum"):
            download(server.url("a.bin"), dest, None, **FAST)
        assert sidecar_path(dest).read_text() == f"{sha256(payload)}  a.bin\n"
        download(server.url("a.bin"), dest, None, **FAST)  # verified against the record
        assert len(server.log) == 1
        dest.write_bytes(payload[:-1] + b"?")  # the file changed since it was recorded
        with pytest.raises(DownloadError, match="delete it to download again"):
            download(server.url("a.bin"), dest, None, **FAST)
        dest.unlink()  # a fresh download must match the recorded sha256, too
        server.files["a.bin"] = ServedFile(b"a different file")
        with pytest.raises(DownloadError, match="checksum mismatch"):
            download(server.url("a.bin"), dest, None, **FAST)
    assert not dest.exists()


def test_registry_entries_are_complete():
    paper = {"mptrj", "hea", "water_clusters", "cuni", "tmd", "liquid_water", "al_hcl",
             "zeolite"}
    assert paper | {"mini"} <= set(DATASETS)
    for entry in DATASETS.values():
        assert entry.citation and entry.license and entry.format
        for f in entry.files:
            assert f.url.startswith("https://") and f.filename
            if f.checksum is not None:  # only published values: hex of the right length
                assert len(f.checksum) == {"md5": 32, "sha256": 64}[f.algorithm]
        if entry.source == "manual":
            assert "1." in entry.instructions
    assert get_dataset("mptrj_extxyz").files[0].checksum == "7f433171e4e5f2ef9304dccd42d5488f"
    assert get_dataset("mptrj").files[0].url == "https://figshare.com/ndownloader/files/41619375"
    assert get_dataset("mini").source == "generated"
    with pytest.raises(KeyError, match="unknown data set 'nope'.*mptrj"):
        get_dataset("nope")


def test_cli_download_url(tmp_path, payload, capsys):
    with FileServer({"a.bin": ServedFile(payload)}) as server:
        code = cli_main(["download", "--url", server.url("a.bin"), "--dest", str(tmp_path),
                         "--checksum", sha256(payload), "--no-progress"])
        assert code == 0 and (tmp_path / "a.bin").read_bytes() == payload
        code = cli_main(["download", "--url", server.url("b.bin"), "--dest", str(tmp_path),
                         "--no-progress", "--retries", "0"])
    assert code == 1 and "HTTP 404" in capsys.readouterr().err


def test_cli_manual_set(tmp_path, capsys):
    assert cli_main(["download", "cuni", "--dest", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "data.pnnl.gov" in captured.out and "cannot be downloaded automatically" in captured.err
    (tmp_path / "cuni.extxyz").write_text("")
    assert cli_main(["download", "cuni", "--dest", str(tmp_path)]) == 0
    assert cli_main(["download", "nope", "--dest", str(tmp_path)]) == 1
    assert "known data sets" in capsys.readouterr().err
