"""Resumable, verified downloads (stdlib urllib) and the `cfmtrain download` command.

Data stream into `<file>.part` in a partial folder (beside the file by default; the workflow keeps
it outside the rule's output so that a failed job's cleanup leaves it), with the server's ETag,
Last-Modified and total length in `<file>.part.json`. A resume sends `Range` with `If-Range`: a
200 answer (the file changed) restarts from zero, a 206 that does not start at the part's end is
refused. A file gets its final name (atomic rename) only when its complete length is known and
matched (Content-Length, Content-Range total, the end of a chunked body, or a 416 answer for the
byte after it) or when a published checksum matched; anything else stays a `.part`.
"""

from __future__ import annotations

import argparse
import email.message
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

from cfmtrain.atomic import atomic_path
from cfmtrain.digest import CHUNK, file_digest, new_hasher
from cfmtrain.frames.formats import FORMATS, is_known
from cfmtrain.sources.registry import DATASETS, get_dataset

TRANSIENT_HTTP = {408, 425, 429, 500, 502, 503, 504}
TRANSIENT_ERRORS = (
    urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, OSError,
)
USER_AGENT = "cfmtrain-downloader/0.1 (+python-urllib)"


class DownloadError(RuntimeError):
    """A download that failed for good (HTTP error, checksum mismatch, retries exhausted)."""


class _Transient(Exception):
    """A failure worth retrying (connection cut, timeout, 5xx)."""


def sidecar_path(dest: Path) -> Path:
    """Where the recorded sha256 of `dest` lives (`<file>.sha256`, sha256sum format)."""
    return dest.with_name(dest.name + ".sha256")


def _read_sidecar(dest: Path) -> str | None:
    side = sidecar_path(dest)
    if not side.exists():
        return None
    return side.read_text().split()[0].lower()


def _write_sidecar(dest: Path, digest: str) -> None:
    with atomic_path(sidecar_path(dest)) as tmp:
        tmp.write_text(f"{digest}  {dest.name}\n")


def _note(message: str) -> None:
    print(f"download: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class _Job:
    """One file being fetched: where from, where to, and how it is checked."""

    url: str
    dest: Path
    part: Path
    algorithm: str
    checksum_known: bool
    timeout: float
    progress: bool

    @property
    def meta(self) -> Path:
        """`<file>.part.json`: the URL, validators and total length of the first response."""
        return self.part.with_name(self.part.name + ".json")

    def where(self) -> str:
        """`URL -> file`, for messages."""
        return f"{self.url} -> {self.dest}"


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
    partial_dir: str | os.PathLike | None = None,
) -> Path:
    """Download `url` to `dest`, resuming `<partial_dir>/<name>.part`, verified; returns `dest`.

    `partial_dir` defaults to `dest`'s folder. With `checksum=None` the file is accepted only if
    its complete length was confirmed; its sha256 is then recorded in `<dest>.sha256` (with a
    warning) and later downloads/checks of the same file are verified against that record.
    """
    dest = Path(dest)
    expected, algorithm = _expected_checksum(dest, checksum, algorithm)
    if dest.exists():
        _verify_existing(dest, url, expected, algorithm)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(partial_dir) if partial_dir is not None else dest.parent
    folder.mkdir(parents=True, exist_ok=True)
    job = _Job(url, dest, folder / (dest.name + ".part"), algorithm, expected is not None,
               timeout, progress)
    for attempt in range(retries + 1):
        try:
            digest, confirmed = _fetch(job)
            break
        except DownloadError as err:  # an HTTP error that is not worth retrying
            raise DownloadError(f"{err} ({_kept(job)})") from err
        except _Transient as err:
            if attempt == retries:
                raise DownloadError(f"download of {job.where()} failed after {retries + 1} "
                                    f"attempts: {err} ({_kept(job)})") from err
            time.sleep(backoff * 2**attempt)
    if not confirmed and expected is None:
        raise DownloadError(
            f"download of {job.where()}: the server sent no length (no Content-Length, no chunked "
            f"framing, no answer to a Range request past the end), so the "
            f"{job.part.stat().st_size} bytes received may be a cut transfer; with no published "
            f"checksum they are not accepted (kept in {job.part}); a known checksum (--checksum "
            f"with --url) would decide")
    _accept(job, digest, expected, checksum is None)
    if folder != dest.parent:
        try:
            folder.rmdir()  # only if empty
        except OSError:
            pass
    return dest


def _kept(job: _Job) -> str:
    """Where the partial data are, for error messages."""
    if job.part.exists():
        return f"partial data kept in {job.part}; rerun to resume"
    return "no partial data kept"


def _expected_checksum(dest: Path, checksum: str | None, algorithm: str) -> tuple[str | None, str]:
    if checksum is not None:
        if ":" in checksum:  # "md5:abc..." form
            algorithm, checksum = checksum.split(":", 1)
        new_hasher(algorithm)
        return checksum.strip().lower(), algorithm
    return _read_sidecar(dest), "sha256"


