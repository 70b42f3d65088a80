"""Radius graphs with periodic boundaries, stored as sharded HDF5 (GraphStore)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cfmtrain.graphs.store import GraphStore, ShardError

__all__ = ["GraphStore", "ShardError"]


def __getattr__(name: str) -> object:
    """`cfmtrain.graphs.GraphStore` (as the README shows), imported on first use so that
    `cfmtrain.frames.neighbors` alone does not load h5py."""
    if name in __all__:
        from cfmtrain.graphs import store  # lazy: h5py, torch (via vesin)

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
