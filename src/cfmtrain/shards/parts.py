"""A conversion as parallel tasks: the input files cut into parts (whole files, or ranges of
frames of a large extxyz file, found by a scan of its atom-count lines), each part checked,
labelled and written by one process, then the parts' frames dealt round-robin into the shards.

The shards are the same for any number of processes: a part holds consecutive frames, parts are
dealt in input order, and the first invalid frame (in input order) is the error. A part file is
extxyz text as `ase.io.write` writes it; dealing copies its frames' lines, parsing nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import pickle
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import ase.io
from tqdm import tqdm

from cfmtrain import children, crash
from cfmtrain.atomic import atomic_path
from cfmtrain.diskfull import writing
from cfmtrain.frames.extxyz import frame_offsets
from cfmtrain.frames.validate import (
    LIMITS,
    InvalidFrameError,
    Limits,
    RawFrame,
    check_frame,
    format_problem,
)
from cfmtrain.readers.options import Part
from cfmtrain.shards.writer import build_atoms

PART_FRAMES = 20_000  # frames of a large extxyz file per task
EXAMPLES = 20  # skipped frames described in the manifest


class PartReader(Protocol):
    """Reads a part's frames; `summary` is what the reader noted on the way (picklable)."""

    def frames(self, part: Part) -> Iterator[RawFrame]: ...

    def summary(self) -> dict: ...


@dataclasses.dataclass
class PartResult:
    written: int
    skipped: Counter
    examples: list[str]
    summary: dict


def plan_parts(files: list[Path], workers: int, is_extxyz: Callable[[Path], bool],
               per_part: int | None = None) -> list[Part]:
    """The parts of `files` in order: with several workers, an extxyz file of more than
    `per_part` frames (default PART_FRAMES) is cut into ranges of that many frames; any other
    file is one part."""
    per_part = per_part or PART_FRAMES
    parts = []
    for path in files:
        offsets = frame_offsets(path, per_part) if workers > 1 and is_extxyz(path) else []
        if len(offsets) < 2:
            parts.append(Part(path))
            continue
        for (first, offset, line), nxt in zip(offsets, [*offsets[1:], None], strict=True):
            parts.append(Part(path, first, offset, line, None if nxt is None else nxt[0] - first))
    return parts


def convert_part(task: tuple[PartReader, Part, Path, str, bool, Limits]) -> PartResult:
    """Check `part`'s frames and write the valid ones to `out` (extxyz, MACE's keys). An
    invalid frame raises InvalidFrameError unless `skip_invalid` (then counted by reason).
    An error is raised as one that survives the trip to the parent process."""
    try:
        return _convert_part(*task)
    except Exception as err:
        try:
            pickle.loads(pickle.dumps(err))
        except Exception:  # unpicklable: the pool's result thread would fail, the parent hang
            raise RuntimeError(f"{type(err).__name__}: {err}") from None
        raise


def _convert_part(reader: PartReader, part: Part, out: Path, config_type: str,
                  skip_invalid: bool, limits: Limits) -> PartResult:
    skipped: Counter[str] = Counter()
    examples: list[str] = []
    written = 0
    with writing(out), open(out, "w") as fh:
        for frame in reader.frames(part):
            crash.at("checking frames", frame.source, frame.index)
            problem = check_frame(frame, limits=limits)
            if problem is None:
                ase.io.write(fh, build_atoms(frame, config_type), format="extxyz")
                written += 1
            elif not skip_invalid:
                raise InvalidFrameError(frame.source, frame.index, *problem)
            else:
                skipped[problem[0]] += 1
                if len(examples) < EXAMPLES:
                    examples.append(format_problem(frame.source, frame.index, *problem))
    return PartResult(written, skipped, examples, reader.summary())


def deal(part_files: list[Path], shard_paths: list[Path]) -> list[int]:
    """The frames of the part files, in order, round-robin into the shards (each written
    atomically); the frames per shard."""
    counts = [0] * len(shard_paths)
    with contextlib.ExitStack() as stack:
        out = [stack.enter_context(open(stack.enter_context(atomic_path(p)), "w"))
               for p in shard_paths]
        k = 0
        for path in part_files:
            with open(path) as fh:
                while header := fh.readline():
                    lines = [header, *itertools.islice(fh, int(header) + 1)]
                    out[k].writelines(lines)
                    counts[k] += 1
                    k = (k + 1) % len(shard_paths)
    return counts


def convert_parts(reader: PartReader, parts: list[Part], folder: Path, shard_paths: list[Path],
                  config_type: str, skip_invalid: bool = False, progress: bool = True,
                  limits: Limits = LIMITS, workers: int = 1) -> tuple[dict, list[dict]]:
    """Convert every part (`workers` processes) and deal the frames into `shard_paths`.
    Returns the manifest's counts (with `frames_by_file`: the valid frames of each input file)
    and each part's reader summary, in order. Fewer valid frames
    than shards is an error: an empty shard would give an empty graph shard."""
    scratch = folder / ".parts"
    with writing(scratch):
        scratch.mkdir(parents=True, exist_ok=True)
    tasks = [(reader, part, scratch / f"part_{k:06d}.extxyz", config_type, skip_invalid, limits)
             for k, part in enumerate(parts)]
    try:
        with contextlib.ExitStack() as stack:
            if workers > 1 and len(tasks) > 1:
                pool = stack.enter_context(
                    children.pool(min(workers, len(tasks))))
                results = pool.imap(convert_part, tasks)  # in order: the first error first
            else:
                results = map(convert_part, tasks)
            done = list(tqdm(results, total=len(tasks), unit=" parts", desc=config_type,
                             disable=not progress))
        skipped = sum((r.skipped for r in done), Counter())
        written = sum(r.written for r in done)
        if written < len(shard_paths):
            raise ValueError(f"{written} valid frame(s) for {len(shard_paths)} shards "
                             f"({sum(skipped.values())} skipped: {dict(skipped)}): every shard "
                             "needs a frame; use fewer shards")
        per_shard = deal([t[2] for t in tasks], shard_paths)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    examples = [e for r in done for e in r.examples][:EXAMPLES]
    by_file: dict[str, int] = {}  # valid frames of each input file, dealt in this order
    for task, result in zip(tasks, done, strict=True):
        by_file[str(task[1].path)] = by_file.get(str(task[1].path), 0) + result.written
    counts = {"frames": sum(per_shard), "frames_per_shard": per_shard, "frames_by_file": by_file,
              "skipped": sum(skipped.values()), "skipped_by_reason": dict(sorted(skipped.items())),
              "skipped_examples": examples}
    return counts, [r.summary for r in done]
