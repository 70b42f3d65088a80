"""Entry point for `python -m cfmtrain`."""

from cfmtrain.cli import main

raise SystemExit(main())
