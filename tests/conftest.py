"""Fixtures shared by test modules: a download payload, and for the training tests a small store
and a finished baseline run of it (a module may override `full_run`, as
tests/train/test_train_run.py does with the kernel variant)."""

from __future__ import annotations

import os
import signal

import pytest
import torch

pytest.register_assert_rewrite("helpers")  # its asserts report like a test module's

from helpers import make_store, train  # noqa: E402


def pytest_configure(config):
    """The tests that signal the commands they start need the default dispositions, whatever
    the shell gave this process: a background job ignores SIGINT, `nohup` SIGHUP, and the
    commands would inherit that."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _default_dtype():
    """Every test starts from torch's default dtype of the session's start: code a test runs
    in this process may set it process-wide (mace-torch's MACECalculator does)."""
    start = torch.get_default_dtype()
    yield
    torch.set_default_dtype(start)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(store, split, ...) of 30 small graphs, once per test module."""
    return make_store(tmp_path_factory.mktemp("store"), n=30)


@pytest.fixture(scope="module")
def full_run(data, tmp_path_factory):
    """The run folder of an uninterrupted baseline training of `data`."""
    out = tmp_path_factory.mktemp("full")
    assert train(data[0], data[1], out) == 0
    return out


@pytest.fixture
def payload() -> bytes:
    """Random bytes for the download tests (300 kB and a recognisable end)."""
    return os.urandom(300_000) + b"end of file"
