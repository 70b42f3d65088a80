"""No final name without a confirmed length or a matched checksum, resumes
guarded by If-Range, partial data in its own folder. Real urllib against tests/http_server.py."""

from __future__ import annotations

import json
import os

import pytest

from cfmtrain.cli import main as cli_main
from cfmtrain.sources.download import DownloadError, download, sidecar_path

try:
    from http_server import FileServer, ServedFile
except ImportError:  # tests imported as a package
    from tests.http_server import FileServer, ServedFile
from helpers import FAST, leftovers, sha256

pytestmark = pytest.mark.filterwarnings("ignore:no published checksum")
ONCE = {**FAST, "retries": 0}
CUT = 100_003


def test_cut_body_without_length_is_refused(tmp_path, payload, capsys):
    # the case: no Content-Length, the connection dropped halfway, no checksum
    served = ServedFile(payload, no_length=True, ignore_range=True, cut_after=CUT)
    with FileServer({"a.bin": served}) as server:
        code = cli_main(["download", "--url", server.url("a.bin"), "--dest", str(tmp_path),
                         "--no-progress", "--retries", "0"])
    err = capsys.readouterr().err
    assert code == 1
    assert server.url("a.bin") in err and str(tmp_path / "a.bin") in err and "no length" in err
    assert not (tmp_path / "a.bin").exists() and not sidecar_path(tmp_path / "a.bin").exists()
    assert (tmp_path / "a.bin.part").stat().st_size == CUT  # kept, never renamed


def test_no_length_and_no_ranges_needs_a_checksum(tmp_path, payload):
    dest = tmp_path / "a.bin"
    with FileServer({"a.bin": ServedFile(payload, no_length=True, ignore_range=True)}) as server:
        with pytest.raises(DownloadError, match="may be a cut transfer") as err:
            download(server.url("a.bin"), dest, None, **FAST)
        assert server.url("a.bin") in str(err.value) and str(dest) in str(err.value)
        assert not dest.exists()
        got = download(server.url("a.bin"), dest, sha256(payload), **FAST)  # checksum decides
    assert got.read_bytes() == payload


def test_no_length_cut_found_by_range_probe_then_resumed(tmp_path, payload):
    dest = tmp_path / "a.bin"
    with FileServer({"a.bin": ServedFile(payload, no_length=True, cut_after=CUT,
                                         etag='"v1"')}) as server:
        with pytest.raises(DownloadError, match="closed after 100003 bytes of a longer file"):
            download(server.url("a.bin"), dest, None, **ONCE)
        assert not dest.exists()
        download(server.url("a.bin"), dest, None, **ONCE)
    assert dest.read_bytes() == payload
    # probed (206: longer), then resumed; the resume's Content-Range gave the length
    assert [(r.range, r.if_range, r.status) for r in server.log] == [
        (None, None, 200), (f"bytes={CUT}-", '"v1"', 206), (f"bytes={CUT}-", '"v1"', 206)]
    assert sidecar_path(dest).read_text() == f"{sha256(payload)}  a.bin\n"


@pytest.mark.parametrize("cut", [None, CUT])
def test_chunked_body_complete_or_resumed_without_a_hole(tmp_path, payload, cut):
    dest = tmp_path / "a.bin"
    with FileServer({"a.bin": ServedFile(payload, chunked=True, cut_after=cut,
                                         etag='"v1"')}) as server:
        download(server.url("a.bin"), dest, None, **FAST)
    assert dest.read_bytes() == payload
    assert sidecar_path(dest).read_text() == f"{sha256(payload)}  a.bin\n"
    assert [r.status for r in server.log] == ([200] if cut is None else [200, 206])


@pytest.mark.parametrize("validator", ["etag", "last_modified"])
def test_resume_with_unchanged_validator_gets_206(tmp_path, payload, validator):
    value = '"v1"' if validator == "etag" else "Tue, 03 Nov 2026 10:00:00 GMT"
    dest = tmp_path / "a.bin"
    with FileServer({"a.bin": ServedFile(payload, cut_after=CUT, **{validator: value})}) as server:
        with pytest.raises(DownloadError, match="rerun to resume"):
            download(server.url("a.bin"), dest, None, **ONCE)
        meta = json.loads((tmp_path / "a.bin.part.json").read_text())
        assert meta[validator] == value and meta["total"] == len(payload)
        download(server.url("a.bin"), dest, None, **ONCE)
    assert [(r.range, r.if_range, r.status) for r in server.log] == [
        (None, None, 200), (f"bytes={CUT}-", value, 206)]
    assert dest.read_bytes() == payload
    assert sidecar_path(dest).read_text() == f"{sha256(payload)}  a.bin\n"
    assert leftovers(tmp_path) == ["a.bin", "a.bin.sha256"]


