// Tile shapes of the portable backward kernel (fmha_bwd_kernel.cuh), per (head_dim_qk,
// head_dim_v). Plain C++17, read by the C API (fmha_api.cpp: workspace sizes, the supported
// pairs) and by nvcc alike.
//
// One CTA owns BLOCK_N keys of one (kv head, batch) pair and loops over query blocks of BLOCK_M
// rows (and over the query heads of its GQA group). Each 16-key slab of the block belongs to
// SPLIT warps (BLOCK_N = 16 * WARPS / SPLIT), which hold its dK and dV accumulators in registers:
// SPLIT 1, one warp with whole rows ((head_dim_qk + head_dim_v) / 2 floats a thread); SPLIT 2, two
// warps with half the columns each (half that), for the wide head dims, where whole rows leave
// too few registers (255 a thread) for the rest. Warp pairs (the default at (64, 64) and
// (128, 128)) split a slab of 32 or 64 keys by role instead: one warp holds whole dV rows, the
// other whole dK rows (BwdTile::warp_pairs). Shared memory per CTA (2-byte elements): K and V
// of the key block, Q and dO of two query blocks (double buffered), dS^T (and with SPLIT 2 also
// P^T; with warp pairs an fp32 P^T hand-over tile instead) of one block with rows padded by 8
// elements, and LSE / D of two query blocks. Every pair fits sm_120's 99 KiB (101,376 bytes) per
// block; README.md has the ptxas table.
#pragma once

