#!/usr/bin/env bash
# Make ./.venv with normscan installed (editable) and its test and extra dependencies.
# A torch the system already has (a GPU machine's CUDA build) is used as it is; only where
# none is importable is torch installed, pinned to 2.13.0: an unpinned 'torch' would pull
# several GB of CUDA wheels onto a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv --system-site-packages .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install --quiet torch==2.13.0
fi
.venv/bin/pip install --quiet -e ".[test,extras]"
