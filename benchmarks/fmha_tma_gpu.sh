#!/usr/bin/env bash
# One GPU run for the sm_90a TMA path of kernels/fmha (issue 18), on an H100/H200 host with torch,
# nvcc 13.0, cmake, ninja and pytest (no network). Run from the repo root:
#
#   OUT=/some/dir bash benchmarks/fmha_tma_gpu.sh
#   OUT=/some/dir FMHA_QUICK=1 bash benchmarks/fmha_tma_gpu.sh   # quick mode, see below
#
# Quick mode (FMHA_QUICK=1): the same build (every kernel, ptxas check) and ctest, then only the
# "default" path (fmha_api.cpp's per-shape rule) is smoke-checked, pytest runs over wgmma and
# default, and the benchmark measures default alone against SDPA flash/efficient/cuDNN (same
# shapes). About a minute when nothing hangs.
# Steps (each under its own timeout, so a hung kernel cannot eat the run; total under 5 minutes
# when nothing hangs):
#   1. cmake + ninja build of kernels/fmha for 90a with ptxas -v  -> $OUT/build.log, $OUT/ptxas.txt
#   2. ctest (C API test, varlen example, symbol check)             -> $OUT/ctest.log
#   3. per path (the default, the TMA modes and the tuning variants of TMA_PATHS),
#      scripts/tma_smoke.py in its own process                      -> $OUT/smoke-<path>.log
#   4. pytest kernels/fmha/tests (CPU + GPU, KFORGE_REQUIRE_GPU=1) over wgmma and every path
#      whose smoke did not hang or fault                             -> $OUT/pytest.log, pytest.xml
#   5. benchmarks/fmha_vs_sdpa.py: bf16/fp16, hdim 128/64, seqlen 2k-16k, causal and not, one row
#      per path (wgmma and the TMA paths whose smoke passed; "default" picks one of them per
#      shape, so it is tested but not benchmarked twice, except in quick mode), SDPA
#      flash/efficient/cuDNN in the same run, and the fastest path per shape
#                                              -> $OUT/bench.md, bench.json
# Step 5 times all columns of a shape in interleaved rounds (--interleave; since run 29 in balanced
# random orders, each round behind a GPU sleep, see timing.time_interleaved): the GPU's clock
# moves with its power draw during a run, and column after column let that drift decide the ratios.
# BENCH_RUNS sets the rounds (default 10); BENCH_DEFAULT=1 benchmarks "default" as a path of
# its own too (in full mode it is otherwise only tested). FMHA_BENCH_ARGS adds arguments to step 5 (e.g. --fa3 for a FlashAttention-3 column, with the
# flash-attn3 wheel on PYTHONPATH).
# The paths (KFORGE_FMHA_SM90_PATH): the PATH rows of kernels/fmha/csrc/fmha_paths.def (the one
# table; kernels/fmha/README.md shows it), read through kernels/fmha/tests/tma_paths.py: default
# (per shape, the DEFAULT rows), the TMA modes and the tuning variants. The build has the tuning
# paths (-DKFORGE_FMHA_TUNING_PATHS=ON; FMHA_TUNING_PATHS=OFF builds the wheel's lean library,
# whose left-out paths the smoke check and pytest skip with the reason).
# The library is used straight from the build folder (KFORGE_FMHA_LIBRARY, PYTHONPATH), so
# nothing is pip-installed and nothing is built twice (the build is a clean one, so ptxas.txt
# always has every kernel). $OUT/summary.txt lists each step's status.
set -uo pipefail
export PYTHONUNBUFFERED=1
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-$ROOT/kernels/fmha/build/tma}
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
QUICK=${FMHA_QUICK:-0}
if [ "$QUICK" = 1 ]; then TMA_PATHS=${TMA_PATHS:-default}; fi
TMA_PATHS=${TMA_PATHS:-$("$PY" -c "import sys; sys.path.insert(0, 'kernels/fmha/tests'); import tma_paths; print(' '.join(p for p in tma_paths.ALL_PATHS if p != 'wgmma'))")}
TUNING=${FMHA_TUNING_PATHS:-ON}
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
status=0
T0=$(date +%s)
step() { echo; echo "=== $* (t=$(( $(date +%s) - T0 ))s)"; }
note() { echo "$*" | tee -a "$SUMMARY"; }

if [ ! -f kernels/fmha/CMakeLists.txt ] || [ ! -f benchmarks/fmha_vs_sdpa.py ]; then
  echo "fmha_tma_gpu.sh: run it from the kforge repo root (no kernels/fmha/CMakeLists.txt in $ROOT)" >&2
  exit 2
fi
for tool in cmake ninja nvcc "$PY"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fmha_tma_gpu.sh: '$tool' is not on PATH; this script needs cmake, ninja, nvcc and python3" >&2
    exit 2
  fi
done

step "device"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  nvcc --version | tail -2; } 2>&1 | tee "$OUT/device.txt"

step "build (90a, ptxas -v, tuning paths $TUNING)"
if timeout 240 cmake -S kernels/fmha -B "$BUILD" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a \
     -DKFORGE_FMHA_PTXAS_VERBOSE=ON -DKFORGE_FMHA_TUNING_PATHS="$TUNING" -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
   timeout 240 cmake --build "$BUILD" -j "$JOBS" --clean-first >>"$OUT/build.log" 2>&1; then
  note "build: ok ($(( $(date +%s) - T0 ))s)"
