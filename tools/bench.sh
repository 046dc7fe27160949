#!/usr/bin/env bash
# The main job from a fresh checkout: set up ./.venv, then `normscan bench` (arguments pass on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-venv.sh
exec .venv/bin/normscan bench "$@"
