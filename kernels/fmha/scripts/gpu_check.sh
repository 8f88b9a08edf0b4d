#!/usr/bin/env bash
# One batch of GPU work for kforge_fmha on the GPU host (run from the repo root):
#   1. C library + ctest (C API test, varlen example, symbol check)
#   2. pip install the package (no build isolation) and run CPU + GPU pytest with KFORGE_REQUIRE_GPU=1
#   3. the benchmark (full table unless BENCH=quick|none)
#   4. optional tuning variants: VARIANTS="name:cuda-flags;name:cuda-flags" (quick bench each)
# Logs and results go to $OUT (or ./gpu-out).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
ARCHS=${CMAKE_CUDA_ARCHITECTURES:-90a}
ROOT=$PWD
J=${JOBS:-16}
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
nvcc --version | tail -2

step "cmake build + ctest (archs $ARCHS)"
cmake -S kernels/fmha -B kernels/fmha/build/c -G Ninja -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
  -DKFORGE_FMHA_PTXAS_VERBOSE=ON -DKFORGE_FMHA_TUNING_PATHS=${FMHA_TUNING_PATHS:-ON} >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
/usr/bin/time -f "build wall %e s, max rss %M KB" cmake --build kernels/fmha/build/c -j "$J" >>"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
grep -E "Compiling entry|registers|spill" "$OUT/cmake.log" | grep -B1 -A1 "spill" | head -40
tail -1 "$OUT/cmake.log"
(cd kernels/fmha/build/c && ctest --output-on-failure 2>&1) | tee "$OUT/ctest.log" || status=1

step "pip install"
if ls .whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; fi
CMAKE_CUDA_ARCHITECTURES="$ARCHS" python3 -m pip install -q --no-build-isolation --no-deps ./kernels/fmha >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }

step "pytest (CPU + GPU, KFORGE_REQUIRE_GPU=1)"
[ -n "${SKIP_TESTS:-}" ] || (cd /tmp && KFORGE_REQUIRE_GPU=1 python3 -m pytest -q -p no:cacheprovider -rfEs "$ROOT/kernels/fmha/tests" ${PYTEST_ARGS:-} 2>&1) | tee "$OUT/pytest.log" || status=1

BENCH=${BENCH:-full}
if [ "$BENCH" = full ]; then
  step "benchmark"
  (cd /tmp && python3 "$ROOT/benchmarks/fmha_vs_sdpa.py" --write "$OUT/bench.md" --json "$OUT/bench.json" 2>&1) | tail -80
elif [ "$BENCH" = quick ]; then
  (cd /tmp && python3 "$ROOT/benchmarks/fmha_vs_sdpa.py" --quick --seqlens 2048,8192 2>&1) | grep -v "^|" | grep -v "^$" | head -20
fi

if [ -n "${VARIANTS:-}" ]; then
  step "variants"
  IFS=';' read -ra VS <<<"$VARIANTS"
  for v in "${VS[@]}"; do
    name=${v%%:*}; flags=${v#*:}
    ( cmake -S kernels/fmha -B "kernels/fmha/build/v_$name" -G Ninja -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
        -DKFORGE_FMHA_BUILD_TESTS=OFF "-DCMAKE_CUDA_FLAGS=$flags" >/dev/null && \
      cmake --build "kernels/fmha/build/v_$name" -j 4 >/dev/null ) &
  done
  wait
  for v in "${VS[@]}"; do
    name=${v%%:*}; flags=${v#*:}
    echo "--- variant $name: $flags"
    (cd /tmp && KFORGE_FMHA_LIBRARY="$ROOT/kernels/fmha/build/v_$name/libkforge_fmha.so" \
      python3 "$ROOT/benchmarks/fmha_vs_sdpa.py" --quick --seqlens ${VSEQ:-2048,8192} --runs 10 2>&1) | grep -E "^bfloat16" 
  done
fi
if [ -n "${NCU:-}" ]; then
  step "ncu ($NCU)"
  cat > /tmp/ncu_one.py <<'PY'
import sys, torch, kforge_fmha
d, causal, L = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
q, k, v = (torch.randn(16384 // L, L, 16, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
for _ in range(3):
    kforge_fmha.fmha_fwd(q, k, v, causal=causal)
torch.cuda.synchronize()
PY
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo ncu)
  (cd /tmp && "$NCU_BIN" --clock-control none -k regex:fmha_fwd -s 2 -c 1 --section SpeedOfLight \
     --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
     --section Occupancy --section LaunchStats python3 /tmp/ncu_one.py $NCU 2>&1) | tee "$OUT/ncu.txt" | grep -vE "^==PROF==" | head -150
fi
exit $status