def test_resume_after_the_file_changed_restarts(tmp_path, payload, capsys):
    dest = tmp_path / "a.bin"
    changed = os.urandom(200_000)
    with FileServer({"a.bin": ServedFile(payload, cut_after=CUT, etag='"v1"')}) as server:
        with pytest.raises(DownloadError):
            download(server.url("a.bin"), dest, None, **ONCE)
        server.files["a.bin"] = ServedFile(changed, etag='"v2"')
        download(server.url("a.bin"), dest, None, **ONCE)
    assert dest.read_bytes() == changed  # the new version, not a splice of both
    assert sidecar_path(dest).read_text() == f"{sha256(changed)}  a.bin\n"
    assert server.log[-1].if_range == '"v1"' and server.log[-1].status == 200
    assert "restarting from zero" in capsys.readouterr().err


def test_part_without_validator_and_checksum_restarts(tmp_path, payload, capsys):
    # the server names no version: a resume could splice two of them, so it starts over
    dest = tmp_path / "a.bin"
    changed = os.urandom(200_000)
    with FileServer({"a.bin": ServedFile(payload, cut_after=CUT)}) as server:
        with pytest.raises(DownloadError):
            download(server.url("a.bin"), dest, None, **ONCE)
        server.files["a.bin"] = ServedFile(changed)
        download(server.url("a.bin"), dest, None, **ONCE)
    assert dest.read_bytes() == changed
    assert [(r.range, r.status) for r in server.log] == [(None, 200), (None, 200)]
    assert "no ETag or Last-Modified" in capsys.readouterr().err


def test_206_from_the_wrong_byte_is_refused(tmp_path, payload):
    dest = tmp_path / "a.bin"
    with FileServer({"a.bin": ServedFile(payload, cut_after=CUT, etag='"v1"',
                                         wrong_start=True)}) as server:
        download(server.url("a.bin"), dest, None, **FAST)
    assert dest.read_bytes() == payload  # the misplaced bytes were not appended
    assert [(r.range, r.status) for r in server.log] == [
        (None, 200), (f"bytes={CUT}-", 206), (None, 200)]


def test_partial_data_live_in_the_partial_folder(tmp_path, payload):
    dest, partial = tmp_path / "out" / "a.bin", tmp_path / ".partial" / "out"
    with FileServer({"a.bin": ServedFile(payload, cut_after=CUT, etag='"v1"')}) as server:
        with pytest.raises(DownloadError, match=str(partial / "a.bin.part")):
            download(server.url("a.bin"), dest, None, partial_dir=partial, **ONCE)
        assert leftovers(dest.parent) == []
        assert leftovers(partial) == ["a.bin.part", "a.bin.part.json"]
        code = cli_main(["download", "--url", server.url("a.bin"), "--dest", str(dest.parent),
                         "--partial-dir", str(partial), "--no-progress", "--retries", "0"])
    assert code == 0 and dest.read_bytes() == payload
    assert server.log[-1].status == 206
    assert leftovers(dest.parent) == ["a.bin", "a.bin.sha256"]
    assert not partial.exists()  # emptied and removed


def test_present_file_without_record_is_not_recorded(tmp_path, payload):
    dest = tmp_path / "a.bin"
    dest.write_bytes(payload[:CUT])  # could be a cut transfer: its sha256 is no reference
    with pytest.warns(UserWarning, match="not verified"):
        download("http://127.0.0.1:9/a.bin", dest, None, **ONCE)
    assert not sidecar_path(dest).exists()


def test_no_length_end_confirmed_by_416(tmp_path, payload):
    dest = tmp_path / "a.bin"
    with FileServer({"a.bin": ServedFile(payload, no_length=True, etag='"v1"')}) as server:
        download(server.url("a.bin"), dest, None, **ONCE)
    assert dest.read_bytes() == payload
    assert [(r.range, r.status) for r in server.log] == [
        (None, 200), (f"bytes={len(payload)}-", 416)]


def test_registry_publishes_the_checksums_it_can():
    from cfmtrain.sources.registry import get_dataset

    mptrj = get_dataset("mptrj").files[0]  # figshare's computed MD5 of file 41619375
    assert (mptrj.algorithm, mptrj.checksum) == ("md5", "50ead5f27f9a4f6beb7564c4188f1e9f")
    assert get_dataset("water_clusters").files[0].checksum is None  # none found: length only
    assert "confirmed length" in get_dataset("water_clusters").describe()
