#!/usr/bin/env bash
# One call on the GPU machine: build, environment, GPU tests, the main job. Logs go to
# $OUT (the device tool's output folder; ./device-out elsewhere); a short table prints last.
# Usage: tools/device-check.sh [tests|bench|sweep|all]...   (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export NORMSCAN_CACHE_DIR=${NORMSCAN_CACHE_DIR:-$PWD/.device-cache}
steps=${*:-all}
status=0
python3 -m normscan env 2>&1 | tee "$OUT/env.log"
python3 -c "import normscan._build as b; b.load()" 2>&1 | tee "$OUT/build.log" || exit 1
for step in $steps; do
  case $step in
    tests|all) python3 -m pytest -q -rs tests 2>&1 | tee "$OUT/tests.log" | tail -25 || status=1 ;;&
    bench|all) python3 -m normscan bench --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" || status=1 ;;&
    sweep) python3 -m normscan bench --sweep --out "$OUT/sweep" 2>&1 | tee "$OUT/sweep.log" || status=1 ;;
  esac
done
exit $status