def _verify_existing(dest: Path, url: str, expected: str | None, algorithm: str) -> None:
    if expected is None:  # not recorded: its length was never confirmed by us, so record nothing
        warnings.warn(f"{dest}: already present but not verified (no published checksum for "
                      f"{url} and no {sidecar_path(dest).name} from a verified download); "
                      f"delete it to download it again, verified", stacklevel=3)
        return
    actual = file_digest(dest, algorithm)
    if actual != expected:
        raise DownloadError(
            f"{dest} exists but its {algorithm} is {actual}, expected {expected} (source {url}); "
            f"delete it to download again")


def _accept(job: _Job, digest: str, expected: str | None, unpublished: bool) -> None:
    """Verify the finished `.part` and rename it; a mismatch is renamed `.corrupt` and raised."""
    job.meta.unlink(missing_ok=True)
    if expected is not None and digest != expected:
        bad = job.part.with_name(job.dest.name + ".corrupt")
        os.replace(job.part, bad)
        raise DownloadError(
            f"checksum mismatch for {job.where()}: {job.algorithm} {digest}, expected "
            f"{expected}; the data were moved to {bad} (not used)")
    os.replace(job.part, job.dest)
    if unpublished and expected is None:
        _write_sidecar(job.dest, digest)
        warnings.warn(f"no published checksum for {job.url}: recorded sha256 {digest} of the "
                      f"length-verified download in {sidecar_path(job.dest)}; later checks of "
                      f"{job.dest.name} use it", stacklevel=3)


def _load_meta(job: _Job) -> dict:
    try:
        return json.loads(job.meta.read_text())
    except (OSError, ValueError):
        return {}


def _save_meta(job: _Job, headers: email.message.Message, total: int | None) -> None:
    etag = headers.get("ETag")
    meta = {"url": job.url, "etag": etag, "last_modified": headers.get("Last-Modified"),
            "total": total}
    with atomic_path(job.meta) as tmp:
        tmp.write_text(json.dumps(meta) + "\n")


def _validator(meta: dict) -> str | None:
    """What `If-Range` may carry: a strong ETag, else Last-Modified (weak ETags may not)."""
    etag = meta.get("etag")
    if etag and not etag.startswith("W/"):
        return etag
    return meta.get("last_modified") or None


def _discard(job: _Job, reason: str) -> None:
    _note(f"{job.where()}: {reason}; restarting from zero")
    job.part.unlink(missing_ok=True)
    job.meta.unlink(missing_ok=True)


def _resume_point(job: _Job) -> tuple[int, str | None]:
    """(bytes already in the part, If-Range validator); 0 when the part cannot be trusted."""
    size = job.part.stat().st_size if job.part.exists() else 0
    if not size:
        job.meta.unlink(missing_ok=True)
        return 0, None
    meta = _load_meta(job)
    if meta and meta.get("url") != job.url:
        _discard(job, f"{job.part} holds data of {meta.get('url')}")
        return 0, None
    validator = _validator(meta)
    if validator is None and not job.checksum_known:
        _discard(job, f"no ETag or Last-Modified was saved with {job.part}, so a resume could not "
                      f"tell whether the file changed on the server (and no checksum would)")
        return 0, None
    return size, validator


