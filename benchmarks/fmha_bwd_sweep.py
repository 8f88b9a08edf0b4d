"""A tuning sweep of kforge_fmha's backward in one call on a GPU host: build one library per
variant (compile-time knobs), then for each variant check its gradients and time it against SDPA's
backends in the same process, and write one table. Two paths (--path): `portable` (the mma.sync
kernel, csrc/fmha_bwd_kernel.cuh, knobs of csrc/fmha_bwd_config.h; VARIANTS) and `sm90` (the
sm_90a wgmma kernel, csrc/fmha_bwd_sm90.cuh, knobs KFORGE_FMHA_BWD_SM90_*; SM90_VARIANTS); the
workers run with KFORGE_FMHA_BWD_PATH set to it (the sm90 path refuses, rather than falls back,
where it cannot run; a row whose backward was not that path's kernel makes the variant BAD).

Build. One CMake build directory (--build-dir), configured once with every variant
(CMakeLists.txt's KFORGE_FMHA_SWEEP_VARIANTS): the units a variant changes (the backward units and
the C API for `portable`, the sm_90a backward units and the C API for `sm90`) are compiled per
variant with its definitions, the others once, and one `cmake --build` of --jobs makes all the
libraries, BUILD_DIR/variants/NAME/libkforge_fmha.so, in parallel. ptxas runs with -v: the main
kernel's registers and spills per variant go into the table. --dry-run (no GPU): only the
variants' units of the path's main kernel are compiled (--units narrows them), for the ptxas report;
--full-build also links the libraries.

Check. Per variant, in a fresh process (the library is loaded once per process), with
KFORGE_FMHA_BWD_PATH=--path: dQ, dK, dV of a few small shapes (bf16 and fp16, (128, 128) and
(64, 64), and for the portable path bf16 (192, 128); GQA 8/2, 1000 queries and keys: partial
blocks and the causal diagonal) against SDPA's
math backend in fp32, and against the first variant's gradients (each worker saves its own; the
parent compares them): the largest |diff| / max |first's|, which is summation order only (fp32 dQ
atomics; dK/dV summed over other query blocks when BM changes), about 1e-3 in bf16; a variant over
--max-diff, or whose error against fp32 exceeds 1.5x the first's + its dtype floor, is marked BAD
in the table and gets no ratios.

Time. benchmarks/fmha_bwd.py's bench_shape (its interleaved timing, median of --runs rounds): the
backward alone ("bwd" mode), kforge vs the --columns (sdpa-flash = FlashAttention-2's kernel;
sdpa-cudnn, the sm90 path's default second column), bf16, (128, 128) and (64, 64) (or the pair
the variant's knobs name; --head-dims 192,128,64 for all three, 192 meaning (192, 128) against
SDPA flash at (192, 192), FlashAttention-2's kernel counting its own FLOPs), seqlen 4k and 8k (batch x seqlen = 16k tokens, 2048 // d_v heads), causal and not. The variants' workers run
side by side, one per GPU (--gpus, default: every GPU nvidia-smi lists).

    # on the GPU host, from the repository root (writes $OUT/fmha_bwd_sweep.{md,json})
    python benchmarks/fmha_bwd_sweep.py --out $OUT/fmha_bwd_sweep
    python benchmarks/fmha_bwd_sweep.py --variants base,n128,n128-v4 --runs 20 --out ...
    python benchmarks/fmha_bwd_sweep.py --path sm90 --variants base,dkss,dqsmem,dkss-dqsmem \
        --jobs 60 --out $OUT/sm90sweep
    python benchmarks/fmha_bwd_sweep.py --list [--path sm90]
    # without a GPU: compile the variants' units (or some) and report ptxas, no timing
    python benchmarks/fmha_bwd_sweep.py --dry-run --variants base,dqv4
    python benchmarks/fmha_bwd_sweep.py --dry-run --path sm90 --variants base,dkss --units bf16

Accuracy (portable path). Then tests/test_bwd_gpu.py -k custom_softmax_scale (--accuracy) with
the first variant's library, after the default forward and after the portable one
(KFORGE_FMHA_SM90=0): issue 31's failing case, with the test's corrected reference.

Variants over sm_120's 99 KiB of shared memory a block build with KFORGE_FMHA_BWD_SMEM_LIMIT
raised (the build is for 90a only); a winner among them needs a shape that fits sm_120 (or an
sm_120 row of its own) before it can become a default.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FMHA = ROOT / "kernels" / "fmha"
BIG = "KFORGE_FMHA_BWD_SMEM_LIMIT=232448"  # sweep-only: tiles over sm_120's 101,376 B
# The 16-key slabs' tiles (the defaults before warp pairs): the older variants below start from them.
SLABS_128 = ["KFORGE_FMHA_BWD_128_WARP_PAIRS=0"]
SLABS_64 = ["KFORGE_FMHA_BWD_64_WARP_PAIRS=0"]
MT2_128 = [*SLABS_128, "KFORGE_FMHA_BWD_128_SPLIT=2", "KFORGE_FMHA_BWD_128_MT=2"]  # 4 warps: 64 keys
MT2_64 = [*SLABS_64, "KFORGE_FMHA_BWD_64_SPLIT=2", "KFORGE_FMHA_BWD_64_MT=2"]  # 8 warps: 128 keys
PAIRS_128 = ["KFORGE_FMHA_BWD_128_WARP_PAIRS=1", "KFORGE_FMHA_BWD_128_SPLIT=2"]  # + _MT
PAIRS_64 = ["KFORGE_FMHA_BWD_64_WARP_PAIRS=1", "KFORGE_FMHA_BWD_64_SPLIT=2"]

# name -> (definitions, what it tests). The first variant is the baseline of the diff column.
VARIANTS: dict[str, tuple[list[str], str]] = {
    "base": ([], "the defaults: warp pairs; (128,128) 4 warps, 64 keys x 32 queries, 32-key "
                 "slabs; (64,64) 4 warps, 128 x 32, 64-key slabs"),
    "slabs": ([*SLABS_128, *SLABS_64], "the 16-key slabs (the defaults before warp pairs): "
              "(128,128) 4 warps, 64 keys x 32 queries; (64,64) 8 warps, 128 x 64"),
    "dqv4": (["KFORGE_FMHA_BWD_DQ_V4=1"], "dQ adds as red.global.add.v4.f32 (half the reductions); "
             "ptxas: 16 spill bytes in the non-causal (128,128) kernel"),
    "n128-v4": ([*SLABS_128, "KFORGE_FMHA_BWD_128_WARPS=8", "KFORGE_FMHA_BWD_DQ_V4=1", BIG],
                "(128,128): 8 warps, 128 keys a CTA (half the dQ atomics and Q/dO loads a FLOP), "
                "v4 dQ; 109,056 B"),
    "m64-v4": ([*SLABS_128, "KFORGE_FMHA_BWD_128_BM=64", "KFORGE_FMHA_BWD_DQ_V4=1", BIG],
               "(128,128): 64 queries a step (half the barriers a FLOP), v4 dQ; 108,544 B"),
    "mt2-m64-qs16": ([*MT2_128, "KFORGE_FMHA_BWD_128_BM=64", "KFORGE_FMHA_BWD_128_QS=16", BIG],
                     "(128,128): 32-key slabs of 2 warps (each operand fragment feeds 2 m-tiles), "
                     "64 queries, 16-query S slices; 117,760 B"),
    "mt2-m64-ku4": ([*MT2_128, "KFORGE_FMHA_BWD_128_BM=64", "KFORGE_FMHA_BWD_128_KUNROLL=4", BIG],
                    "(128,128): 32-key slabs, 64 queries, 32-query S slices (FA2's per-warp S "
                    "tile), k-loops unrolled by 4; 117,760 B; ptxas (nvcc 13.0): 4 spill bytes "
                    "in the causal kernel"),
    "h64-mt2": ([*MT2_64, "KFORGE_FMHA_BWD_64_BM=64", "KFORGE_FMHA_BWD_64_QS=32", BIG],
                "(64,64): 32-key slabs of 2 warps, 128 keys x 64 queries; 103,424 B"),
    "h64-mt2-do1": ([*MT2_64, "KFORGE_FMHA_BWD_64_BM=64", "KFORGE_FMHA_BWD_64_QS=32",
                     "KFORGE_FMHA_BWD_64_DOBUF=1"],
                    "h64-mt2 with one dO buffer (the next dO loads under dK and dQ): fits sm_120 "
                    "(95,232 B), no spills on sm_80 / sm_90a / sm_120a"),
    "h64-mt2-m128-v4": ([*MT2_64, "KFORGE_FMHA_BWD_64_BM=128", "KFORGE_FMHA_BWD_64_QS=32",
                         "KFORGE_FMHA_BWD_DQ_V4=1", BIG],
                        "(64,64): 32-key slabs, 128 keys x 128 queries, v4 dQ; 169,984 B"),
    "h64-m128-v4": ([*SLABS_64, "KFORGE_FMHA_BWD_64_BM=128", "KFORGE_FMHA_BWD_DQ_V4=1", BIG],
                    "(64,64): 128 queries a step (FA2's hdim-64 tile), v4 dQ; 135,168 B"),
    # more, not in the default list (--variants NAME):
    "n128": ([*SLABS_128, "KFORGE_FMHA_BWD_128_WARPS=8", BIG], "n128-v4 without v4; 109,056 B"),
    "m64": ([*SLABS_128, "KFORGE_FMHA_BWD_128_BM=64", BIG], "m64-v4 without v4; 108,544 B"),
    "n128-m64-v4": ([*SLABS_128, "KFORGE_FMHA_BWD_128_WARPS=8", "KFORGE_FMHA_BWD_128_BM=64",
                     "KFORGE_FMHA_BWD_DQ_V4=1", BIG],
                    "(128,128): 128 keys x 64 queries with 16-key slabs, v4 dQ; 150,528 B"),
    "mt2-qs16": ([*MT2_128, "KFORGE_FMHA_BWD_128_QS=16"],
                 "(128,128): 32-key slabs, 64 keys x 32 queries: fits sm_120 (76,288 B); ptxas: "
                 "a few spill bytes in the non-causal kernel"),
    "mt2-m64-qs16-v4": ([*MT2_128, "KFORGE_FMHA_BWD_128_BM=64", "KFORGE_FMHA_BWD_128_QS=16",
                         "KFORGE_FMHA_BWD_DQ_V4=1", BIG], "mt2-m64-qs16 + v4 dQ"),
    "mt2-m64-ku4-v4": ([*MT2_128, "KFORGE_FMHA_BWD_128_BM=64", "KFORGE_FMHA_BWD_128_KUNROLL=4",
                        "KFORGE_FMHA_BWD_DQ_V4=1", BIG],
                       "mt2-m64-ku4 + v4 dQ; ptxas: 28 spill bytes in the non-causal kernel"),
    "mt2-m64-qs16-do1": ([*MT2_128, "KFORGE_FMHA_BWD_128_BM=64", "KFORGE_FMHA_BWD_128_QS=16",
                          "KFORGE_FMHA_BWD_128_DOBUF=1"],
                         "mt2-m64-qs16 with one dO buffer: exactly sm_120's 101,376 B; ptxas: "
                         "12-28 spill bytes on sm_90a / sm_80, none on sm_120a"),
    "h64-m128": ([*SLABS_64, "KFORGE_FMHA_BWD_64_BM=128", BIG], "h64-m128-v4 without v4"),
    "ku2": ([*SLABS_128, "KFORGE_FMHA_BWD_128_KUNROLL=2"], "(128,128): k-loops unrolled by 2"),
    "wide-ku1": (["KFORGE_FMHA_BWD_192_KUNROLL=1"],
                 "(192,128) / (128,192): the S^T / dP^T k-loops rolled, as before they were fully "
                 "unrolled (the old default; times (192,128))"),
    "fullload0": (["KFORGE_FMHA_BWD_FULL_TILE_LOADS=0"],
                  "Q / dO tiles always with load_tile's per-chunk bounds (the old loads; the default "
                  "skips them where the whole query block is in the sequence)"),
    "dqwm2": ([*SLABS_128, "KFORGE_FMHA_BWD_128_DQWM=2"],
              "(128,128): dQ = dS K split 2 x 2 over the warps (16 queries x 64 columns a warp, 20 "
              "ldmatrix a step), as before the 1 x 4 default (32 x 32: 16); the same sums"),
    "kxor": (["KFORGE_FMHA_BWD_KLOOP_XOR=1"],
             "rolled S^T / dP^T k-loops ((64,64): 2 x 2 steps) with each step's swizzled offsets "
             "toggled by the group (one LOP3), not recomputed: 44 -> 39 instructions a group; the "
             "same addresses (times (64,64))"),
    "bulk": (["KFORGE_FMHA_BWD_DQ_BULK=1"],
             "dQ staged in shared memory and added by bulk reductions a row at a time (sm_90+; "
             "where the tile has room under 99 KiB: (128,128) 99,840 B, (64,64) 86,528 B)"),
    "pairs": ([*PAIRS_128, "KFORGE_FMHA_BWD_128_MT=2"],
              "(128,128): warp pairs, 4 warps, 64 keys x 32 queries (two 32-key slabs; one warp "
              "S^T, P^T, dV, the other dP^T, dS^T, dK; P^T handed over in fp32): 0.40 ldmatrix a "
              "mma against 0.60; 79,360 B (the default)"),
    "h64-pairs": ([*PAIRS_64, "KFORGE_FMHA_BWD_64_WARPS=4", "KFORGE_FMHA_BWD_64_MT=2",
                   "KFORGE_FMHA_BWD_64_BM=64", "KFORGE_FMHA_BWD_64_QS=64"],
                  "(64,64): warp pairs, 4 warps, 64 keys x 64 queries; 75,776 B"),
    "h64-pairs-mt4": ([*PAIRS_64, "KFORGE_FMHA_BWD_64_WARPS=4", "KFORGE_FMHA_BWD_64_MT=4",
                       "KFORGE_FMHA_BWD_64_BM=32", "KFORGE_FMHA_BWD_64_QS=32"],
                      "(64,64): warp pairs of 64-key slabs, 4 warps, 128 keys x 32 queries; "
                      "76,288 B (the default)"),
    "wide": (["KFORGE_FMHA_BWD_128_WIDE=1"],
             "(128,128): the wide-step kernel (fmha_bwd_wide.cuh): 8 warps, 64 keys x 64 queries a "
             "step, every product split over the 8 warps (FlashAttention-2's 99 KiB structure)"),
    "wide-vreg": (["KFORGE_FMHA_BWD_128_WIDE=1", "KFORGE_FMHA_BWD_WIDE_VREG=1"],
                  "wide, each warp's V fragments held in registers (64 a thread) for dP"),
    "wide-vreg2": (["KFORGE_FMHA_BWD_128_WIDE=1", "KFORGE_FMHA_BWD_WIDE_VREG=2"],
                   "wide-vreg, P and dS in V's place, dO double-buffered: two barriers a step"),
    "wide-vreg2-o1": (["KFORGE_FMHA_BWD_128_WIDE=1", "KFORGE_FMHA_BWD_WIDE_VREG=2",
                       "KFORGE_FMHA_BWD_WIDE_ORDER=1"],
                      "wide-vreg2, dQ and its adds first, then dV, dK"),
    "wide-vreg2-o2": (["KFORGE_FMHA_BWD_128_WIDE=1", "KFORGE_FMHA_BWD_WIDE_VREG=2",
                       "KFORGE_FMHA_BWD_WIDE_ORDER=2"],
                      "wide-vreg2, dV, then dQ and its adds, then dK"),
    "ptbf16": (["KFORGE_FMHA_BWD_PT_BF16=1"],
               "warp pairs: P^T handed over in the input dtype (half the bytes; dS^T from the "
               "rounded P^T)"),
    "pairs192": (["KFORGE_FMHA_BWD_192_WARP_PAIRS=1"],
                 "(192,128) / (128,192): warp pairs of 16-key slabs (one warp S^T, P^T, dV; the "
                 "other dP^T, dS^T, dK), 8 warps, 64 keys x 32 queries; 95,488 B"),
    "pairs192-qs16": (["KFORGE_FMHA_BWD_192_WARP_PAIRS=1", "KFORGE_FMHA_BWD_192_QS=16"],
                      "pairs192 in two query slices of 16 (fewer registers live, fragments of "
                      "K / V reloaded per slice)"),
    "prev": (["KFORGE_FMHA_BWD_192_KUNROLL=1", "KFORGE_FMHA_BWD_FULL_TILE_LOADS=0"],
             "wide-ku1 + fullload0: the kernel before the address-math changes (but for the step "
             "counters, which replace a division with the same values); time with --head-dims "
             "192,128,64"),
}
DEFAULT_VARIANTS = ["base", "slabs", "dqv4", "bulk", "h64-pairs", "n128-v4", "m64-v4"]

# The sm_90a backward's knobs (csrc/fmha_bwd_sm90.cuh; --path sm90). Same format as VARIANTS.
SM90_DK_SS = "KFORGE_FMHA_BWD_SM90_DK_SS=1"
SM90_DQ_SMEM = "KFORGE_FMHA_BWD_SM90_DQ_SMEM=1"  # the default since 2026-11-27 14:31
SM90_RED = "KFORGE_FMHA_BWD_SM90_DQ_SMEM=0"
SM90_DEFER = "KFORGE_FMHA_BWD_SM90_DEFER_DK=2"
SM90_DEFER64 = "KFORGE_FMHA_BWD_SM90_DEFER_DK=1"
SM90_DQ_ROWS = "KFORGE_FMHA_BWD_SM90_DQ_TMA=0"
SM90_TL_ORDER = "KFORGE_FMHA_BWD_SM90_TL_ORDER=1"
SM90_TL_NOSTM = "KFORGE_FMHA_BWD_SM90_TL_STMATRIX=0"
SM90_VARIANTS: dict[str, tuple[list[str], str]] = {
    "base": ([], "the defaults: fixed-length calls run the TMA-loads kernel (fmha_bwd_sm90_tl.cuh: one "
                 "barrier a step, FlashAttention-3's step order), the others the cp.async kernel (S^T, "
                 "dP^T, dV, dK, dQ each waited for in turn, dK from dS registers, dQ by 2-D TMA "
                 "reductions from shared memory, 3 load stages)"),
    "dqrows": ([SM90_DQ_ROWS], "dQ by one bulk reduction a row (DQ_SMEM), 2 load stages: the default "
                               "from 2026-11-27 14:31 to 22:56"),
    "red": ([SM90_DQ_ROWS, SM90_RED], "dQ by red.global.add from registers (.v4 at hdim 64): the default "
                        "before 2026-11-27 14:31"),
    "dkss": ([SM90_DK_SS], "dS^T to shared memory first, dK += dS^T Q from there (SS wgmma, no dS "
                           "registers), dV overlapped with the dS math, one wait for dV/dK/dQ (with "
                           "the default DQ_TMA kernel since 2026-11-27 22:56)"),
    "dqsmem": ([SM90_DQ_ROWS, SM90_DQ_SMEM], "dQ tile to shared memory, one 256-byte bulk reduction "
                               "(cp.reduce.async.bulk add.f32) per row and warp lane, +36 KiB"),
    "dkss-dqsmem": ([SM90_DK_SS, SM90_DQ_ROWS, SM90_DQ_SMEM], "dkss + dqsmem; ptxas (nvcc 13.0): 8 spill bytes "
                    "in the causal hdim-128 kernels"),
    "dkss-defer": ([SM90_DK_SS, SM90_DEFER], "dkss, dK issued after dQ and waited for after the dQ "
                   "adds (which overlap it); ptxas: 8-16 spill bytes at hdim 128"),
    "dkss-dqsmem-defer": ([SM90_DK_SS, SM90_DQ_ROWS, SM90_DQ_SMEM, SM90_DEFER], "dkss-dqsmem + defer; ptxas: "
                          "16-32 spill bytes at hdim 128"),
    # more, not in the default list (--variants NAME):
    "dkss-dqsmem-defer64": ([SM90_DK_SS, SM90_DQ_ROWS, SM90_DQ_SMEM, SM90_DEFER64],
                            "dkss-dqsmem, defer at hdim 64 only (hdim 128 as dkss-dqsmem)"),
    "dkss-defer64": ([SM90_DK_SS, SM90_DEFER64], "dkss, defer at hdim 64 only: no spills anywhere"),
    "dqv2": (["KFORGE_FMHA_BWD_SM90_DQ_V4=0"], "dQ adds as .v2 at hdim 64 too (the v4 shuffles off)"),
    # the TMA-loads kernel's knobs (csrc/fmha_bwd_sm90_tl.cuh; fixed-length calls run it)
    "tl-order": ([SM90_TL_ORDER], "TL kernel: dK issued right behind dV, before the step's barrier; one "
                                  "wait for dV, dK and dQ (11:47: -3 to -8% at hdim 128)"),
    "tl-nostm": ([SM90_TL_NOSTM], "TL kernel: the dS^T tile stored with 4-byte stores (the stmatrix.x4 "
                                  "stores are the default since 2026-11-28 11:47)"),
    "tl-order-nostm": ([SM90_TL_ORDER, SM90_TL_NOSTM], "tl-order + tl-nostm"),
    "tl-epi0": (["KFORGE_FMHA_BWD_SM90_TL_EPILOGUE=0"], "TL kernel: dK and dV stored from the accumulators "
                                                       "(4-byte stores), not through shared memory"),
    "tl-dq0": (["KFORGE_FMHA_BWD_SM90_TL_DEFER_DQ=0"], "TL kernel: a step's dQ stores, proxy fence and TMA "
                                                      "reductions at the end of the step"),
}
SM90_DEFAULT_VARIANTS = ["base", "dqrows", "red", "dkss"]
# What each path compiles per variant (CMakeLists.txt's KFORGE_FMHA_SWEEP_UNITS), its main
# kernel's units (a dry run compiles only these) and its default reference columns.
PATHS = {
    "portable": {"units": "fmha_bwd_|fmha_api", "main": r"fmha_bwd_(fp16|bf16)_hdim",
                 "columns": "sdpa-flash", "kernel": "bwd_mma_sync", "accuracy": "custom_softmax_scale"},
    "sm90": {"units": "fmha_bwd_sm90_|fmha_api", "main": r"fmha_bwd_sm90_",
             "columns": "sdpa-flash,sdpa-cudnn", "kernel": "bwd_sm90_wgmma", "accuracy": ""},
}

CHECK_SHAPES = [  # (dtype, d_qk, causal): batch 2, 1000 queries and keys, 8 heads on 2 kv heads
    ("bf16", 128, True), ("bf16", 128, False), ("fp16", 128, True), ("bf16", 64, True),
    ("bf16", 64, False), ("bf16", 192, True), ("bf16", 192, False)]
FLOOR = {"bf16": 8e-3, "fp16": 1e-3}
DEVICE = "cuda"  # the worker's device (a CPU smoke test of the worker's plumbing sets "cpu")


def pair_of(d_qk: int) -> tuple[int, int]:
    """The (d_qk, d_v) pair a head dim of the sweep stands for: 192 is (192, 128), FlashMLA's
    dense prefill (the wide pairs' knobs are KFORGE_FMHA_BWD_192_*); the others are (d, d)."""
    return (192, 128) if d_qk == 192 else (d_qk, d_qk)


def variant_dims(defines: list[str]) -> list[int]:
    """The head dims a variant changes (its timed rows): 192, 128 or 64 when its definitions name
    only that pair, else 128 and 64 (--head-dims overrides it for every variant)."""
    named = [d for d in (192, 128, 64) if any(f"_{d}_" in x for x in defines)]
    return named if len(named) == 1 else [128, 64]


# --- pure parts ----------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(\S+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_KERNEL = re.compile(r"fmha_bwd_kernelI(13__nv_bfloat16|6__half)Li(\d+)ELi(\d+)ELb([01])E")
# the sm_90a kernel's last template flag, where it has one: DQ_TMA's kernel (1) or DQ_SMEM's (0)
_KERNEL_SM90 = re.compile(r"fmha_bwd_sm90_kernelI(13__nv_bfloat16|6__half)Li(\d+)ELb([01])E(?:Lb([01])E)?")
_NINJA_UNIT = re.compile(r"^\[[\d/% ]+\] .*CMakeFiles/kforge_fmha_v_(.+?)\.dir/")


def parse_ptxas(text: str) -> list[dict]:
    """The main backward kernels in ptxas -v output: one dict per (kernel, arch) with path
    (portable or sm90), dtype, d_qk, d_v, causal, arch, registers, stack and spill bytes."""
    out, cur = [], None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = None
            k = _KERNEL.search(m.group(1))
            if k:
                cur = {"path": "portable", "dtype": "bf16" if "bfloat16" in k.group(1) else "fp16",
                       "d_qk": int(k.group(2)), "d_v": int(k.group(3)), "causal": k.group(4) == "1",
                       "arch": m.group(2)}
            k = _KERNEL_SM90.search(m.group(1))
            if k:
                cur = {"path": "sm90", "dtype": "bf16" if "bfloat16" in k.group(1) else "fp16",
                       "d_qk": int(k.group(2)), "d_v": int(k.group(2)), "causal": k.group(3) == "1",
                       "arch": m.group(2), "dq_tma": k.group(4) == "1"}
            if cur is not None:
                out.append(cur)
            continue
        if cur is None:
            continue
        m = _SPILL.search(line)
        if m:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = _REGS.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            cur = None
    return out


def split_ninja_output(text: str) -> dict[str, str]:
    """A build's output per sweep variant: the lines after each "[i/n] ... CMakeFiles/
    kforge_fmha_v_NAME.dir/..." step line (ninja prints a step's output right after its line)
    go to NAME; the common units' lines to no one."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith("["):
            m = _NINJA_UNIT.match(line)
            cur = m.group(1) if m else None
            continue
        if cur is not None:
            out.setdefault(cur, []).append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def ptxas_summary(kernels: list[dict], d: int, path: str = "portable", d_v: int | None = None) -> str:
    """'regs a/b, spills 0' over the causal/non-causal (and dtype) kernels of head dims (d, d_v)
    (d_v: d unless given)."""
    d_v = d if d_v is None else d_v
    ks = [k for k in kernels if k["d_qk"] == d and k["d_v"] == d_v and "registers" in k
          and k.get("path", "portable") == path]
    if not ks:
        return "n/a"
    regs = sorted({k["registers"] for k in ks})
    spill = max(k.get("spill_stores", 0) + k.get("spill_loads", 0) + k.get("stack", 0) for k in ks)
    return f"{regs[0]}-{regs[-1]} regs, " + ("no spills" if spill == 0 else f"SPILLS {spill} B")


def render(meta: dict, results: list[dict]) -> str:
    refs = meta.get("columns", ["sdpa-flash"])
    lines = [f"## kforge_fmha {meta.get('path', 'portable')} backward: tuning sweep", "",
             f"Device: {meta.get('device', 'n/a')}; torch {meta.get('torch', 'n/a')}; built for "
             f"{meta['arch']}; {meta['date']}; `{meta['command']}`. Ratios: kforge TFLOP/s / "
             f"{' and '.join(refs)} TFLOP/s in the same process (backward alone, median of "
             f"{meta['runs']} rounds). diff: max |Δ| / max |{meta['baseline']}'s| over dQ, dK, dV; "
             "err: max |Δ| vs fp32 SDPA math, as a multiple of the baseline's.", ""]
    cols = []
    for r in results:
        for row in r.get("rows", []):
            key = (row["d_qk"], row["seqlen"], row["causal"])
            if key not in cols:
                cols.append(key)
    head = ["variant", "ptxas (128)", "ptxas (64)", "ptxas (192x128)", "diff", "err x", "verdict"]
    head += [f"d{d} L{s // 1024}k {'c' if c else 'nc'}" for d, s, c in cols]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in results:
        rows = {(x["d_qk"], x["seqlen"], x["causal"]): x for x in r.get("rows", [])}
        cells = [r["name"], r.get("ptxas128", "n/a"), r.get("ptxas64", "n/a"), r.get("ptxas192", "n/a"),
                 "n/a" if r.get("diff") is None else f"{r['diff']:.1e}",
                 "n/a" if r.get("err_ratio") is None else f"{r['err_ratio']:.2f}",
                 r.get("verdict", "n/a")]
        for key in cols:
            x = rows.get(key)
            if x is None or r.get("verdict") == "BAD":
                cells.append("n/a")
            else:
                ratios = [x.get("ratios", {}).get(c, x.get("ratio") if c == refs[0] else None)
                          for c in refs]
                tf = "n/a" if x.get("tflops") is None else f"{x['tflops']:.0f}"
                cells.append(" / ".join("n/a" if q is None else f"{q:.2f}" for q in ratios)
                             + f" ({tf})")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Cells: kforge/{' / kforge/'.join(refs)} (kforge TFLOP/s)."]
    for acc in meta.get("accuracy", []):
        lines.append(f"Accuracy, `{meta['baseline']}` library, {acc['forward']} forward: "
                     f"{acc['summary']}" + "".join(f"; {f}" for f in acc["failures"]))
    lines += ["", "Variants:", ""]
    for r in results:
        lines.append(f"- `{r['name']}`: {r['note']} (`{' '.join(r['defines']) or 'no -D'}`)"
                     + (f" — {r['error']}" if r.get("error") else ""))
    return "\n".join(lines) + "\n"


# --- build ---------------------------------------------------------------------------------------


def run_logged(cmd: list[str], log: Path, env=None) -> tuple[int, str]:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    text = res.stdout + res.stderr
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n" + text + "\n")
    return res.returncode, text


def build_variants(results: list[dict], build_dir: Path, arch: str, jobs: int, path: str,
                   log: Path, dry_run: bool, full_build: bool, units: str | None) -> None:
    """Configure one build directory with every variant (KFORGE_FMHA_SWEEP_VARIANTS) and build
    them together: results[i] gets lib (the variant's library), ptxas (its main kernels) and
    build_s, or error. A dry run (without full_build) compiles only the variants' units of the
    path's main kernel (those matching `units` too) and links nothing."""
    t0 = time.time()
    entries = [f"{r['name']}={','.join(r['defines'])}" for r in results]
    cfg = ["cmake", "-S", str(FMHA), "-B", str(build_dir), f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
           "-DCMAKE_BUILD_TYPE=Release", "-DKFORGE_FMHA_BUILD_TESTS=OFF",
           "-DKFORGE_FMHA_PTXAS_VERBOSE=ON", "-DKFORGE_FMHA_BWD_DEFINES=",
           f"-DKFORGE_FMHA_SWEEP_VARIANTS={';'.join(entries)}",
           f"-DKFORGE_FMHA_SWEEP_UNITS={PATHS[path]['units']}"]
    have_ninja = shutil.which("ninja") is not None
    if not (build_dir / "CMakeCache.txt").exists() and have_ninja:
        cfg += ["-G", "Ninja"]
    rc, text = run_logged(cfg, log)
    if rc != 0:
        for r in results:
            r["error"] = "cmake configure failed: " + text.strip().splitlines()[-1][:200]
        return
    ninja = (build_dir / "build.ninja").exists()
    if dry_run and not full_build and ninja:
        pick = re.compile(PATHS[path]["main"])
        res = subprocess.run(["ninja", "-C", str(build_dir), "-t", "targets", "all"],
                             capture_output=True, text=True)
        objs = [ln.split(":")[0] for ln in res.stdout.splitlines()
                if re.match(r"CMakeFiles/kforge_fmha_v_.+\.o:", ln)]
        targets = [o for o in objs if pick.search(o) and (not units or re.search(units, o))
                   and any(f"/kforge_fmha_v_{r['name']}.dir/" in o for r in results)]
    else:
        targets = [f"kforge_fmha_v_{r['name']}" for r in results]
    # -k 0: one variant that does not compile does not stop the others. Without ninja (make),
    # the parallel jobs' ptxas reports may interleave: the table's ptxas cells are then rough.
    if ninja:
        cmd = ["ninja", "-C", str(build_dir), "-k", "0", "-j", str(jobs), *targets]
    else:
        cmd = ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *targets, "--", "-k"]
    rc, text = run_logged(cmd, log)
    per_variant = split_ninja_output(text)
    failed = [ln for ln in text.splitlines() if ln.startswith("FAILED:")]
    for r in results:
        out = per_variant.get(r["name"], "")
        r["ptxas"] = parse_ptxas(out)
        r["build_s"] = round(time.time() - t0, 1)
        mine = [ln for ln in failed if f"kforge_fmha_v_{r['name']}.dir/" in ln
                or f"variants/{r['name']}/" in ln]
        if mine or (rc != 0 and not r["ptxas"]):
            err = [ln for ln in out.splitlines() if "error" in ln.lower()][:2] or mine[:1]
            r["error"] = "build failed: " + " / ".join(err)[:300]
            continue
        lib = build_dir / "variants" / r["name"] / "libkforge_fmha.so"
        if not (dry_run and not full_build):
            if not lib.exists():
                r["error"] = f"no {lib}"
                continue
            r["lib"] = str(lib)


# --- the per-variant worker (a fresh process: one library per process) ---------------------------


def worker(args) -> int:
    """Check and time one library; print one JSON line (the result) last."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fmha_bwd

    refs = [c for c in args.columns.split(",") if c]
    libs, missing = fmha_bwd.load_libs(["kforge", *refs])
    kf = libs["kforge"]
    assert Path(str(kf.library_path())).resolve() == Path(args.lib).resolve(), (
        f"loaded {kf.library_path()}, expected {args.lib}")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE
    out = {"device": device, "torch": torch.__version__, "checks": []}

    # gradients against fp32 SDPA math; saved for the parent, which compares them with the
    # baseline's (the variants run side by side)
    grads_path = Path(args.grads)
    mine = {}
    for dt, d, causal in CHECK_SHAPES:
        if args.path == "sm90" and d not in (64, 128):
            continue  # the sm_90a kernel has (64, 64) and (128, 128) only
        d_v = pair_of(d)[1]
        g = torch.Generator(device=DEVICE).manual_seed(d + 7 * causal)
        b, s, h, hk = 2, 1000, 8, 2

        def rnd(*shape, dt=dt, g=g):
            return torch.randn(*shape, device=DEVICE, generator=g).to(dtypes[dt])
        q, k, v, dout = rnd(b, s, h, d), rnd(b, s, hk, d), rnd(b, s, hk, d_v), rnd(b, s, h, d_v)
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        o = kf.attention(qq, kk, vv, causal=causal)
        ours = torch.autograd.grad(o, (qq, kk, vv), dout)
        q32, k32, v32 = (t.float().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.MATH):
            o32 = F.scaled_dot_product_attention(
                q32.transpose(1, 2), k32.repeat_interleave(h // hk, 2).transpose(1, 2),
                v32.repeat_interleave(h // hk, 2).transpose(1, 2), is_causal=causal)
        ref = torch.autograd.grad(o32.transpose(1, 2), (q32, k32, v32), dout.float())
        key = f"{dt}-{d}-{'c' if causal else 'nc'}"
        err = max((a.float() - r).abs().max().item() for a, r in zip(ours, ref, strict=True))
        out["checks"].append({"case": key, "err": err, "diff": None, "base_err": None,
                              "floor": FLOOR[dt]})
        mine[key] = {"grads": [t.cpu() for t in ours], "err": err}
    grads_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(mine, grads_path)

    # timing: fmha_bwd.py's bench_shape, kforge vs sdpa-flash, backward alone
    bargs = argparse.Namespace(warmup=args.warmup, runs=args.runs, order="shuffle", max_diff=0.05,
                               fa_192_dv=192)
    columns = [c for c in ("kforge", *refs) if c not in missing]
    dims = [int(x) for x in args.dims.split(",")]
    shapes = fmha_bwd.plan(["bf16"], [pair_of(d) for d in dims], args.seqlens, args.tokens, None,
                           [False, True])
    out["rows"] = []
    for shape in shapes:
        for row in fmha_bwd.bench_shape(shape, ["bwd"], columns, libs, bargs):
            res = row["results"]
            out["rows"].append({"d_qk": row["d_qk"], "seqlen": row["seqlen"], "causal": row["causal"],
                                "tflops": res["kforge"]["tflops"], "kernel": row.get("kernel"),
                                "ref_tflops": {c: res.get(c, {}).get("tflops") for c in refs},
                                "ref_errors": {c: res[c]["error"] for c in refs
                                               if res.get(c, {}).get("error")},
                                "ratios": {c: row["ratio"].get(c) for c in refs},
                                "ratio": row["ratio"].get(refs[0]) if refs else None})
            print(f"  {args.name}: d{row['d_qk']} L{row['seqlen']} causal={int(row['causal'])} "
                  f"kforge {res['kforge']['tflops'] or 0:.0f} "
                  + " ".join(f"{c} {res.get(c, {}).get('tflops') or 0:.0f}" for c in refs)
                  + f" TFLOP/s ({row.get('kernel')})", flush=True)
    print("RESULT " + json.dumps(out))
    return 0


def verdict(checks: list[dict], max_diff: float) -> tuple[str, float | None, float | None]:
    """BAD when a check differs from the baseline by more than max_diff, or its error against
    fp32 exceeds 1.5x the baseline's + the floor; else ok. Returns (verdict, worst diff, worst
    error ratio)."""
    diffs = [c["diff"] for c in checks if c.get("diff") is not None]
    ratios = [c["err"] / c["base_err"] for c in checks if c.get("base_err")]
    bad = any(c["diff"] is not None and c["diff"] > max_diff for c in checks) or any(
        c.get("base_err") is not None and c["err"] > 1.5 * c["base_err"] + c["floor"] for c in checks)
    bad = bad or any(c["err"] != c["err"] for c in checks)  # NaN
    return ("BAD" if bad else "ok"), (max(diffs) if diffs else None), (max(ratios) if ratios else None)


def compare_with_baseline(checks: list[dict], mine: dict, base: dict) -> None:
    """Fill each check's diff (max |Δ| / max |baseline's| over dQ, dK, dV) and base_err from the
    gradients a variant's worker saved (mine) and the baseline's (base): {case: {grads, err}}."""
    for c in checks:
        b = base.get(c["case"])
        if b is None or c["case"] not in mine:
            continue
        c["base_err"] = b["err"]
        c["diff"] = max((a.float() - bb.float()).abs().max().item()
                        / max(bb.float().abs().max().item(), 1e-30)
                        for a, bb in zip(mine[c["case"]]["grads"], b["grads"], strict=True))


def wrong_kernel(rows: list[dict], kernel: str) -> str | None:
    """The first row whose backward was not `kernel` (the path asked for), as a message."""
    for x in rows:
        if x.get("kernel") and kernel not in x["kernel"]:
            return f"d{x['d_qk']} L{x['seqlen']}: ran {x['kernel']}, not {kernel}"
    return None


def gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return max(1, len([v for v in visible.split(",") if v.strip()]))
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return max(1, sum(1 for ln in res.stdout.splitlines() if ln.startswith("GPU ")))
    except (OSError, subprocess.SubprocessError):
        return 1


# --- main ----------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", choices=sorted(PATHS), default="portable",
                    help="the backward kernel the variants tune (KFORGE_FMHA_BWD_PATH of the runs)")
    ap.add_argument("--variants", default=None,
                    help="comma-separated names (default: the path's default list)")
    ap.add_argument("--define", action="append", default=[], metavar="NAME=D1,D2",
                    help="an extra variant: a name and its comma-separated definitions")
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    ap.add_argument("--build-dir", type=Path, default=None,
                    help="default build/fmha-bwd-sweep (portable) or build/fmha-bwd-sweep-sm90")
    ap.add_argument("--arch", default="90a")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 4) - 2),
                    help="build jobs (default: all cores but 2)")
    ap.add_argument("--columns", default=None,
                    help="reference columns of fmha_bwd.py (default: sdpa-flash for portable, "
                         "sdpa-flash,sdpa-cudnn for sm90); the first one decides nothing, each gets "
                         "a ratio in the cells")
    ap.add_argument("--gpus", type=int, default=None,
                    help="variants run side by side, one per GPU (default: every GPU)")
    ap.add_argument("--seqlens", default="4096,8192")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--max-diff", type=float, default=2e-2)
    ap.add_argument("--dry-run", action="store_true",
                    help="compile the variants' main-kernel units, report ptxas (no GPU, no link)")
    ap.add_argument("--full-build", action="store_true", help="with --dry-run: link the libraries too")
    ap.add_argument("--units", default=None,
                    help="with --dry-run: a regex the compiled units' object paths must match (e.g. bf16)")
    ap.add_argument("--worker-timeout", type=int, default=240, help="seconds per variant's run")
    ap.add_argument("--accuracy", default=None,
                    help="pytest -k expression of tests/test_bwd_gpu.py run with the first variant's "
                         "library, after the default and the portable (KFORGE_FMHA_SM90=0) forward "
                         "(issue 31's failing case); empty: skip (the sm90 path's default)")
    ap.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--grads", help=argparse.SUPPRESS)
    ap.add_argument("--head-dims", default=None,
                    help="head dims to time for every variant, e.g. 192,128,64 (192: the pair "
                         "(192, 128), against SDPA flash at (192, 192)); default: the ones each "
                         "variant's knobs name, else 128,64")
    ap.add_argument("--dims", default="128,64", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.seqlens = [int(x) for x in args.seqlens.split(",")]
    cfg = PATHS[args.path]
    if args.columns is None:
        args.columns = cfg["columns"]
    if args.worker:
        return worker(args)
    if args.accuracy is None:
        args.accuracy = cfg["accuracy"]
    table, defaults = (SM90_VARIANTS, SM90_DEFAULT_VARIANTS) if args.path == "sm90" else (
        VARIANTS, DEFAULT_VARIANTS)
    variants = dict(table)
    for spec in args.define:
        name, _, defs = spec.partition("=")
        variants[name] = ([d for d in defs.split(",") if d], "from --define")
    if args.list:
        for name, (defs, note) in variants.items():
            print(f"{name:14s} {'*' if name in defaults else ' '} {note}\n{'':16s} {' '.join(defs) or '(defaults)'}")
        return 0
    names = [n.strip() for n in (args.variants or ",".join(defaults)).split(",") if n.strip()]
    names += [s.partition("=")[0] for s in args.define if s.partition("=")[0] not in names]
    unknown = [n for n in names if n not in variants]
    bad_names = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_.-]+", n)]
    if unknown or bad_names or len(set(names)) != len(names):
        print(f"fmha_bwd_sweep.py: unknown, repeated or unusable variant name(s) {unknown + bad_names}; "
              "--list shows them", file=sys.stderr)
        return 2
    t_start = time.time()
    default_dir = "fmha-bwd-sweep" + ("-sm90" if args.path == "sm90" else "")
    build_dir = (args.build_dir or ROOT / "build" / default_dir).resolve()
    log = build_dir / "sweep-build.log"
    results = [{"name": n, "defines": variants[n][0], "note": variants[n][1]} for n in names]
    meta = {"arch": args.arch, "runs": args.runs, "baseline": names[0], "path": args.path,
            "columns": [c for c in args.columns.split(",") if c],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(["python", "benchmarks/fmha_bwd_sweep.py", *(sys.argv[1:] if argv is None else argv)])}

    print(f"[{time.time() - t_start:6.0f} s] build {len(results)} variant(s) in {build_dir} "
          f"(-j {args.jobs}): {', '.join(names)}", flush=True)
    try:
        build_variants(results, build_dir, args.arch, args.jobs, args.path, log, args.dry_run,
                       args.full_build, args.units)
    except Exception as exc:  # noqa: BLE001 (reported in the table)
        for r in results:
            r.setdefault("error", f"build raised {exc!r}")
    for r in results:
        r["ptxas128"] = ptxas_summary(r.get("ptxas", []), 128, args.path)
        r["ptxas64"] = ptxas_summary(r.get("ptxas", []), 64, args.path)
        r["ptxas192"] = ptxas_summary(r.get("ptxas", []), 192, args.path, 128)
        print(f"           {r['name']}: (128,128) {r['ptxas128']}; (64,64) {r['ptxas64']}; "
              f"(192,128) {r['ptxas192']}"
              + (f"; {r['error']}" if r.get("error") else ""), flush=True)
    print(f"[{time.time() - t_start:6.0f} s] built", flush=True)

    if not args.dry_run:
        grads_dir = build_dir / "grads"
        shutil.rmtree(grads_dir, ignore_errors=True)
        n_gpus = args.gpus or gpu_count()
        todo = [r for r in results if "lib" in r]
        lock = threading.Lock()

        def run_one(r: dict, gpu: int) -> None:
            with lock:
                print(f"[{time.time() - t_start:6.0f} s] run {r['name']} on GPU {gpu}", flush=True)
            env = dict(os.environ, KFORGE_FMHA_LIBRARY=r["lib"], KFORGE_FMHA_BWD_PATH=args.path,
                       PYTHONPATH=os.pathsep.join([str(FMHA / "python"), os.environ.get("PYTHONPATH", "")]))
            if n_gpus > 1 or "CUDA_VISIBLE_DEVICES" not in os.environ:
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                ids = [v for v in visible.split(",") if v.strip()] if visible else None
                env["CUDA_VISIBLE_DEVICES"] = ids[gpu] if ids else str(gpu)
            r["grads"] = str(grads_dir / f"{r['name']}.pt")
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--lib", r["lib"],
                   "--name", r["name"], "--grads", r["grads"], "--warmup", str(args.warmup),
                   "--runs", str(args.runs), "--seqlens", ",".join(map(str, args.seqlens)),
                   "--tokens", str(args.tokens), "--path", args.path, "--columns", args.columns,
                   "--dims", args.head_dims or ",".join(map(str, variant_dims(r["defines"])))]
            try:
                res = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                     timeout=args.worker_timeout)
            except subprocess.TimeoutExpired:
                r["error"], r["verdict"] = f"run timed out after {args.worker_timeout} s", "BAD"
                return
            with lock:
                sys.stdout.write("".join(ln + "\n" for ln in res.stdout.splitlines()
                                         if not ln.startswith("RESULT ")))
                sys.stdout.flush()
            found = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
            if res.returncode != 0 or not found:
                r["error"] = "run failed: " + (res.stderr.strip().splitlines() or ["?"])[-1][:300]
                r["verdict"] = "BAD"
                return
            data = json.loads(found[-1][len("RESULT "):])
            meta.setdefault("device", data["device"])
            meta.setdefault("torch", data["torch"])
            r["checks"], r["rows"] = data["checks"], data["rows"]

        # one worker per GPU at a time, variants in their order
        queue = list(todo)
        qlock = threading.Lock()

        def gpu_loop(gpu: int) -> None:
            while True:
                with qlock:
                    if not queue:
                        return
                    r = queue.pop(0)
                run_one(r, gpu)

        threads = [threading.Thread(target=gpu_loop, args=(g,), daemon=True)
                   for g in range(min(n_gpus, max(1, len(todo))))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

        # gradients against the baseline's, then the verdicts
        import torch

        base_r = results[0]
        base = torch.load(base_r["grads"]) if Path(base_r.get("grads", "/nonexistent")).exists() else {}
        for i, r in enumerate(results):
            if "checks" not in r:
                r.setdefault("verdict", "BAD")
                continue
            if base and Path(r["grads"]).exists():
                compare_with_baseline(r["checks"], torch.load(r["grads"]), base)
            r["verdict"], r["diff"], r["err_ratio"] = verdict(r["checks"], args.max_diff)
            wrong = wrong_kernel(r["rows"], cfg["kernel"])
            if wrong:
                r["verdict"], r["error"] = "BAD", wrong
            elif i == 0:
                r["verdict"] = "baseline"
        print(f"[{time.time() - t_start:6.0f} s] ran", flush=True)
    if not args.dry_run and args.accuracy and results and "lib" in results[0]:
        meta["accuracy"] = []
        for fwd in ("default", "portable"):
            env = dict(os.environ, KFORGE_FMHA_LIBRARY=results[0]["lib"], KFORGE_REQUIRE_GPU="1",
                       PYTHONPATH=os.pathsep.join([str(FMHA / "python"), os.environ.get("PYTHONPATH", "")]))
            if fwd == "portable":
                env["KFORGE_FMHA_SM90"] = "0"
            cmd = [sys.executable, "-m", "pytest", str(FMHA / "tests" / "test_bwd_gpu.py"), "-q",
                   "-k", args.accuracy, "-p", "no:cacheprovider"]
            print(f"[{time.time() - t_start:6.0f} s] accuracy ({fwd} forward): pytest -k {args.accuracy!r}", flush=True)
            try:
                res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
                tail = (res.stdout.strip().splitlines() or ["?"])[-1]
                fails = [ln for ln in res.stdout.splitlines() if ln.startswith(("FAILED", "ERROR", "E   AssertionError"))]
            except subprocess.TimeoutExpired:
                tail, fails = "timed out", []
            print("           " + tail + "".join("\n           " + f[:300] for f in fails), flush=True)
            meta["accuracy"].append({"forward": fwd, "summary": tail, "failures": fails})
    text = render(meta, results)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_name(args.out.name + ".md").write_text(text)
        args.out.with_name(args.out.name + ".json").write_text(
            json.dumps({"meta": meta, "results": results}, indent=1, default=str) + "\n")
        print(f"wrote {args.out}.md, {args.out}.json")
    print(f"total {time.time() - t_start:.0f} s")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
