"""BatchLoader: batches of a batch sampler, assembled ahead of training.

`num_workers` (config `batch.num_workers`):
- null (auto, the default): one prefetch thread, except when the store's arrays are read from
  disk and the rank has at least 4 CPUs: then 2 worker processes (`resolve_workers`). The
  vectorised assembly takes about a millisecond per batch, far less than a training step, so
  a thread hides it; processes only pay off when every batch is read from disk;
- `0`: no prefetch, each batch is assembled when training asks for it;
- `N > 0`: N worker processes (torch DataLoader, batches assembled whole in the workers).
There is nothing to overlap with a single batch: it is always assembled in place.

For a training on a CUDA device every batch is page-locked as it is made (in the prefetch
thread, or by the DataLoader's pinning thread), so that its one copy to the device per step
runs asynchronously (train.device).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator

import torch

PREFETCH_DEPTH = 2  # batches assembled ahead of the one training uses
THREAD = -1  # BatchLoader's `num_workers` for one prefetch thread
JOIN_TIMEOUT_S = 60.0  # close() waits this long at most for the batch being assembled


def pins(device: torch.device | str | None, pin_memory: bool = False) -> bool:
    """Whether batches for `device` are page-locked: always for a CUDA device; without a
    device, as `pin_memory` asks where CUDA is available; never for another device."""
    if device is not None:
        return torch.device(device).type == "cuda"
    return pin_memory and torch.cuda.is_available()


def resolve_workers(num_workers: int | None, in_memory: bool, cpus_per_rank: int) -> int:
    """The configured `num_workers`, auto (None) resolved to THREAD, or to 2 worker processes
    when the arrays are read from disk and the rank has at least 4 CPUs."""
    if num_workers is not None:
        return num_workers
    return 2 if not in_memory and cpus_per_rank >= 4 else THREAD


class _Assembled(torch.utils.data.Dataset):
    """For worker processes: one item = one whole batch (the sampler's list of items)."""

    def __init__(self, assemble: Callable):
        self.assemble = assemble

    def __getitem__(self, items):
        return self.assemble(items)


def _whole(batch):
    return batch


class BatchLoader:
    """Iterates `assemble(items)` over `batch_sampler`: THREAD, 0 or N worker processes (module
    docstring, auto already resolved); each iteration starts the sampler anew, as a
    DataLoader does. Batches for a CUDA `device` are page-locked (`pins`)."""

    def __init__(self, assemble: Callable, batch_sampler: Iterable, num_workers: int = 0,
                 pin_memory: bool = False, device: torch.device | str | None = None):
        self.assemble, self.batch_sampler = assemble, batch_sampler
        self.num_workers = num_workers
        self.pin_memory = pins(device, pin_memory)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator:
        if self.num_workers > 0 and len(self) > 1:
            return iter(torch.utils.data.DataLoader(
                _Assembled(self.assemble), sampler=self.batch_sampler, batch_size=None,
                collate_fn=_whole, num_workers=self.num_workers, pin_memory=self.pin_memory))
        if self.num_workers == THREAD and len(self) > 1:
            return _Prefetch(self._make, iter(self.batch_sampler))
        return map(self._make, self.batch_sampler)

    def _make(self, items):
        batch = self.assemble(items)
        return batch.pin_memory() if self.pin_memory else batch


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


def _produce(make: Callable, items: Iterator, out: queue.Queue, stop: threading.Event) -> None:
    """The prefetch thread: assemble batches into `out` until the sampler ends or `stop`."""
    try:
        while not stop.is_set():  # checked before the sampler advances
            batch_items = next(items, _END)
            if batch_items is _END or not _put(out, make(batch_items), stop):
                break
        _put(out, _END, stop)
    except BaseException as error:  # re-raised in the training thread
        _put(out, _Failed(error), stop)


def _put(out: queue.Queue, item, stop: threading.Event) -> bool:
    """Put `item` once there is room; False if stopped first."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            pass
    return False


class _Prefetch:
    """Iterator over batches made by one background thread, PREFETCH_DEPTH ahead. The time
    `next` blocks is the training's real data wait; dropping the iterator stops the thread."""

    def __init__(self, make: Callable, items: Iterator):
        self._queue: queue.Queue = queue.Queue(PREFETCH_DEPTH)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=_produce, name="cfmtrain-prefetch", daemon=True,
                                        args=(make, items, self._queue, self._stop))
        self._thread.start()

    def __iter__(self) -> _Prefetch:
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is _END or isinstance(item, _Failed):
            self._done = True
            if isinstance(item, _Failed):
                raise item.error
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the thread and wait for it to finish the batch it is assembling: a thread still
        inside the compiled assembly when the interpreter exits (a SIGTERM'd run returns right
        after its checkpoint) can abort the process in the runtime's teardown."""
        self._stop.set()
        self._done = True
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=JOIN_TIMEOUT_S)

    def __del__(self) -> None:
        self._stop.set()