def _open(job: _Job, start: int, validator: str | None):
    headers = {"User-Agent": USER_AGENT}
    if start:
        headers["Range"] = f"bytes={start}-"
        if validator:
            headers["If-Range"] = validator
    request = urllib.request.Request(job.url, headers=headers)
    try:
        return urllib.request.urlopen(request, timeout=job.timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416:
            return err  # handled by the caller: the part may already be complete
        if err.code in TRANSIENT_HTTP:
            raise _Transient(f"HTTP {err.code} {err.reason}") from err
        raise DownloadError(f"HTTP {err.code} {err.reason} for {job.where()}") from err
    except TRANSIENT_ERRORS as err:
        raise _Transient(f"{type(err).__name__}: {err}") from err


def _fetch(job: _Job) -> tuple[str, bool]:
    """One attempt: start, resume or restart the part; (its digest, complete length confirmed)."""
    start, validator = _resume_point(job)
    response = _open(job, start, validator)
    with response:
        headers = response.headers
        saved = _load_meta(job).get("total") if start else None
        if response.status == 416:
            total = _content_range_total(headers.get("Content-Range", ""))
            if start and total == start and saved in (None, total):
                return file_digest(job.part, job.algorithm), True  # nothing left to fetch
            _discard(job, f"HTTP 416 with {start} bytes in {job.part} (file length {total})")
            raise _Transient(f"HTTP 416 with {start} bytes on disk")
        length = headers.get("Content-Length")
        if response.status == 206:
            first = _content_range_start(headers.get("Content-Range", ""))
            total = _content_range_total(headers.get("Content-Range", ""))
            if first != start:
                _discard(job, f"refused a 206 answer starting at byte {first}, not at the "
                              f"{start} bytes of {job.part}")
                raise _Transient(f"server resumed at byte {first}, not {start}")
            if saved is not None and total is not None and total != saved:
                _discard(job, f"the file's length changed from {saved} to {total} bytes")
                raise _Transient(f"file length changed from {saved} to {total} bytes")
            if total is None and length is not None:
                total = start + int(length)
        else:  # 200: the file changed since the part was begun (If-Range) or Range is ignored
            if start:
                _note(f"{job.where()}: the server answered the resume with the whole file (it "
                      f"changed since {job.part} was begun, or ranges are not supported); "
                      f"restarting from zero")
            start = 0
            total = int(length) if length is not None else None
            _save_meta(job, headers, total)
        hasher = new_hasher(job.algorithm)
        if start:
            _hash_prefix(job.part, hasher)
        received = _stream(response, job, start, total, hasher)
        confirmed = total is not None or bool(getattr(response, "chunked", False))
    return hasher.hexdigest(), confirmed or _probe_end(job, received)


def _probe_end(job: _Job, size: int) -> bool:
    """After a body without length: does the server confirm that `size` bytes is the whole file?

    Asks for the bytes after `size`: a 416 naming `size` as the length confirms; a 206 means the
    transfer was cut (resumed by the next attempt); anything else cannot tell.
    """
    response = _open(job, size, _validator(_load_meta(job)))
    with response:
        if response.status == 416:
            return _content_range_total(response.headers.get("Content-Range", "")) == size
        if response.status == 206 and _content_range_start(
                response.headers.get("Content-Range", "")) == size:
            raise _Transient(f"the server sent no length and closed after {size} bytes of a "
                             f"longer file")
    return False


def _stream(response, job: _Job, start: int, total: int | None, hasher) -> int:
    """Append the body to the part; returns the part's size. Raises `_Transient` if cut short."""
    from tqdm import tqdm

    received = start
    mode = "ab" if start else "wb"
    bar = tqdm(total=total, initial=start, unit="B", unit_scale=True, unit_divisor=1024,
               desc=job.dest.name, disable=not job.progress, leave=False)
    # read1: at most one chunk of a chunked body a call; a cut one raises IncompleteRead before
    # any byte of that call is returned, so what was written is always a true prefix
    read = getattr(response, "read1", response.read)
    with open(job.part, mode) as out, bar:
        while True:
            try:
                block = read(CHUNK)
            except http.client.IncompleteRead as err:  # a cut chunked body
                raise _Transient(f"connection closed after {received} bytes") from err
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
    return received


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
    # "bytes */200"; "bytes 0-99/*" has no total
    try:
        return int(value.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None


# ---------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `cfmtrain download`."""
    parser.add_argument("name", nargs="?", help="registered data set (see --list)")
    parser.add_argument("--dest", type=Path, help="folder to download into")
    parser.add_argument("--partial-dir", type=Path,
                        help="folder for the partial data (<file>.part, <file>.part.json) of an "
                             "unfinished download, resumed by the next run (default: --dest)")
    parser.add_argument("--url", help="download an arbitrary file instead of a registered set")
    parser.add_argument("--checksum", help="expected checksum of --url ('md5:HEX' or sha256 HEX)")
    parser.add_argument("--algorithm", default="sha256", help="checksum algorithm (sha256, md5)")
    parser.add_argument("--filename", help="local name for --url (default: last URL part)")
    parser.add_argument("--retries", type=int, default=5, help="retries on transient errors")
    parser.add_argument("--list", action="store_true", help="list the registered data sets")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Download a registered data set (or one URL); manual sets print their instructions."""
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
                            retries=args.retries, progress=progress, partial_dir=args.partial_dir)
            print(f"ok: {path}")
            return 0
        if not args.name:
            print("error: give a data set NAME or --url", file=sys.stderr)
            return 2
        entry = get_dataset(args.name)
    except (DownloadError, KeyError, ValueError) as err:
        print(f"error: {err.args[0] if err.args else err}", file=sys.stderr)
        return 1
    return _run_entry(entry, args.dest, args.retries, progress, args.partial_dir)


def _run_entry(entry, dest: Path, retries: int, progress: bool,
               partial_dir: Path | None = None) -> int:
    if entry.source == "generated":
        print(f"{entry.name}: generated, nothing to download ({entry.instructions})")
        return 0
    if entry.source == "manual":
        found = sorted(p for p in dest.glob("**/*") if p.is_file() and is_known(p)) \
            if dest.is_dir() else []
        if found:
            print(f"{entry.name}: manual data set, found {len(found)} file(s) in {dest}")
            return 0
        print(entry.describe())
        print(f"\nerror: {entry.name} cannot be downloaded automatically and no data files "
              f"({', '.join(FORMATS)}) were found in {dest}; follow the instructions "
              f"above", file=sys.stderr)
        return 1
    try:
        for f in entry.files:
            path = download(f.url, dest / f.filename, f.checksum, f.algorithm,
                            retries=retries, progress=progress, partial_dir=partial_dir)
            print(f"ok: {path}")
    except DownloadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if entry.instructions:
        print(entry.instructions)
    return 0
