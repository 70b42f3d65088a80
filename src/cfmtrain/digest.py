"""File digests: the one hasher of every stage (downloads, manifests, provenance)."""

from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 20


def new_hasher(algorithm: str = "sha256"):
    """A new hashlib object for `algorithm` (ValueError naming it if hashlib lacks it)."""
    if algorithm not in hashlib.algorithms_guaranteed:
        raise ValueError(f"unknown checksum algorithm {algorithm!r} (use sha256 or md5)")
    return hashlib.new(algorithm)


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes, read in chunks."""
    h = new_hasher(algorithm)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()
