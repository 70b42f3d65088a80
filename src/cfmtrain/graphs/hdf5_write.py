"""An HDF5 file written so that a failed write (a full disk, a quota, `ulimit -f`) is raised as its
OSError, naming the file, instead of being lost.

HDF5 writes a dataset's cached chunks when the dataset's handle is released, and h5py releases
handles in deallocators, which cannot raise: a failed write there is printed as a traceback on
file descriptor 2 and the writer goes on, and may even publish a truncated file. So while the
file is open, descriptor 2 goes through a pipe whose reader forwards everything else as it comes
(progress bars included) and keeps h5py's deallocator tracebacks, and the errno they name is
raised when the file is closed.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

import h5py

DEALLOC = "h5py/_objects.pyx"  # h5py's deallocators, as their tracebacks name them
ERRNO = re.compile(r"errno = (\d+)")


MARKERS = ("Traceback (most recent call last):", "Exception ignored in: 'h5py._objects")


class _Filter:
    """Reads descriptor 2's pipe and forwards it to the real stderr as it comes, except h5py's
    deallocator tracebacks, whose errnos it keeps."""

    def __init__(self, read_fd: int, out_fd: int) -> None:
        self.read_fd, self.out_fd = read_fd, out_fd
        self.errnos: list[int] = []
        self.block: list[str] | None = None  # a traceback being read
        self.ended = False  # its exception line was read (continuations start with ",")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pending = b""
        with open(self.read_fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._line(line.decode("utf-8", "replace") + "\n")
                text = pending.decode("utf-8", "replace")
                if self.block is None and text and not any(
                        m.startswith(text) or text.startswith(m) for m in MARKERS):
                    os.write(self.out_fd, pending)  # a progress bar's line, as it comes
                    pending = b""
        if pending:
            self._line(pending.decode("utf-8", "replace"))
        self._end()

    def _line(self, text: str) -> None:
        if self.block is not None:
            if not self.ended and text.startswith("  "):
                self.block.append(text)
                return
            if not self.ended or text.startswith(","):
                self.block.append(text)  # the exception line, or its continuation
                self.ended = True
                return
            self._end()
        if text.startswith(MARKERS[0]):
            self.block, self.ended = [text], False
        elif not text.startswith(MARKERS[1]):
            os.write(self.out_fd, text.encode())

    def _end(self) -> None:
        """A traceback read whole: kept (its errno) if a deallocator's, else forwarded."""
        block, self.block, self.ended = self.block, None, False
        if not block:
            return
        text = "".join(block)
        if DEALLOC in text:
            found = ERRNO.search(text)
            if found:
                self.errnos.append(int(found[1]))
        else:
            os.write(self.out_fd, text.encode())


@contextlib.contextmanager
def hdf5_written(path: str | os.PathLike, **kwargs) -> Iterator[h5py.File]:
    """`h5py.File(path, "w", **kwargs)`; a write HDF5 failed while it was open, reported only
    by h5py's deallocators, is raised as OSError naming `path` when the block ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    watcher = _Filter(read_fd, saved)
    failed: BaseException | None = None
    try:
        with h5py.File(path, "w", **kwargs) as f:
            yield f
    except BaseException as err:
        failed = err
        raise
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closes: the reader drains and ends
        watcher.thread.join()
        os.close(saved)
        reported = failed is not None and getattr(failed, "errno", None) in watcher.errnos
        if watcher.errnos and not reported:
            code = watcher.errnos[0]
            raise OSError(code, f"{path}: {os.strerror(code)}") from failed
