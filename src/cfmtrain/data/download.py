"""Resumable, checksum-verified downloads (stdlib urllib) and the `cfmtrain download` command.

Data stream into `<file>.part`, resume with HTTP Range, are verified, then renamed atomically:
a file under its final name is always complete and verified.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

from cfmtrain.atomic import atomic_path

CHUNK = 1 << 20
TRANSIENT_HTTP = {408, 425, 429, 500, 502, 503, 504}
TRANSIENT_ERRORS = (
    urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, OSError,
)
USER_AGENT = "cfmtrain-downloader/0.1 (+python-urllib)"


class DownloadError(RuntimeError):
    """A download that failed for good (HTTP error, checksum mismatch, retries exhausted)."""


class _Transient(Exception):
    """A failure worth retrying (connection cut, timeout, 5xx)."""


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in chunks."""
    h = _hasher(algorithm)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def sidecar_path(dest: Path) -> Path:
    """Where the recorded sha256 of `dest` lives (`<file>.sha256`, sha256sum format)."""
    return dest.with_name(dest.name + ".sha256")


def _hasher(algorithm: str):
    if algorithm not in hashlib.algorithms_guaranteed:
        raise ValueError(f"unknown checksum algorithm {algorithm!r} (use sha256 or md5)")
    return hashlib.new(algorithm)


def _read_sidecar(dest: Path) -> str | None:
    side = sidecar_path(dest)
    if not side.exists():
        return None
    return side.read_text().split()[0].lower()


def _write_sidecar(dest: Path, digest: str) -> None:
    with atomic_path(sidecar_path(dest)) as tmp:
        tmp.write_text(f"{digest}  {dest.name}\n")


def download(
    url: str,
    dest: str | os.PathLike,
    checksum: str | None = None,
    algorithm: str = "sha256",
    *,
    retries: int = 5,
    timeout: float = 60.0,
    backoff: float = 2.0,
    progress: bool = True,
) -> Path:
    """Download `url` to `dest`, resuming a `.part` file and verifying `checksum`; returns `dest`.

    With `checksum=None` the file's sha256 is recorded in `<dest>.sha256` (with a warning) and
    later downloads/checks of the same file are verified against that record.
    """
    dest = Path(dest)
    expected, algorithm = _expected_checksum(dest, checksum, algorithm)
    if dest.exists():
        _verify_existing(dest, url, expected, algorithm)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    for attempt in range(retries + 1):
        try:
            digest = _fetch(url, part, algorithm, timeout, progress)
            break
        except _Transient as err:
            if attempt == retries:
                raise DownloadError(
                    f"download of {url} -> {dest} failed after {retries + 1} attempts: {err} "
                    f"(partial data kept in {part}; rerun to resume)") from err
            time.sleep(backoff * 2**attempt)
    _accept(part, dest, url, digest, expected, algorithm, checksum is None)
    return dest


def _expected_checksum(dest: Path, checksum: str | None, algorithm: str) -> tuple[str | None, str]:
    if checksum is not None:
        if ":" in checksum:  # "md5:abc..." form
            algorithm, checksum = checksum.split(":", 1)
        _hasher(algorithm)
        return checksum.strip().lower(), algorithm
    return _read_sidecar(dest), "sha256"


def _verify_existing(dest: Path, url: str, expected: str | None, algorithm: str) -> None:
    if expected is None:
        _write_sidecar(dest, file_digest(dest, "sha256"))
        warnings.warn(f"{dest}: already present; no published checksum for {url}, recorded its "
                      f"sha256 in {sidecar_path(dest)}", stacklevel=3)
        return
    actual = file_digest(dest, algorithm)
    if actual != expected:
        raise DownloadError(
            f"{dest} exists but its {algorithm} is {actual}, expected {expected} (source {url}); "
            f"delete it to download again")


def _accept(part: Path, dest: Path, url: str, digest: str, expected: str | None,
            algorithm: str, unpublished: bool) -> None:
    """Verify the finished `.part` and rename it; a mismatch is renamed `.corrupt` and raised."""
    if expected is not None and digest != expected:
        bad = dest.with_name(dest.name + ".corrupt")
        os.replace(part, bad)
        raise DownloadError(
            f"checksum mismatch for {url} -> {dest}: {algorithm} {digest}, expected {expected}; "
            f"the data were moved to {bad} (not used)")
    os.replace(part, dest)
    if unpublished and expected is None:
        _write_sidecar(dest, digest)
        warnings.warn(f"no published checksum for {url}: recorded sha256 {digest} in "
                      f"{sidecar_path(dest)}; later checks of {dest.name} use it", stacklevel=3)


def _open(url: str, start: int, timeout: float, part: Path):
    headers = {"User-Agent": USER_AGENT}
    if start:
        headers["Range"] = f"bytes={start}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416:
            return err  # handled by the caller: the part may already be complete
        if err.code in TRANSIENT_HTTP:
            raise _Transient(f"HTTP {err.code} {err.reason}") from err
        target = part.with_name(part.name.removesuffix(".part"))
        raise DownloadError(f"HTTP {err.code} {err.reason} for {url} (-> {target})") from err
    except TRANSIENT_ERRORS as err:
        raise _Transient(f"{type(err).__name__}: {err}") from err


