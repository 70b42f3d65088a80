# Derived outputs rebuilt when what they derive from changed in a way Snakemake does not see:
# it compares modification times, and keeps the settings each job ran with (its params) in
# this clone's .snakemake/. So an input edited with its time kept, or a results folder that
# another clone (or config) of other settings wrote, would look current. The input functions
# here (of the frames, graph_shard and split rules) compare what each output records - the
# frames manifest its inputs' sha256 and its settings, a graph shard its cutoff, a split its
# fractions and seed - with the files and the config, and have Snakemake rebuild an output that
# differs (and all that derives from it), naming it and why, at `snakemake -n` already.
# (An input function that raised would not do: Snakemake keeps an existing output whose job
# cannot be planned.)
import os
import sys
from pathlib import Path

from cfmtrain.graphs.recorded import (
    differences,
    frames_settings,
    frames_wanted,
    shard_settings,
    split_settings,
)
from cfmtrain.shards.sources import changed_inputs

# sha256 of inputs whose stamp moved without a change of content (cfmtrain.shards.sources)
DIGESTS = Path(".snakemake/cfmtrain-digests.json")
_SAID = set()


def rebuild(output, why):
    """Have Snakemake rebuild `output` (a file or folder it writes) and what derives from it,
    printing why once. Planned as a forced job (no file touched, so a dry run changes
    nothing); where Snakemake keeps no forced files, by dating the output to 1970."""
    if output not in _SAID:
        _SAID.add(output)
        print(f"{output}: rebuilt: {why}", file=sys.stderr)
    forced = getattr(getattr(workflow, "dag", None), "forcefiles", None)
    if isinstance(forced, set):
        forced.add(output)
        return
    carrier = os.path.join(output, ".snakemake_timestamp")
    os.utime(carrier if os.path.isfile(carrier) else output, (0, 0))


def check_settings(output, recorded, wanted, folder):
    """Rebuild `output` if it records other settings than this config asks for."""
    found = differences(recorded, wanted)
    if found:
        rebuild(output, f"made with {'; '.join(found)}. If another clone or config shares "
                f"this results folder, its {folder} is replaced: give each its own results "
                "folder to keep both")


def check_frames(dataset, cfg):
    """The frames of `dataset`: of this config's settings, and of its inputs' content (an
    input edited with its modification time kept: touch -r, rsync -t, a restored copy). The
    manifest records each input's sha256 and stamp; an input is hashed only if its stamp
    moved (cfmtrain.shards.sources)."""
    frames = f"results/data/{dataset}/frames"
    check_settings(frames, frames_settings(frames), frames_wanted(cfg), frames)
    changed = changed_inputs(os.path.join(frames, "manifest.json"), DIGESTS)
    if changed:
        rebuild(frames, f"{', '.join(changed)} changed since the conversion (its sha256 differs "
                "from the one manifest.json records, though its modification time did not "
                "move)")


def shard_frames(wildcards):
    """A graph shard's frames; a shard built at another cutoff than the config's is rebuilt."""
    shard = f"results/graphs/{wildcards.dataset}/shard_{wildcards.shard}.h5"
    check_settings(shard, shard_settings(shard), {"cutoff": config["cutoff"]},
                   f"results/graphs/{wildcards.dataset}")
    return f"results/data/{wildcards.dataset}/frames"


def split_inputs(wildcards):
    """The graph shards a split reads; a split of other fractions or seed is made again."""
    split = f"results/graphs/{wildcards.dataset}/split.npz"
    check_settings(split, split_settings(split), config["split"], split)
    return graph_shards(wildcards)
