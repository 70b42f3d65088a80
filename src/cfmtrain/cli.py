"""The `cfmtrain` command line: one sub-command per pipeline stage.

Each command lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
modules are imported only when their command runs, so `cfmtrain --help` stays fast. `entry`
(the `cfmtrain` script, `python -m cfmtrain`) runs the command in a supervised child process
(cfmtrain.crash), so that a death by signal is explained; `main` runs it in this process.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from cfmtrain import crash, quiet
from cfmtrain.commands import COMMANDS  # the table of commands (also read by cfmtrain docs)
from cfmtrain.diskfull import DiskFullError
from cfmtrain.malloc_env import MALLOC_ENV


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command (arguments added lazily)."""
    parser = argparse.ArgumentParser(prog="cfmtrain", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    for name, (_, help_text, _) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code."""
    quiet.install()  # before any library is imported: only cfmtrain's own warnings print
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints usage or the error, exits
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text, _ = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"cfmtrain {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (pool workers ignore it)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second one (the supervisor's) too
        print(f"cfmtrain {name}: interrupted", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except DiskFullError as err:  # one line naming the file, not a traceback
        print(f"cfmtrain {name}: {err}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        _end_pools()
        # no interpreter teardown: a library whose write failed (HDF5) may crash in it
        os._exit(1)


def _end_pools() -> None:
    """What multiprocessing does at a normal exit (its pools' workers ended, their semaphores
    released), before an exit without teardown: else its resource tracker warns of leaks."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        try:
            util._exit_function()
        except Exception:  # noqa: BLE001  (best effort: the error is said already)
            pass


def entry() -> int:
    """The `cfmtrain` script: supervise the command in a child process (cfmtrain.crash), with
    the tuned allocator settings for the commands that need them; in that child, run it."""
    argv = sys.argv[1:]
    quiet.install()  # here and, through the environment, in the child and its processes
    if crash.ENV in os.environ:  # the supervised child
        crash.attach_child()
        return main(argv)
    heavy = bool(argv) and argv[0] in COMMANDS and COMMANDS[argv[0]][2]
    try:
        return crash.supervise(argv, {**os.environ, **(MALLOC_ENV if heavy else {})})
    except DiskFullError as err:  # the supervisor's record, in the temporary folder
        print(f"cfmtrain: {err}", file=sys.stderr, flush=True)
        return 1