def _fetch(url: str, part: Path, algorithm: str, timeout: float, progress: bool) -> str:
    """One attempt: (re)start or resume `part`; returns the digest of the complete part."""
    start = part.stat().st_size if part.exists() else 0
    response = _open(url, start, timeout, part)
    with response:
        if response.status == 416:
            total = _content_range_total(response.headers.get("Content-Range", ""))
            if total is not None and total == start:
                return file_digest(part, algorithm)  # nothing left to fetch
            part.unlink()  # the part is longer than the file or unusable: start over
            raise _Transient(f"HTTP 416 with {start} bytes on disk; restarting from zero")
        if response.status == 206:
            first = _content_range_start(response.headers.get("Content-Range", ""))
            if first != start:
                part.unlink()
                raise _Transient(f"server resumed at byte {first}, not {start}; restarting")
        else:  # 200: the server ignored the Range header, so the body is the whole file
            start = 0
        hasher = _hasher(algorithm)
        if start:
            _hash_prefix(part, hasher)
        length = response.headers.get("Content-Length")
        total = start + int(length) if length is not None else None
        _stream(response, part, start, total, hasher, progress)
    return hasher.hexdigest()


def _stream(response, part: Path, start: int, total: int | None, hasher, progress: bool) -> None:
    from tqdm import tqdm

    received = start
    mode = "ab" if start else "wb"
    bar = tqdm(total=total, initial=start, unit="B", unit_scale=True, unit_divisor=1024,
               desc=part.name.removesuffix(".part"), disable=not progress, leave=False)
    with open(part, mode) as out, bar:
        while True:
            try:
                block = response.read(CHUNK)
            except http.client.IncompleteRead as err:
                block = err.partial
                out.write(block)
                raise _Transient(f"connection closed after {received + len(block)} bytes") from err
            except TRANSIENT_ERRORS as err:
                raise _Transient(f"{type(err).__name__} after {received} bytes: {err}") from err
            if not block:
                break
            out.write(block)
            hasher.update(block)
            received += len(block)
            bar.update(len(block))
    if total is not None and received != total:
        raise _Transient(f"received {received} of {total} bytes")


def _hash_prefix(part: Path, hasher) -> None:
    with open(part, "rb") as f:
        while block := f.read(CHUNK):
            hasher.update(block)


def _content_range_start(value: str) -> int | None:
    # "bytes 100-199/200"
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _content_range_total(value: str) -> int | None:
    # "bytes */200"
    try:
        return int(value.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None


# ---------------------------------------------------------------- command line

MANUAL_SUFFIXES = (".extxyz", ".xyz", ".db", ".zip")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain download`."""
    parser.add_argument("name", nargs="?", help="registered data set (see --list)")
    parser.add_argument("--dest", type=Path, help="folder to download into")
    parser.add_argument("--url", help="download an arbitrary file instead of a registered set")
    parser.add_argument("--checksum", help="expected checksum of --url ('md5:HEX' or sha256 HEX)")
    parser.add_argument("--algorithm", default="sha256", help="checksum algorithm (sha256, md5)")
    parser.add_argument("--filename", help="local name for --url (default: last URL part)")
    parser.add_argument("--retries", type=int, default=5, help="retries on transient errors")
    parser.add_argument("--list", action="store_true", help="list the registered data sets")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Download a registered data set (or one URL); manual sets print their instructions."""
    from cfmtrain.data.registry import DATASETS, get_dataset

    if args.list:
        for entry in DATASETS.values():
            print(entry.describe(), end="\n\n")
        return 0
    if args.dest is None:
        print("error: --dest DIR is required", file=sys.stderr)
        return 2
    progress = not args.no_progress
    try:
        if args.url:
            name = args.filename or args.url.rstrip("/").rsplit("/", 1)[-1]
            path = download(args.url, args.dest / name, args.checksum, args.algorithm,
                            retries=args.retries, progress=progress)
            print(f"ok: {path}")
            return 0
        if not args.name:
            print("error: give a data set NAME or --url", file=sys.stderr)
            return 2
        entry = get_dataset(args.name)
    except (DownloadError, KeyError, ValueError) as err:
        print(f"error: {err.args[0] if err.args else err}", file=sys.stderr)
        return 1
    return _run_entry(entry, args.dest, args.retries, progress)


def _run_entry(entry, dest: Path, retries: int, progress: bool) -> int:
    if entry.source == "generated":
        print(f"{entry.name}: generated, nothing to download ({entry.instructions})")
        return 0
    if entry.source == "manual":
        found = sorted(p for p in dest.glob("**/*") if p.suffix in MANUAL_SUFFIXES) \
            if dest.is_dir() else []
        if found:
            print(f"{entry.name}: manual data set, found {len(found)} file(s) in {dest}")
            return 0
        print(entry.describe())
        print(f"\nerror: {entry.name} cannot be downloaded automatically and no data files "
              f"({', '.join(MANUAL_SUFFIXES)}) were found in {dest}; follow the instructions "
              f"above", file=sys.stderr)
        return 1
    try:
        for f in entry.files:
            path = download(f.url, dest / f.filename, f.checksum, f.algorithm,
                            retries=retries, progress=progress)
            print(f"ok: {path}")
    except DownloadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if entry.instructions:
        print(entry.instructions)
    return 0
