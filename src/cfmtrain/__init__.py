"""cfmtrain: balanced mini-batches and fused kernels for training MACE chemistry foundation models.

Reproduces Firoz et al., HPDC 2025, as a Snakemake pipeline; see README.md.

Importing cfmtrain changes no torch.load default. It only lets e3nn's own constants file load,
whatever the import order: e3nn's `e3nn.o3._wigner` calls `torch.load` on its
`constants.pt` at import, which torch >= 2.6's weights-only default refuses because the file
holds `slice` objects. mace-torch avoids that by setting TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 for
the whole process when `mace` is imported. cfmtrain allows the `slice` builtin (inert: it runs
no code) to torch's weights-only unpickler only while that one e3nn module runs, through an
import hook for just that module, so nothing gets imported early and no global switch is set.

Imports inside functions: cfmtrain's modules import each other at the top, except these (each
import marked `# lazy:`), which keep heavy libraries out of processes that do not use them:
- cli.py, bench/cli.py: only the chosen command's module is imported (importlib).
- balance/__init__.py, graphs/__init__.py: attributes loaded on first use (torch; h5py, torch).
- balance/report.py, graphs/split.py, graphs/stats.py, plots/sizes.py, plots/graphs_per_rank.py,
  simulate/sizes.py: GraphStore (h5py; torch through vesin): light commands start without them.
- frames/validate.py: frames.neighbors (vesin imports torch): `convert`, `generate` stay light.
- config_check.py, simulate/cli.py: train.model or train.model_check (mace, e3nn: seconds) only
  to check or build a model; train/model_check.py: train.model, which imports the checks, for
  the trial build.
- docs.py: the figures' drawing code (matplotlib) only where a picture is redrawn; `--check`
  compares digests.
- children.py: crash, for a pool's workers (the keeper runs children.py as a script, no cfmtrain).
- measure/repeats.py: train.checkpoint, train.summary (torch) once `cell`'s arguments are checked.
- bench/kernels.py, bench/md.py (their children run them), bench/kernels_worker.py,
  bench/md_worker.py: a child loads only what it times (its peak RSS is a result): no cfmtrain
  op library in mace-torch's reference runs, no model or pandas in the matmul peak's, no
  matplotlib (the figures, plots) in any.
- bench/gpu.py, bench/gpu_equality.py, bench/gpu_timing.py: the GPU check loads the kernels,
  mace's modules and matplotlib only in the parts that run, so that a machine without a GPU
  (or without cuEquivariance) reports what it skips instead of failing at import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

__version__ = "0.1.0"

_E3NN_CONSTANTS_MODULE = "e3nn.o3._wigner"


class _SliceAllowedLoader(importlib.abc.Loader):
    """Runs a module with `slice` allowed to torch.load's weights-only unpickler meanwhile."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        import torch  # e3nn's parent packages have imported it already

        module.__loader__ = self.loader  # the module keeps its own loader afterwards
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        added = [] if slice in torch.serialization.get_safe_globals() else [slice]
        with torch.serialization.safe_globals(added):  # removes only what it added
            self.loader.exec_module(module)
        _remove_finder()


class _E3nnConstantsFinder(importlib.abc.MetaPathFinder):
    """Finds `e3nn.o3._wigner` as usual and loads it through `_SliceAllowedLoader`."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != _E3NN_CONSTANTS_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _SliceAllowedLoader(spec.loader)
        return spec


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _E3nnConstantsFinder)]


if _E3NN_CONSTANTS_MODULE not in sys.modules and not any(
        isinstance(f, _E3nnConstantsFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _E3nnConstantsFinder())
