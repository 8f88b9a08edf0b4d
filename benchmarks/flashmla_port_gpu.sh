#!/bin/bash
# The exact script the mla helper ran on the GPU host (nvidia-h100-x1) for docs/verified.md and
# docs/benchmarks.md. It expects, next to it: flashmla-9241ae3e-cutlass-trim.tar.xz (git archive of
# FlashMLA 9241ae3e with csrc/cutlass = git archive of cutlass 147f5673 include/ tools/util/include/),
# patches/ (0001 + 0011-0013 of patches/flashmla) and scripts/ (tests/gpu/flashmla_port_smoke.py,
# benchmarks/flashmla_port.py). Everything lands in /tmp/mla/out.
# kforge mla helper: build FlashMLA (pin 9241ae3e + patches) with the sm_120 port on the GPU host,
# run the port's smoke set and the port-vs-wgmma benchmark. Writes everything under /tmp/mla/out.
set -u
C=$(cd "$(dirname "$0")" && pwd)
W=/tmp/mla; O=$W/out; mkdir -p $O
exec > >(tee -a $O/gpu.log) 2>&1
echo "== start $(date -u)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}; export PATH=$CUDA_HOME/bin:$PATH
export CPLUS_INCLUDE_PATH=$CUDA_HOME/include/cccl
nvcc --version | tail -2; python3 -c "import torch;print('torch',torch.__version__)"
prep() {  # $1 dir
  rm -rf $1; mkdir -p $1; tar -xJf $C/flashmla-9241ae3e-cutlass-trim.tar.xz -C $1
  (cd $1/FlashMLA && for p in $C/patches/*.patch; do patch -p1 -s < $p || { echo "PATCH FAIL $p"; exit 1; }; done)
}
if [ ! -f $W/sm90/FlashMLA/dist/*.whl ] 2>/dev/null; then
prep $W/sm90 && prep $W/sm120 || exit 1
# sm90 + port (for the tests): upstream sm90 dense decode + our port, no sparse/sm100
( cd $W/sm90/FlashMLA && FLASH_MLA_DISABLE_SM100=1 FLASH_MLA_DISABLE_SPARSE=1 NVCC_THREADS=2 MAX_JOBS=10 \
  FLASH_MLA_LOCAL_VERSION=kforge.sm90port python3 setup.py bdist_wheel > $O/build_sm90.log 2>&1; echo "sm90 build rc=$?" ) &
P1=$!
# sm_120a only (the sm_120 wheel): no sm90/sm100, arch through TORCH_CUDA_ARCH_LIST
( cd $W/sm120/FlashMLA && FLASH_MLA_DISABLE_SM90=1 FLASH_MLA_DISABLE_SM100=1 TORCH_CUDA_ARCH_LIST=12.0a NVCC_THREADS=2 MAX_JOBS=6 \
  FLASH_MLA_LOCAL_VERSION=kforge.sm120 python3 setup.py bdist_wheel > $O/build_sm120.log 2>&1; echo "sm120 build rc=$?" ) &
P2=$!
wait $P1 $P2
else echo "reusing the builds in $W"; fi
echo "== built $(date -u)"
grep -E "error|Error" $O/build_sm90.log | head -20; grep -E "error|Error" $O/build_sm120.log | head -20
ls -la $W/sm90/FlashMLA/dist $W/sm120/FlashMLA/dist
cp $W/sm120/FlashMLA/dist/*.whl $O/flashmla-sm120.whl.bin 2>/dev/null; cp $W/sm90/FlashMLA/dist/*.whl $O/flashmla-sm90port.whl.bin 2>/dev/null
pip install --no-deps --force-reinstall -q --target $W/site $W/sm90/FlashMLA/dist/*.whl || exit 1
export PYTHONPATH=$W/site
cd $W/sm90/FlashMLA
PYTHONUNBUFFERED=1 python3 $C/scripts/flashmla_port_smoke.py --flashmla-tree . --impl port > $O/smoke_port.log 2>&1; echo "smoke port rc=$?"
grep -E "SMOKE|FAILED|==|device" $O/smoke_port.log | head -30
PYTHONUNBUFFERED=1 python3 $C/scripts/flashmla_port_smoke.py --flashmla-tree . --impl port --dtype bf16 --block-m 16 > $O/smoke_port_bm16.log 2>&1; echo "smoke port bm16 rc=$?"
grep -E "SMOKE|FAILED|==" $O/smoke_port_bm16.log | head -20
if [ "${MLA_SM90_CONTROL:-0}" = 1 ]; then
PYTHONUNBUFFERED=1 python3 $C/scripts/flashmla_port_smoke.py --flashmla-tree . --impl sm90 --dtype bf16 > $O/smoke_sm90.log 2>&1; echo "smoke sm90 rc=$?"
grep -E "SMOKE|FAILED|==" $O/smoke_sm90.log | head -10
fi
PYTHONUNBUFFERED=1 python3 $C/scripts/flashmla_port.py --out $O/bench.json > $O/bench.log 2>&1; echo "bench rc=$?"
cat $O/bench.log | tail -20
echo "== done $(date -u)"
touch $O/DONE
