"""Entry point for `python -m cfmtrain`."""

from cfmtrain.cli import entry

raise SystemExit(entry())
