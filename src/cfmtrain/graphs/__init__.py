"""Radius graphs with periodic boundaries, stored as sharded HDF5 (GraphStore)."""
