#!/usr/bin/env bash
# Nsight Compute profiles of the sm_90a TMA kernel, one per "path:dtype:causal:seqlen" case
# (batch = 16384 tokens / seqlen, 16 heads, hdim 128 unless HDIM is set): builds the library for
# 90a, runs each case's call three times, and profiles the third launch with the full section set.
# Writes a CSV of each case's details page and a gzipped CSV of its per-instruction SASS page
# (stall samples) to $OUT, and the .ncu-rep reports to $REPORTS ($OUT with KEEP_REP=1; the device
# tool brings back only so many files).
#
#   OUT=/tmp/prof CASES="tma-dyn-n176:bf16:0:2048 tma-dyn-n176:bf16:0:16384" \
#     bash kernels/fmha/scripts/ncu_profile.sh
set -uo pipefail
ROOT=$PWD
OUT=${OUT:-$ROOT/ncu-out}
BUILD=${BUILD_DIR:-$ROOT/kernels/fmha/build/ncu}
PY=${PYTHON:-python3}
HDIM=${HDIM:-128}
CASES=${CASES:-tma-dyn-n176:bf16:0:2048}
REPORTS=${REPORTS:-$([ "${KEEP_REP:-0}" = 1 ] && echo "$OUT" || echo /tmp/ncu-reports)}
mkdir -p "$OUT" "$REPORTS"
cmake -S kernels/fmha -B "$BUILD" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DKFORGE_FMHA_TUNING_PATHS=ON \
  -DCMAKE_BUILD_TYPE=Release >"$REPORTS/build.log" 2>&1 &&
  cmake --build "$BUILD" -j "$(nproc)" >>"$REPORTS/build.log" 2>&1 || { tail -30 "$REPORTS/build.log"; exit 1; }
export KFORGE_FMHA_LIBRARY=$BUILD/libkforge_fmha.so
export PYTHONPATH=$ROOT/kernels/fmha/python${PYTHONPATH:+:$PYTHONPATH}
status=0
for case in $CASES; do
  IFS=: read -r path dtype causal seqlen <<<"$case"
  name="${path}_${dtype}_c${causal}_${seqlen}"
  KFORGE_FMHA_SM90_PATH=$path timeout 300 ncu --kernel-name regex:fmha_fwd_sm90_tma_kernel \
    --launch-skip 2 --launch-count 1 --set full -f -o "$REPORTS/$name" \
    "$PY" -c "
import torch, kforge_fmha
dt = {'bf16': torch.bfloat16, 'fp16': torch.float16}['$dtype']
b = max(1, 16384 // $seqlen)
q, k, v = (torch.randn(b, $seqlen, 16, $HDIM, dtype=dt, device='cuda') for _ in range(3))
for _ in range(3):
    kforge_fmha.fmha_fwd(q, k, v, causal=bool($causal))
torch.cuda.synchronize()
print('$name', kforge_fmha.last_kernel())
" >"$REPORTS/$name.log" 2>&1 || { echo "$name: ncu FAILED"; tail -20 "$REPORTS/$name.log"; status=1; continue; }
  ncu -i "$REPORTS/$name.ncu-rep" --page details --csv >"$OUT/$name.details.csv" 2>&1
  ncu -i "$REPORTS/$name.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$OUT/$name.sass.csv.gz"
  echo "$name: ok ($(grep -m1 "^$name" "$REPORTS/$name.log"))"
done
exit $status
