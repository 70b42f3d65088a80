"""Fixtures of the kernel tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def float64_default():
    """Build mace modules in float64 so that their CG buffers are float64-exact (tests/conftest.py's
    autouse fixture restores the default dtype after the test)."""
    torch.set_default_dtype(torch.float64)