else
  tail -40 "$OUT/build.log"
  note "build: FAILED (see build.log)"
  exit 1
fi
# Registers and spills per kernel: "<kernel> | registers | spill stores | spill loads".
awk '/Compiling entry function/ {match($0, /_Z[A-Za-z0-9_]+/); k = substr($0, RSTART, RLENGTH)}
     /spill stores/ {st = $5; ld = $9}
     /Used [0-9]+ registers/ {print k " | " $5 " | " st " | " ld}' "$OUT/build.log" |
  (c++filt 2>/dev/null || cat) | sort -u >"$OUT/ptxas.txt"
grep -E "sm90tma|sm90_kernel" "$OUT/ptxas.txt" | sed 's/(kforge_fmha::FwdParams.*)//' | head -80
if awk -F' [|] ' '/sm90tma/ && ($3 + 0 > 0 || $4 + 0 > 0) {bad = 1} END {exit !bad}' "$OUT/ptxas.txt"; then
  note "ptxas: a TMA kernel spills (see ptxas.txt)"
else
  note "ptxas: no TMA kernel spills ($(grep -c sm90tma "$OUT/ptxas.txt") TMA kernels)"
fi
LIB=$(ls "$BUILD"/libkforge_fmha.so 2>/dev/null | head -1)
export KFORGE_FMHA_LIBRARY=$LIB
export PYTHONPATH=$ROOT/kernels/fmha/python${PYTHONPATH:+:$PYTHONPATH}

step "ctest"
if (cd "$BUILD" && timeout 60 ctest --output-on-failure) >"$OUT/ctest.log" 2>&1; then
  note "ctest: ok"
else
  note "ctest: FAILED (see ctest.log)"; status=1
fi
tail -4 "$OUT/ctest.log"

step "smoke per path"
GOOD="wgmma"     # paths that passed the smoke check: tested and benchmarked
QUICK_BENCH=""   # quick mode: "default" once its smoke passed (the only path benchmarked)
TESTED="wgmma"   # paths that only gave wrong numbers are tested too (pytest shows the detail)
for path in $TMA_PATHS; do
  (cd /tmp && timeout -k 5 40 "$PY" "$ROOT/kernels/fmha/scripts/tma_smoke.py" --path "$path") \
    >"$OUT/smoke-$path.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    if [ "$QUICK" = 1 ]; then [ "$path" = default ] && QUICK_BENCH=default
    elif [ "$path" != default ] || [ "${BENCH_DEFAULT:-0}" = 1 ]; then GOOD="$GOOD,$path"; fi
    TESTED="$TESTED,$path"; note "smoke $path: ok"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    note "smoke $path: TIMEOUT (hang?) after 40 s; path left out of pytest and the benchmark"; status=1
  elif [ $rc -eq 1 ]; then
    TESTED="$TESTED,$path"
    note "smoke $path: WRONG RESULTS; path left out of the benchmark (pytest shows the detail)"; status=1
  else
    note "smoke $path: FAILED rc=$rc (a raised error or CUDA fault); path left out of pytest and the benchmark"; status=1
  fi
  grep -iE "^BAD|^ERROR|PASS|FAIL|error" "$OUT/smoke-$path.log" | head -8
done

step "pytest (paths: $TESTED)"
(cd /tmp && KFORGE_REQUIRE_GPU=1 KFORGE_FMHA_TEST_PATHS="$TESTED" timeout -k 10 ${PYTEST_TIMEOUT:-200} \
   "$PY" -m pytest -q -p no:cacheprovider -rfE --junitxml="$OUT/pytest.xml" \
   "$ROOT/kernels/fmha/tests" ${PYTEST_ARGS:-}) >"$OUT/pytest.log" 2>&1
rc=$?
tail -25 "$OUT/pytest.log"
if [ $rc -eq 0 ]; then note "pytest: ok ($(tail -1 "$OUT/pytest.log"))"
else note "pytest: FAILED rc=$rc ($(tail -1 "$OUT/pytest.log"))"; status=1; fi

BENCH_PATHS=$GOOD
if [ "$QUICK" = 1 ]; then BENCH_PATHS=$QUICK_BENCH; fi
step "benchmark (paths: ${BENCH_PATHS:-none})"
if [ -z "$BENCH_PATHS" ]; then
  note "benchmark: SKIPPED (quick mode: the default path's smoke check did not pass)"
  note "total: $(( $(date +%s) - T0 ))s, exit 1"
  exit 1
fi
(cd /tmp && timeout -k 10 ${BENCH_TIMEOUT:-150} "$PY" "$ROOT/benchmarks/fmha_vs_sdpa.py" \
   --paths "$BENCH_PATHS" --seqlens 2048,4096,8192,16384 --head-dims 128,64 --no-memory \
   --runs ${BENCH_RUNS:-10} --warmup 3 --interleave --write "$OUT/bench.md" --json "$OUT/bench.json" ${FMHA_BENCH_ARGS:-}) >"$OUT/bench.log" 2>&1
rc=$?
grep -vE "^\|" "$OUT/bench.log" | tail -70
if [ $rc -eq 0 ]; then note "benchmark: ok"
else note "benchmark: FAILED rc=$rc (partial lines in bench.log)"; status=1; fi

note "total: $(( $(date +%s) - T0 ))s, exit $status"
exit $status
