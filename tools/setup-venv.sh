#!/usr/bin/env bash
# Make ./.venv with normscan installed (editable) and its test and extra dependencies.
# A torch the system already has (a GPU machine's CUDA build) is used as it is. Where none
# is importable, torch 2.13.0 is installed: from PyPI (whose Linux wheel is a CUDA build,
# several GB with its CUDA packages), or from $NORMSCAN_TORCH_INDEX, such as PyTorch's CPU
# index https://download.pytorch.org/whl/cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv --system-site-packages .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install --quiet torch==2.13.0 ${NORMSCAN_TORCH_INDEX:+--index-url "$NORMSCAN_TORCH_INDEX"}
fi
.venv/bin/pip install --quiet -e ".[test,extras]"
