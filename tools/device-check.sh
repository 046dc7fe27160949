#!/usr/bin/env bash
# One call on the GPU machine: build, GPU tests, the main job, the sweeps. Logs and records
# go to $OUT (the device tool's output folder; ./device-out elsewhere). The checkout that
# travels has no .git: write the commit first, `git rev-parse --short HEAD > .device-commit`,
# and name .device-commit in the call's carry.
# Usage: tools/device-check.sh [tests|cases|huge|bench|sweep|tune|ncu|sanitize|kernels|verify]...   (default: tests bench)
#   cases: the float64 cases alone (no exports, no build tests); tune: tools/tune.py over the
#   variants in $NORMSCAN_TUNE_VARIANTS (';'-separated -D flag sets; "" is the defaults),
#   built in the background while the earlier steps run; ncu: DRAM bytes of the long-row
#   and channel kernels (ncu's own counters), and where the channel kernel's warps stall;
#   sanitize: `normscan verify --quick` under compute-sanitizer's memcheck and racecheck;
#   kernels: tools/kernel_bench.cu (the kernels alone, beside a 16-byte copy), built there;
#   verify: `normscan verify`, every case including the >2**31-element ones (~1 min).
# Seen on an H100 (2026-11-21/22): build 43-59 s; tests without the >2**31 cases 6-8 min (the
# exported-solution and build-kill tests build the kernels again), the >2**31 cases seconds,
# cases ~5 s; bench ~1 min; the sweeps ~1 min; sanitize ~2 min. A call may run 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
export NORMSCAN_CACHE_DIR=${NORMSCAN_CACHE_DIR:-$PWD/.device-cache}
[ -f .device-commit ] && export NORMSCAN_COMMIT=$(cat .device-commit)
steps=${*:-tests bench}
status=0
python3 -m normscan env 2>&1 | tee "$OUT/env.log"
python3 -c "import normscan._build as b; b.load()" 2>&1 | tee "$OUT/build.log" || exit 1
IFS=';' read -r -a variants <<< "${NORMSCAN_TUNE_VARIANTS:-}"
[ ${#variants[@]} -eq 0 ] && variants=("")
case " $steps " in *" tune "*) python3 tools/tune.py --build-only "${variants[@]}" > "$OUT/tune-build.log" 2>&1 & ;; esac
for step in $steps; do
  case $step in
    tests) NORMSCAN_TEST_HUGE=0 python3 -m pytest -q -rs tests --ignore=tests/test_compile.py 2>&1 \
             | tee "$OUT/tests.log" | tail -15 || status=1 ;;
    huge) python3 -m pytest -v -rs tests/test_gpu.py -k 31 2>&1 | tee "$OUT/huge.log" | grep -c "2\*\*31.* PASSED" || status=1 ;;
    bench) python3 -m normscan bench --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -8 || status=1 ;;
    sweep) python3 -m normscan bench --sweep --repeat 10 --ops l2_normalize l1_normalize rms_norm \
             --out "$OUT/sweep_norm" 2>&1 | tee "$OUT/sweep_norm.log" | tail -32 || status=1
           python3 -m normscan bench --sweep --repeat 10 --ops cumprod cumsum --out "$OUT/sweep_scan" 2>&1 \
             | tee "$OUT/sweep_scan.log" | tail -12 || status=1 ;;
    cases) NORMSCAN_TEST_HUGE=0 python3 -m pytest -q -rs tests/test_gpu.py \
             -k "float64 or wrong_kernel or stream or channels_last" 2>&1 | tee "$OUT/cases.log" | tail -15 \
             || status=1 ;;
    tune) wait; python3 tools/tune.py "${variants[@]}" 2>&1 | tee "$OUT/tune.log" | tail -60 || status=1 ;;
    ncu) python3 tools/ncu_probe.py "$OUT" 2>&1 | tail -40 || status=1 ;;
    sanitize) for tool in memcheck racecheck; do  # our kernels only: torch's reductions are not ours to check
                compute-sanitizer --tool $tool --kernel-name kns=normscan --error-exitcode 9 \
                  python3 -m normscan verify --quick --no-huge > "$OUT/sanitize-$tool.log" 2>&1
                echo "compute-sanitizer $tool: exit $?"; grep -E "ERROR SUMMARY|passed," "$OUT/sanitize-$tool.log" | tail -2
              done ;;
    kernels) nvcc -O3 -std=c++17 -arch=sm_90 -I src/normscan/csrc tools/kernel_bench.cu -o /tmp/kernel_bench \
               && /tmp/kernel_bench --rounds 2 2>&1 | tee "$OUT/kernels.log" | tail -50 || status=1 ;;
    verify) python3 -m normscan verify > "$OUT/verify.log" 2>&1 || status=1; tail -1 "$OUT/verify.log" ;;
    *) echo "unknown step $step" >&2; status=2 ;;
  esac
done
exit $status
