#!/usr/bin/env bash
# Sets cfmtrain up on a GPU node without internet, from the wheels `make gpu-wheels` downloaded
# (copy them there): a venv made with --system-site-packages from the node's own Python, so that
# its CUDA torch is used; the wheels it lacks installed from the folder (`pip install --no-index
# --no-deps`: never a torch, and the node's own numpy, scipy, ... kept); cfmtrain installed
# editable as plain Python (CFMTRAIN_NO_EXTENSION=1: nothing compiled). The venv's Python runs
# with CFMTRAIN_NO_EXTENSION=1 (a .pth line): extensions built in a shared checkout for another
# host's torch are ignored, cuEquivariance runs both paper kernels, and the batches and plans are
# made by the Python twins of the compiled pieces (docs/gpu.md).
#
#   PYTHON=<the node's python with CUDA torch> bash scripts/gpu_node_setup.sh [WHEELS] [VENV]
#
# WHEELS defaults to gpu-wheels, VENV to .venv-gpu (`make gpu-check` uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
wheels=${1:-gpu-wheels}
venv=${2:-.venv-gpu}
if ! "$python" -c "import torch" 2>/dev/null; then
    echo "$python has no torch: load the node's PyTorch (module load, conda activate) or set" \
         "PYTHON to the Python that has it" >&2
    exit 2
fi
if [ ! -f "$wheels/requirements.txt" ]; then
    echo "no $wheels/requirements.txt: run \`make gpu-wheels\` where PyPI is reachable and copy" \
         "the folder here" >&2
    exit 2
fi
"$python" -m venv --system-site-packages "$venv"
py=$venv/bin/python
purelib=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if ! "$py" -c "import torch" 2>/dev/null; then
    # the node's Python is itself a venv: its packages are not the system's; link them
    "$python" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" \
        > "$purelib/cfmtrain_node_torch.pth"
fi
echo "import os; os.environ.setdefault('CFMTRAIN_NO_EXTENSION', '1')" \
    > "$purelib/cfmtrain_no_extension.pth"
# the packages the node lacks (setuptools and wheel always: cfmtrain's install needs recent ones)
missing=$("$py" - "$wheels/requirements.txt" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for line in open(sys.argv[1]):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    name = line.split("==")[0]
    try:
        version(name)
        if name not in ("setuptools", "wheel"):
            continue
    except PackageNotFoundError:
        pass
    print(line)
PY
)
if [ -n "$missing" ]; then
    # shellcheck disable=SC2086  # one requirement per word
    "$py" -m pip install --quiet --no-index --no-deps --find-links "$wheels" $missing
fi
CFMTRAIN_NO_EXTENSION=1 "$py" -m pip install --quiet --no-index --no-deps --no-build-isolation \
    -e .
"$py" -c "import cfmtrain, cuequivariance_torch, mace, torch; from cfmtrain.kernels.backend import is_built; assert not is_built('cfmtrain._ops_channelwise_conv'); print('cfmtrain ready on', torch.__version__, 'CUDA', torch.version.cuda, 'GPU' if torch.cuda.is_available() else 'no GPU')"
