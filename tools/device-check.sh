#!/usr/bin/env bash
# On a GPU machine, from a checkout: build, GPU tests, the main job, the sweeps, and probes.
# Logs and records go to OUTDIR. A copy of a checkout without .git can name its commit in
# NORMSCAN_COMMIT (bench.json records it).
# Usage: tools/device-check.sh OUTDIR [tests|cases|export|huge|bench|sweep|training|models|tune|ncu|sanitize|memcheck|racecheck|kernels|overhead|verify|coverage]...
#   (default steps: tests cases export bench)
#   tests: every test but test_kernels.py's cases (the step cases), test_export.py (the
#   step export), the >2**31-element cases and the nvcc compile checks (CI runs those), in
#   8 pytest-xdist processes (in one they took over 9 min on the H100: each step fits one
#   10-minute device call; -v, so that a log cut off at a call's limit names each test that
#   ran); cases: the float64 cases alone; export: test_export.py alone (every exported file
#   built side by side, then each against its Model at full size, one at a time: with the
#   other tests they ran past a call's limit on the H200);
#   huge: the >2**31-element cases (tens of GB of device memory:
#   they fit an 80 GB H100); training: `bench --training` (backward
#   and forward+backward beside the peers that are installed); models: tools/model_step.py (a
#   Llama's and a resnet50's training step with torch.nn's norms and with normscan's); tune: tools/tune.py over the
#   variants in $NORMSCAN_TUNE_VARIANTS (';'-separated -D flag sets; "" is the defaults),
#   built in the background while the earlier steps run; ncu: tools/ncu_probe.py, the DRAM
#   bytes (ncu's own counters), throughput, warp stalls and occupancy of the open gaps'
#   kernels (long rows, channel RMSNorm, batch_norm's channels, small-inner scans, 23's rows,
#   40's held rows), and
#   QuACK's long-row kernel where it imports;
#   sanitize: `normscan verify --quick` under compute-sanitizer's memcheck and racecheck, an op a
#   process, without PyTorch's caching allocator (memcheck or racecheck: one of the two);
#   kernels: tools/kernel_bench.cu (the kernels alone, beside a 16-byte copy); overhead:
#   tools/overhead.py (host time of an eager call beside PyTorch's op); verify:
#   `normscan verify`, every case including the >2**31-element ones.
#   coverage: the steps tests and cases together under tools/kernel_coverage.py's profiler
#   (but the one test that takes the profiler itself), then its report: which kernels of the
#   builds no test launched ($dir/coverage/never-launched.txt, coverage.txt by template).
# Seen on an H100: every op's build side by side ~140 s, tests ~13 min (two calls), cases 17 s,
# sanitize over 5 min, bench and the two sweeps with the peers ~4 min together, huge 3 min.
set -uo pipefail
if [ $# -lt 1 ]; then echo "usage: $0 OUTDIR [steps...]" >&2; exit 2; fi
dir=$1
shift
cd "$(dirname "$0")/.."
mkdir -p "$dir"
# ours first, then any carried peers' folders
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
export NORMSCAN_CACHE_DIR=${NORMSCAN_CACHE_DIR:-$PWD/.device-cache}
steps=${*:-tests cases export bench}
status=0
load_all="import normscan._build as b
b.load_all([(e, op) for e in b.extensions() for op in b.extension_ops(e).values()])"
python3 -m normscan env 2>&1 | tee "$dir/env.log"
python3 -c "$load_all" 2>&1 | tee "$dir/build.log" || exit 1
IFS=';' read -r -a variants <<< "${NORMSCAN_TUNE_VARIANTS:-}"
[ ${#variants[@]} -eq 0 ] && variants=("")
case " $steps " in *" tune "*) python3 tools/tune.py --build-only "${variants[@]}" > "$dir/tune-build.log" 2>&1 & ;; esac
for step in $steps; do
  case $step in
    tests) NORMSCAN_TEST_HUGE=0 python3 -m pytest -v -rs -n 8 --dist loadgroup --durations=15 tests --ignore=tests/test_csrc.py \
             --ignore=tests/test_kernels.py --ignore=tests/bench/test_export.py -p no:cacheprovider 2>&1 | tee "$dir/tests.log" \
             | tail -15 || status=1 ;;
    export) NORMSCAN_TEST_HUGE=0 python3 -m pytest -v -rs -n 8 --dist loadgroup --durations=15 tests/bench/test_export.py \
              -p no:cacheprovider 2>&1 | tee "$dir/export.log" | tail -15 || status=1 ;;
    huge) python3 -m pytest -v -rs tests/test_kernels.py -k 31 -p no:cacheprovider 2>&1 \
            | tee "$dir/huge.log" | grep -c "2\*\*31.* PASSED" || status=1 ;;
    bench) python3 -m normscan bench --out "$dir/bench" 2>&1 | tee "$dir/bench.log" | tail -8 || status=1 ;;
    sweep) python3 -m normscan bench --sweep --repeat 10 --ops l2_normalize l1_normalize rms_norm \
             --out "$dir/sweep_norm" 2>&1 | tee "$dir/sweep_norm.log" | tail -32 || status=1
           python3 -m normscan bench --sweep --repeat 10 --ops cumprod cumsum masked_cumsum --out "$dir/sweep_scan" 2>&1 \
             | tee "$dir/sweep_scan.log" | tail -12 || status=1 ;;
    training) python3 -m normscan bench --training --repeat 10 --rounds 2 --out "$dir/training" 2>&1 \
                | tee "$dir/training.log" | tail -45 || status=1 ;;
    models) python3 tools/model_step.py 2>&1 | tee "$dir/models.log" | tail -5 || status=1 ;;
    cases) NORMSCAN_TEST_HUGE=0 python3 -m pytest -v -rs -n 8 --durations=15 tests/test_kernels.py \
             tests/bench/test_testing.py -p no:cacheprovider 2>&1 | tee "$dir/cases.log" | tail -15 || status=1 ;;
    coverage) rm -rf "$dir/coverage"
              NORMSCAN_COVERAGE_OUT=$dir/coverage NORMSCAN_TEST_HUGE=0 PYTHONPATH=$PWD/tools:$PYTHONPATH python3 -m pytest -q \
                -rs -n 8 --dist loadgroup -p kernel_coverage tests --ignore=tests/test_csrc.py --ignore=tests/bench/test_export.py \
                -k "not test_batch_norm_channels_go_one_a_block" -p no:cacheprovider > "$dir/coverage.log" 2>&1 || status=1
              tail -3 "$dir/coverage.log"
              python3 tools/kernel_coverage.py "$dir/coverage" || status=1 ;;
    tune) wait; python3 tools/tune.py "${variants[@]}" 2>&1 | tee "$dir/tune.log" | tail -60 || status=1 ;;
    ncu) python3 tools/ncu_probe.py "$dir" 2>&1 | tail -40 || status=1 ;;
    sanitize|memcheck|racecheck)
      tools=$step; [ $step = sanitize ] && tools="memcheck racecheck"
      for tool in $tools; do  # our kernels only (torch's reductions are not ours to check), an op a process
        for op in $(python3 -c "from normscan.registry import REGISTRY; print(*REGISTRY)"); do
          # No caching allocator: each tensor its own allocation, so that an access past one is
          # outside every allocation, where memcheck sees it (not in a cached neighbour's block).
          PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool $tool --kernel-name kns=normscan --error-exitcode 9 \
            python3 -m normscan verify --quick --no-huge --ops $op > "$dir/sanitize-$tool-$op.log" 2>&1
          code=$?; [ $code -eq 0 ] || status=1
          echo "compute-sanitizer $tool $op: exit $code; $(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|passed," \
            "$dir/sanitize-$tool-$op.log" | tail -2 | tr '\n' ' ')"
        done
      done ;;
    kernels) nvcc -O3 -std=c++17 -arch=sm_90 -I src/normscan/csrc tools/kernel_bench.cu -o /tmp/kernel_bench \
               && /tmp/kernel_bench --rounds 2 2>&1 | tee "$dir/kernels.log" | tail -50 || status=1 ;;
    overhead) python3 tools/overhead.py --repeat 15 2>&1 | tee "$dir/overhead.log" | tail -12 || status=1 ;;
    verify) python3 -m normscan verify > "$dir/verify.log" 2>&1 || status=1; tail -1 "$dir/verify.log" ;;
    *) echo "unknown step $step" >&2; status=2 ;;
  esac
done
exit $status
