#!/usr/bin/env bash
# Same-run A/B of the compiler processes' malloc (issue 14): 16 concurrent nvcc compiles of one
# flash-attn unit on the GPU host, 8 with one allocator and 8 with another, so both halves share
# the same host, the same minute and the same contention. Two rounds: system vs mimalloc, then
# jemalloc vs system. It also lists the cubins' md5 (cuobjdump -xelf) of one compile per config.
#
#   OUT=<dir> SDIST=flash_attn-2.8.3.post2.tar.gz ALLOC_DIR=<dir with libmimalloc.so.2 and
#   libjemalloc.so.2> bash benchmarks/compiler_alloc_ab.sh
#
# The allocators are Debian bookworm's libmimalloc2.0 (2.0.9) and libjemalloc2 (5.3.0), taken with
# `apt-get download` and unpacked with `dpkg-deb -x`; LD_PRELOAD reaches cicc, ptxas, cudafe++ and
# gcc (all dynamically linked against glibc). Needs torch (for its headers), nvcc and cuobjdump.
# Writes $OUT/cal/{host.txt,times.txt,cubin-md5.txt}. Results: docs/benchmarks.md, issue 14.
set -u
SDIST=${SDIST:?the flash-attn 2.8.3.post2 sdist}
C=${ALLOC_DIR:?a folder with libmimalloc.so.2 and libjemalloc.so.2}
R=${OUT:?a results folder}/cal; mkdir -p "$R"
{ lscpu; echo; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; ldd --version | head -1; nproc; free -g; nvidia-smi --query-gpu=name,driver_version --format=csv; nvcc --version | tail -2; } > $R/host.txt 2>&1
rm -rf /tmp/fa; mkdir -p /tmp/fa/o && tar xzf "$SDIST" -C /tmp/fa
TI=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/include
PI=$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["include"])')
S=/tmp/fa/flash_attn-2.8.3.post2; U=${CAL_UNIT:-csrc/flash_attn/src/flash_fwd_hdim32_bf16_causal_sm80.cu}
one() { # cfg i env...
  cfg=$1; i=$2; shift 2; s=$(date +%s.%N)
  ( cd $S && env "$@" nvcc -I$S/csrc/flash_attn -I$S/csrc/flash_attn/src -I$S/csrc/cutlass/include -I$TI -I$TI/torch/csrc/api/include -I$PI -c $U -o /tmp/fa/o/$cfg-$i.o -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr --compiler-options '-fPIC' -O3 -std=c++17 -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math -gencode arch=compute_90,code=sm_90 --threads 1 -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=flash_attn_2_cuda -D_GLIBCXX_USE_CXX11_ABI=1 > /tmp/fa/o/$cfg-$i.log 2>&1 )
  rc=$?; e=$(date +%s.%N); echo "$cfg $i $rc $(python3 -c "print(round($e-$s,2))")" >> $R/times.txt
}
round() { # name cfgA envA cfgB envB
  echo "round $1 start $(date +%s)" >> $R/times.txt
  for i in 0 1 2 3 4 5 6 7; do one $2 $i $3 & one $4 $i $5 & done; wait
  echo "round $1 end $(date +%s)" >> $R/times.txt
}
round 1 system A=1 mimalloc LD_PRELOAD=$C/libmimalloc.so.2
round 2 jemalloc LD_PRELOAD=$C/libjemalloc.so.2 system A=1
for f in /tmp/fa/o/*-0.o; do cuobjdump -xelf all $f > /dev/null 2>&1; done
( cd /tmp/fa/o && for f in *-0.o; do mkdir -p x-$f && (cd x-$f && cuobjdump -xelf all ../$f >/dev/null 2>&1); done; md5sum x-*/* ) > $R/cubin-md5.txt 2>&1
echo CALDONE >> $R/times.txt
