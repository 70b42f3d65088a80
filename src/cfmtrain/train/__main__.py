"""`python -m cfmtrain.train ARGS` = `cfmtrain train ARGS` (what torchrun launches)."""

import argparse
import sys

from cfmtrain.train.cli import add_arguments, run

parser = argparse.ArgumentParser(prog="cfmtrain train", description=__doc__)
add_arguments(parser)
sys.exit(run(parser.parse_args()))