namespace kforge_fmha {

struct BwdTile {
  int head_dim_qk, head_dim_v;
  int warps;        // warps per CTA
  int split;        // warps per 16-key slab (1 or 2): BLOCK_N = 16 * warps / split
  int block_m;      // query rows per step
  int query_slice;  // query columns of S^T / dP^T a warp holds in registers at once
  int k_unroll;     // unroll of the S^T / dP^T k-loops (over the head dims): 1, 2, ... or 64 (all)
  int slab_mtiles = 1;  // 16-key m-tiles a slab: 1, or 2 (32-key slabs, SPLIT 2 only; a warp
                        // then reuses each Q / dO / P^T / dS^T fragment for two m-tiles)
  int do_buffers = 2;   // dO tiles in shared memory: 2, or 1 (SPLIT 2 only: the next step's dO
                        // loads once dV is done, under dK and dQ; saves BLOCK_M x d_v x 2 B)
  int dq_warps_m = 0;   // dQ = dS K: warps along the query rows (16-row tiles), the rest along
                        // the columns; 0, as many as the block's row tiles (at most warps). Fewer
                        // means more row tiles a warp: each K fragment feeds that many mma
  int warp_pairs = 0;   // 1: warp pairs (split 2; slab_mtiles 1 if d_qk != d_v): the two warps
                        // of a slab share its 16 slab_mtiles keys and all of the step's query
                        // columns; one computes S^T, P^T and holds dV, the other dP^T, dS^T and
                        // holds dK, P^T handed over through shared memory in fp32 (4 BLOCK_N x
                        // BLOCK_M bytes). Every fragment a warp loads feeds slab_mtiles m-tiles,
                        // whole rows of dK / dV stay in one warp's registers, and no P^T tile is
                        // read with ldmatrix
  int dq_bulk = -1;     // dQ's adds (KFORGE_FMHA_BWD_DQ_BULK's modes); -1: that macro's value
};

// The rows' (warps, split, block_m, query_slice, k_unroll, slab_mtiles, do_buffers, dq_warps_m,
// warp_pairs, dq_bulk), overridable one by one for tuning sweeps: KFORGE_FMHA_BWD_<PAIR>_{WARPS,
// SPLIT,BM,QS,KUNROLL,MT,DOBUF,WARP_PAIRS} with PAIR 64 or 128, KFORGE_FMHA_BWD_128_{DQWM,DQ_BULK},
// and KFORGE_FMHA_BWD_192_KUNROLL for the wide pairs (pass the same -D to the CUDA and the C++
// compiler: the API sizes the workspace from this table).
// Warp pairs (BwdTile::warp_pairs), the default at (64, 64) and (128, 128) (H200, 2026-11-27:
// 1.04-1.05x the 16-key slabs' TFLOP/s at (128, 128) non-causal, 0.99-1.00 causal; 1.00-1.05x at
// (64, 64)). 0 restores the slabs' defaults below (the tiles before warp pairs existed).
#ifndef KFORGE_FMHA_BWD_64_WARP_PAIRS
#define KFORGE_FMHA_BWD_64_WARP_PAIRS 1
#endif
#ifndef KFORGE_FMHA_BWD_128_WARP_PAIRS
#define KFORGE_FMHA_BWD_128_WARP_PAIRS 1
#endif
// (64, 64): pairs of 64-key slabs, 4 warps, 128 keys x 32 queries (76,288 B); without pairs,
// 16-key slabs, 8 warps, 128 keys x 64 queries (84,992 B).
#ifndef KFORGE_FMHA_BWD_64_WARPS
#define KFORGE_FMHA_BWD_64_WARPS (KFORGE_FMHA_BWD_64_WARP_PAIRS ? 4 : 8)
#endif
#ifndef KFORGE_FMHA_BWD_64_SPLIT
#define KFORGE_FMHA_BWD_64_SPLIT (KFORGE_FMHA_BWD_64_WARP_PAIRS ? 2 : 1)
#endif
#ifndef KFORGE_FMHA_BWD_64_BM
#define KFORGE_FMHA_BWD_64_BM (KFORGE_FMHA_BWD_64_WARP_PAIRS ? 32 : 64)
#endif
#ifndef KFORGE_FMHA_BWD_64_QS
#define KFORGE_FMHA_BWD_64_QS (KFORGE_FMHA_BWD_64_WARP_PAIRS ? 32 : 64)
#endif
#ifndef KFORGE_FMHA_BWD_64_KUNROLL
#define KFORGE_FMHA_BWD_64_KUNROLL 2  // all: spills (255 registers)
#endif
// (128, 128): pairs of 32-key slabs, 4 warps, 64 keys x 32 queries (79,360 B; 99,840 B with
// KFORGE_FMHA_BWD_128_DQ_BULK's staging); without pairs, 16-key slabs, the same block (71,168 B).
#ifndef KFORGE_FMHA_BWD_128_WARPS
#define KFORGE_FMHA_BWD_128_WARPS 4
#endif
#ifndef KFORGE_FMHA_BWD_128_SPLIT
#define KFORGE_FMHA_BWD_128_SPLIT (KFORGE_FMHA_BWD_128_WARP_PAIRS ? 2 : 1)
#endif
#ifndef KFORGE_FMHA_BWD_128_BM
#define KFORGE_FMHA_BWD_128_BM 32
#endif
#ifndef KFORGE_FMHA_BWD_128_QS
#define KFORGE_FMHA_BWD_128_QS 32
#endif

#ifndef KFORGE_FMHA_BWD_64_MT
#define KFORGE_FMHA_BWD_64_MT (KFORGE_FMHA_BWD_64_WARP_PAIRS ? 4 : 1)
#endif
#ifndef KFORGE_FMHA_BWD_128_MT
#define KFORGE_FMHA_BWD_128_MT (KFORGE_FMHA_BWD_128_WARP_PAIRS ? 2 : 1)
#endif
#ifndef KFORGE_FMHA_BWD_64_DOBUF
#define KFORGE_FMHA_BWD_64_DOBUF 2
#endif
#ifndef KFORGE_FMHA_BWD_128_DOBUF
#define KFORGE_FMHA_BWD_128_DOBUF 2
#endif

// dQ's warp split at (128, 128): 1, the 4 warps side by side along the columns (32 queries x 32
// columns a warp: each K fragment feeds both 16-row tiles, 16 ldmatrix for 32 mma a step); 2,
// 2 x 2 (16 queries x 64 columns: 20 ldmatrix), as before; 0, as many as the row tiles (the
// default of the other tiles a sweep sets). Same sums in the same order.
#ifndef KFORGE_FMHA_BWD_128_DQWM
#if KFORGE_FMHA_BWD_128_WARPS == 4 && KFORGE_FMHA_BWD_128_BM == 32
#define KFORGE_FMHA_BWD_128_DQWM 1
#else
#define KFORGE_FMHA_BWD_128_DQWM 0
#endif
#endif

#ifndef KFORGE_FMHA_BWD_128_KUNROLL
#define KFORGE_FMHA_BWD_128_KUNROLL 64  // H200: 0.73-0.80x SDPA flash against 0.64-0.68x at 1
#endif

// The wide pairs, (192, 128) and (128, 192): the S^T / dP^T k-loops fully unrolled (64), so
// every ldmatrix address is a register + an immediate and the loads of later k-steps issue ahead
// of the mma (no spills: 224-241 registers on sm_80, sm_90a, sm_120a with nvcc 13.0); 1 is the
// rolled loop of before (its swizzled addresses recomputed every k-step).
#ifndef KFORGE_FMHA_BWD_192_KUNROLL
#define KFORGE_FMHA_BWD_192_KUNROLL 64
#endif
// The wide pairs: 1, warp pairs (BwdTile::warp_pairs) with 16-key slabs: of the two warps of a
// slab, one computes S^T (d_qk) and P^T and holds whole dV rows (d_v), the other dP^T (d_v) and
// dS^T and holds whole dK rows (d_qk), so each role runs the same mma count; 8 warps, 64 keys x
// 32 queries (95,488 B). 0, two warps a slab with half of the dK and dV columns each (92,672 B):
// the default, since warp pairs ran 0.96-0.99x it at (192, 128) (H200, 2026-11-28, same run).
#ifndef KFORGE_FMHA_BWD_192_WARP_PAIRS
#define KFORGE_FMHA_BWD_192_WARP_PAIRS 0
#endif
// Their query slice (BwdTile::query_slice): the whole block with warp pairs, 16 without.
#ifndef KFORGE_FMHA_BWD_192_QS
#define KFORGE_FMHA_BWD_192_QS (KFORGE_FMHA_BWD_192_WARP_PAIRS ? 32 : 16)
#endif

// Q and dO tiles whose rows are all in the sequence (every query block but a sequence's last)
// load without load_tile's per-chunk bound and zero-fill select: 1 (default); 0, every tile with
// the bounds (as before). The same bytes reach the same shared-memory slots either way.
#ifndef KFORGE_FMHA_BWD_FULL_TILE_LOADS
#define KFORGE_FMHA_BWD_FULL_TILE_LOADS 1
#endif

// The rolled S^T / dP^T k-loops (k_unroll below the k-steps: (64, 64) by default) as a rolled
// loop over groups of k_unroll steps, each step's swizzled column offsets its unrolled offset with
// bits toggled by the group (kstep_off): 1; 0, SwzCols::at_dyn of the step (default). The same
// addresses, loads and mma in the same order.
#ifndef KFORGE_FMHA_BWD_KLOOP_XOR
#define KFORGE_FMHA_BWD_KLOOP_XOR 0
#endif

// dQ's adds on sm_90 and newer: 0, red.global.add.v2.f32 (two columns a lane, as the mma
// accumulators hold them); 1, red.global.add.v4.f32 after one lane swap (half the reductions,
// two shuffles per 4 values). builds for sm_80 / sm_86 / sm_89 use two atomicAdd either way.
#ifndef KFORGE_FMHA_BWD_DQ_V4
#define KFORGE_FMHA_BWD_DQ_V4 0
#endif

// dQ's adds on sm_90 and newer: 0, red.global.add per lane (KFORGE_FMHA_BWD_DQ_V4 picks v2 or
// v4); 1, each warp stages its dQ tile in shared memory (fp32, rows padded by 8 floats) and its
// lanes add one row each with a bulk reduction (cp.reduce.async.bulk .add.f32): one instruction
// a row instead of one a lane and 2 or 4 columns, issued by the TMA unit, not the warp's memory
// pipe; 2, the same staging, then each lane reads a row-contiguous float4 back and adds it with
// red.global.add.v4.f32 (whole 128-byte rows an instruction, no bulk unit). The deterministic
// mode and sm_80 / sm_86 / sm_89 builds add from the fragments either way. A mode that stages
// takes effect only on a tile with room for the staging under sm_120's 99 KiB. This macro is
// every tile's mode but (128, 128)'s, which has its own, KFORGE_FMHA_BWD_128_DQ_BULK: 2 with
// warp pairs (H200, 2026-11-27, same run: 1.03-1.04x the fragments' adds at (128, 128); at
// (64, 64) mode 2 was 0.92-0.96x, so it stays 0 there).
#ifndef KFORGE_FMHA_BWD_DQ_BULK
#define KFORGE_FMHA_BWD_DQ_BULK 0
#endif
#ifndef KFORGE_FMHA_BWD_128_DQ_BULK
#define KFORGE_FMHA_BWD_128_DQ_BULK (KFORGE_FMHA_BWD_128_WARP_PAIRS ? 2 : KFORGE_FMHA_BWD_DQ_BULK)
#endif
static_assert(KFORGE_FMHA_BWD_DQ_BULK >= 0 && KFORGE_FMHA_BWD_DQ_BULK <= 2 &&
                  KFORGE_FMHA_BWD_128_DQ_BULK >= 0 && KFORGE_FMHA_BWD_128_DQ_BULK <= 2,
              "KFORGE_FMHA_BWD_DQ_BULK: 0, 1 or 2");

// Warp pairs: P^T handed over from role 0 to role 1 in fp32 (0, default) or in the input dtype
// (1: the packed fragments role 0 makes for dV anyway; half the bytes, but dS^T = P^T (dP^T - D)
// then starts from the rounded P^T, unlike FlashAttention-2's).
#ifndef KFORGE_FMHA_BWD_PT_BF16
#define KFORGE_FMHA_BWD_PT_BF16 0
#endif

// (128, 128): 1, the wide-step kernel (fmha_bwd_wide.cuh: 8 warps, 64 keys x 64 queries a step,
// every product split over the 8 warps) for calls that are not deterministic; 0, the warp pairs.
#ifndef KFORGE_FMHA_BWD_128_WIDE
#define KFORGE_FMHA_BWD_128_WIDE 0
#endif
// The wide-step kernel's variants: KFORGE_FMHA_BWD_WIDE_VREG 1, each warp's V fragments in
// registers (64 a thread at head dim 128) for dP; 2, that, with P and dS in V's place and two dO
// buffers (two barriers a step instead of three). KFORGE_FMHA_BWD_WIDE_ORDER: the products after
// P and dS, 0 dV, dK, dQ; 1 dQ (its adds first), dV, dK; 2 dV, dQ, dK.
#ifndef KFORGE_FMHA_BWD_WIDE_VREG
#define KFORGE_FMHA_BWD_WIDE_VREG 0
#endif
#ifndef KFORGE_FMHA_BWD_WIDE_ORDER
#define KFORGE_FMHA_BWD_WIDE_ORDER 0
#endif

// Diagnostics for tuning sweeps only: the gradients are WRONG with any bit set. A bit removes
// one part of every step of the portable main kernel, so that a sweep times what the rest costs:
// 1, the dQ adds (the dQ product stays); 2, the whole dQ product and its adds; 4 (warp pairs),
// the P^T hand-over and its barrier (role 1 takes P^T = 1); 8 (warp pairs), the dV / dK product.
#ifndef KFORGE_FMHA_BWD_DIAG
#define KFORGE_FMHA_BWD_DIAG 0
#endif

inline constexpr BwdTile kBwdTiles[] = {
    {64, 64, KFORGE_FMHA_BWD_64_WARPS, KFORGE_FMHA_BWD_64_SPLIT, KFORGE_FMHA_BWD_64_BM,
     KFORGE_FMHA_BWD_64_QS, KFORGE_FMHA_BWD_64_KUNROLL, KFORGE_FMHA_BWD_64_MT,
     KFORGE_FMHA_BWD_64_DOBUF, 0, KFORGE_FMHA_BWD_64_WARP_PAIRS},
    {128, 128, KFORGE_FMHA_BWD_128_WARPS, KFORGE_FMHA_BWD_128_SPLIT, KFORGE_FMHA_BWD_128_BM,
     KFORGE_FMHA_BWD_128_QS, KFORGE_FMHA_BWD_128_KUNROLL, KFORGE_FMHA_BWD_128_MT,
     KFORGE_FMHA_BWD_128_DOBUF, KFORGE_FMHA_BWD_128_DQWM, KFORGE_FMHA_BWD_128_WARP_PAIRS,
     KFORGE_FMHA_BWD_128_DQ_BULK},
    {192, 128, 8, 2, 32, KFORGE_FMHA_BWD_192_QS, KFORGE_FMHA_BWD_192_KUNROLL, 1, 2, 0,
     KFORGE_FMHA_BWD_192_WARP_PAIRS},
    {128, 192, 8, 2, 32, KFORGE_FMHA_BWD_192_QS, KFORGE_FMHA_BWD_192_KUNROLL, 1, 2, 0,
     KFORGE_FMHA_BWD_192_WARP_PAIRS},
};
inline constexpr int kNumBwdTiles = sizeof(kBwdTiles) / sizeof(kBwdTiles[0]);

// The row of a (head_dim_qk, head_dim_v) pair, or nullptr: the pairs the backward (and the
// forward's d_qk != d_v kernels) support.
constexpr const BwdTile* bwd_tile(int head_dim_qk, int head_dim_v) {
  for (int i = 0; i < kNumBwdTiles; ++i) {
    if (kBwdTiles[i].head_dim_qk == head_dim_qk && kBwdTiles[i].head_dim_v == head_dim_v) {
      return &kBwdTiles[i];
    }
  }
  return nullptr;
}


// dQ = dS K: warps along the query rows (16-row tiles); the rest go along the columns.
constexpr int bwd_dq_warps_m(const BwdTile& t) {
  return t.dq_warps_m > 0 ? t.dq_warps_m : (t.warps < t.block_m / 16 ? t.warps : t.block_m / 16);
}
// Shared memory of the main kernel but DQ_BULK's staging, for 2-byte elements.
constexpr int bwd_smem_bytes_base(const BwdTile& t) {
  const int bn = 16 * t.slab_mtiles * t.warps / t.split;
  return 2 * (bn * (t.head_dim_qk + t.head_dim_v)               // K, V
              + t.block_m * (2 * t.head_dim_qk + t.do_buffers * t.head_dim_v)  // Q (two), dO
              + (t.warp_pairs ? 1 : t.split) * bn * (t.block_m + 8))  // dS^T (and P^T)
         + 4 * 2 * 2 * t.block_m                                // LSE, D (two buffers)
         + (t.warp_pairs ? 4 * bn * t.block_m : 0);                   // P^T handed over (fp32)
}

// DQ_BULK's staging tiles (every warp's rows x (its columns + 8) floats), in bytes: 0 without
// DQ_BULK, and for a tile it would take over sm_120's 101,376 bytes (that tile adds with atomics).
constexpr int bwd_dq_bulk(const BwdTile& t) {
  return t.dq_bulk >= 0 ? t.dq_bulk : KFORGE_FMHA_BWD_DQ_BULK;
}
constexpr int bwd_dq_stage_bytes(const BwdTile& t) {
  const int bytes = 4 * t.block_m * (t.head_dim_qk + 8 * (t.warps / bwd_dq_warps_m(t)));
  return bwd_dq_bulk(t) != 0 && bwd_smem_bytes_base(t) + bytes <= 101376 ? bytes : 0;
}

// Shared memory of the main kernel, for 2-byte elements.
constexpr int bwd_smem_bytes(const BwdTile& t) {
  return bwd_smem_bytes_base(t) + bwd_dq_stage_bytes(t);
}

// The shared memory a tile may take. sm_120's 99 KiB per block is the rule for every tile that
// ships; a tuning sweep on sm_80 / sm_90 (benchmarks/fmha_bwd_sweep.py, CMake for 90a only) may
// raise it with -DKFORGE_FMHA_BWD_SMEM_LIMIT=<bytes> (at most 232,448 on sm_90, 166,912 on
// sm_80) to measure tiles that do not fit sm_120, e.g. 128-key blocks at (128, 128). A library
// built that way is not one to ship: a launch on sm_120 would fail.
#ifndef KFORGE_FMHA_BWD_SMEM_LIMIT
#define KFORGE_FMHA_BWD_SMEM_LIMIT 101376
#endif
static_assert(KFORGE_FMHA_BWD_SMEM_LIMIT <= 232448, "over sm_90's 227 KiB per block");

constexpr bool bwd_tiles_fit(int limit) {
  for (int i = 0; i < kNumBwdTiles; ++i) {
    if (bwd_smem_bytes(kBwdTiles[i]) > limit) return false;
  }
  return true;
}
static_assert(bwd_tiles_fit(KFORGE_FMHA_BWD_SMEM_LIMIT),
              "a backward tile is over sm_120's 99 KiB per block (KFORGE_FMHA_BWD_SMEM_LIMIT)");

}  // namespace kforge_fmha
