"""`python -m cfmtrain.train ARGS` = `cfmtrain train ARGS` (what torchrun launches)."""

import argparse
import sys

from cfmtrain import crash, quiet

quiet.install()  # before mace and e3nn are imported: the libraries' warnings (cfmtrain.quiet)

from cfmtrain.train.cli import add_arguments, run  # noqa: E402

crash.attach_child()  # a rank that dies in native code leaves its Python stack in the log

parser = argparse.ArgumentParser(prog="cfmtrain train", description=__doc__)
add_arguments(parser)
sys.exit(run(parser.parse_args()))
