// Hopper (sm_90a) backward main kernel on cp.async loads. Since 2026-11-28 fixed-length calls with
// seqlen_q % 4 == 0 run fmha_bwd_sm90_tl.cuh's TMA-loads kernel instead (launch_bwd_sm90 below tries
// it first); this one runs varlen calls, the other lengths, and KFORGE_FMHA_BWD_SM90_LOADS=cpasync.
// wgmma for every product, (d_qk, d_v) = (64, 64) and
// (128, 128), fp16 and bf16, fixed-length and varlen, causal (bottom-right aligned) or not,
// GQA / MQA. The preprocess (D, LSE * log2(e), dQ accumulator zeroed) and convert (dQ = scale *
// dQ_accum) kernels are the portable ones of fmha_bwd_kernel.cuh; fmha_api.cpp picks this path
// (KFORGE_FMHA_BWD_PATH) and falls back to the portable main kernel for the deterministic mode.
//
// The kernel body exists only in the sm_90a compile pass (__CUDA_ARCH_FEAT_SM90_ALL, through
// fmha_fwd_sm90.cuh's KFORGE_FMHA_HAS_SM90_BODY); the other passes compile an empty stub that is
// never launched (bwd_sm90_available() checks the binary).
//
// One CTA = 2 warpgroups (256 threads) = one block of 128 keys of one (kv head, batch) pair;
// warpgroup wg owns keys 64 wg .. 64 wg + 63 of the block and their dK / dV accumulators in
// registers (64 keys x head_dim each: 2 x 64 floats a thread at head dim 128). K and V of the key
// block stay in shared memory; the CTA loops over the query heads of its GQA group and, for each,
// over the 64-row query blocks that see the key block (the portable kernel's rule), and Q, dO,
// LSE and D of steps i + 1 (and i + 2 in the DQ_TMA kernel) stream in with cp.async (all threads)
// while step i is computed.
// Every tile is in the forward's 128-byte-swizzle layout (fmha_fwd_sm90.cuh: a [rows][d] tile as
// d / 64 column halves of [rows][64], 16-byte chunk c of row r at chunk c ^ (r % 8)).
// Per warpgroup and query block (M = 64 keys):
//   S^T  = K_wg Q^T      m64n64k16, A = K (K-major), B = Q (K-major), both shared memory
//   dP^T = V_wg dO^T     the same with V, dO (issued right behind S^T)
//   P^T  = exp2(S^T * scale * log2(e) - LSE * log2(e)), masked as the portable kernel
//   dV  += P^T dO        m64n64k16 per 64 columns, P^T from the accumulators as the register A
//                        operand (the forward's P V), dO read MN-major (the forward's V)
//   dS^T = P^T (dP^T - D)
//   dK  += dS^T Q        the same, Q read MN-major
//   dS^T -> shared memory ([128 keys][64 queries], swizzled), then
//   dQ   = dS K          m64n64k16 with A = dS read MN-major from the dS^T tile (transposed A,
//                        allowed for 16-bit types) and B = K read MN-major. Head dim 128: both
//                        warpgroups' dS^T (a 256-thread barrier), warpgroup wg computes columns
//                        64 wg .. 64 wg + 63 over all 128 keys; head dim 64: each warpgroup its
//                        own 64 keys (a 128-thread barrier), all 64 columns. Each warp adds
//                        its 16 rows to the fp32 dQ accumulator by two 2-D TMA reductions
//                        from shared memory (DQ_TMA, the default; the fallback kernel: one bulk
//                        reduction a row, DQ_SMEM, or red.global.add from registers).
// At the end dK * scale and dV go to global memory in the input dtype.
// Tuning knobs (benchmarks/fmha_bwd_sweep.py --path sm90; layouts in scripts/sm90_bwd_model.py
// --variant): KFORGE_FMHA_BWD_SM90_DQ_TMA (on: dQ by TMA reductions, 3 load stages), _DQ_SMEM (on:
// the fallback kernel's dQ by bulk reductions a row), _DK_SS (off: dK from the dS^T tile, dV
// overlapped with the dS math), _DEFER_DK (off: dK waited for after the dQ adds); see their
// definitions below.
#pragma once

#include <cstdlib>
#include <cstring>

#include "fmha_bwd_kernel.cuh"      // BwdParams helpers: bwd_seq, atomic_add2, cp_async4
#include "fmha_fwd_sm90.cuh"        // wgmma, descriptors, fences, named barriers
#include "fmha_fwd_sm90_tma.cuh"    // tma_host::encode_tiled (the dQ accumulator's tensor map)

namespace kforge_fmha {
namespace sm90bwd {

constexpr int kBlockN = 128;  // keys per CTA
constexpr int kBlockM = 64;   // query rows per step
constexpr int kThreads = 256;
// dQ's adds as red.global.add.v4.f32 (lane pairs swap halves of their rows) instead of .v2: at
// head dim 128 the shuffles' registers made ptxas spill (255 registers), so there .v2.
#ifndef KFORGE_FMHA_BWD_SM90_DQ_V4
#define KFORGE_FMHA_BWD_SM90_DQ_V4 1
#endif
template <int HDIM>
constexpr bool kDqV4 = KFORGE_FMHA_BWD_SM90_DQ_V4 != 0 && HDIM == 64;
// Tuning knobs (benchmarks/fmha_bwd_sweep.py --path sm90), off by default until measured:
// DK_SS: dS^T goes to shared memory first and dK += dS^T Q reads it there (A K-major, an SS
// wgmma: no dS register fragments), dV += P^T dO runs while dS is computed (the step waits for
// dP^T only), dK is issued after a warpgroup barrier and dQ right behind it, and the step waits
// once for dV, dK and dQ.
#ifndef KFORGE_FMHA_BWD_SM90_DK_SS
#define KFORGE_FMHA_BWD_SM90_DK_SS 0
#endif
// DQ_SMEM: each warp writes its 16 x 64 fp32 dQ tile to shared memory (rows padded to 288 bytes)
// and its lanes 0..15 add one row each to the dQ accumulator with a bulk reduction
// (cp.reduce.async.bulk .add.f32, 256 bytes), instead of 16 red.global.add per thread. The default
// since 2026-11-27 14:31 (H200 sweep of 08:24: +2-5% at head dim 128, +1-3% at 64; at 14:31 the
// backward test file's 191 non-portable cases passed on it); 0 gives the red.global adds back.
#ifndef KFORGE_FMHA_BWD_SM90_DQ_SMEM
#define KFORGE_FMHA_BWD_SM90_DQ_SMEM 1
#endif
// DEFER_DK (with DK_SS): dK is issued after dQ, and the step waits for dV and dQ, adds dQ, and
// only then waits for dK: the dQ adds overlap dK. 1: at head dim 64 only; 2: at both (ptxas 13.0
// spills 8-32 bytes at head dim 128: dQ's 32 accumulators live beside dK's and dV's). Leaving dK
// running into the next step instead, to retire at its first wait, makes ptxas 13.0 serialize
// every wgmma (C7515: it cannot tell what a wait retires across the loop's back edge); that layout
// would also need a third Q buffer (a wgmma reading Q past its step).
#ifndef KFORGE_FMHA_BWD_SM90_DEFER_DK
#define KFORGE_FMHA_BWD_SM90_DEFER_DK 0
#endif

// DQ_TMA: each warp writes its 16 x 64 fp32 dQ tile to shared memory in TMA's 128-byte swizzle
// (two boxes of 16 rows x 32 columns, 2 KiB each) and lane 0 adds both to the dQ accumulator with
// 2-D TMA reductions (cp.reduce.async.bulk.tensor .add, a tensor map over [heads x rows][d] fp32),
// instead of DQ_SMEM's 16 bulk reductions a warp, one a row, which ptxas issues one lane at a time
// in a loop (ELECT, R2UR, UBLKRED, BRA: about a fifth of the kernel's warp stall samples in the H200
// profile of 2026-11-27 22:44). A box covers all 16 rows of the warp: rows past the sequence add
// zeros (their dS is 0, see load_step), and rows past the accumulator's end are clipped by the map.
// The launcher falls back to DQ_SMEM's kernel when the driver cannot encode the map, and
// KFORGE_FMHA_BWD_SM90_DQ=rows (read at every call, for A/B runs) asks for it.
#ifndef KFORGE_FMHA_BWD_SM90_DQ_TMA
#define KFORGE_FMHA_BWD_SM90_DQ_TMA 1
#endif

constexpr bool kDkSs = KFORGE_FMHA_BWD_SM90_DK_SS != 0;
constexpr bool kDqTma = KFORGE_FMHA_BWD_SM90_DQ_TMA != 0;
constexpr int kDqTmaWarpBytes = 2 * 16 * 128;  // DQ_TMA: a warp's two {32, 16} fp32 boxes
template <int HDIM>
constexpr bool kDeferDk = KFORGE_FMHA_BWD_SM90_DEFER_DK >= (HDIM == 64 ? 1 : 2);
static_assert(KFORGE_FMHA_BWD_SM90_DEFER_DK == 0 || kDkSs,
              "KFORGE_FMHA_BWD_SM90_DEFER_DK needs KFORGE_FMHA_BWD_SM90_DK_SS");
// Q / dO / LSE / D buffers: 2 (the loads of step it + 1 run under step it), or 3 for the DQ_TMA
// kernel (two steps ahead: in the H200 profile of 2026-11-27 22:52 the DQ_TMA kernel's warps spent
// a tenth of their samples waiting for the next step's loads at the top of the loop).
constexpr int stages(bool dqt) { return dqt ? 3 : 2; }
constexpr bool kDqSmem = KFORGE_FMHA_BWD_SM90_DQ_SMEM != 0;
constexpr int kDqRowBytes = 64 * 4 + 32;          // one row of a warpgroup's dQ tile, padded
constexpr int kDqWgBytes = kBlockM * kDqRowBytes;  // a warpgroup's [64 rows][64 columns] tile

// DQT: the DQ_TMA kernel (its staging tiles: 8 warps x 4 KiB, 1024-byte aligned for the swizzle).
template <int HDIM, bool DQT = false>
struct Shape {
  static_assert(HDIM == 64 || HDIM == 128, "head dim 64 or 128");
  static constexpr int kStages = stages(DQT);
  static constexpr int kHalves = HDIM / 64;               // 64-column halves of a tile
  static constexpr int kKvTile = kBlockN * HDIM * 2;      // bytes of K (or V)
  static constexpr int kQTile = kBlockM * HDIM * 2;       // bytes of one Q (or dO) buffer
  static constexpr int kKvHalf = kBlockN * 128;           // bytes of one 64-column half
  static constexpr int kQHalf = kBlockM * 128;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKvTile;
  static constexpr int kOffQ = kOffV + kKvTile;              // kStages buffers
  static constexpr int kOffDo = kOffQ + kStages * kQTile;    // kStages buffers
  static constexpr int kOffDs = kOffDo + kStages * kQTile;   // dS^T [128 keys][64 queries]
  static constexpr int kOffDq = kOffDs + kBlockN * kBlockM * 2;  // the dQ staging tiles
  static constexpr int kDqBytes = DQT ? (kThreads / 32) * kDqTmaWarpBytes : (kDqSmem ? 2 * kDqWgBytes : 0);
  static constexpr int kOffLse = kOffDq + kDqBytes;             // kStages x 64 floats
  static constexpr int kOffD = kOffLse + kStages * kBlockM * 4;
  static constexpr int kSmemBytes = kOffD + kStages * kBlockM * 4 + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 232448, "227 KiB");
  static_assert(kOffDs % 1024 == 0 && kOffDq % 1024 == 0,
                "swizzled tiles (and TMA's 128-byte swizzle) start on 1024-byte boundaries");
};

#if defined(KFORGE_FMHA_HAS_SM90_BODY)

// m64n64k16 with both operands from shared memory; TRANS: "imm-trans-a, imm-trans-b" ("1, 1":
// both MN-major, dQ = dS K).
#define KFORGE_FMHA_WGMMA_SS_TT(NAME, PTX_TYPE, TRANS)                                               \
  __device__ __forceinline__ void NAME(float (&d)[32], uint64_t da, uint64_t db, int accumulate) { \
    asm volatile(                                                                                \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                            \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_TYPE "." PTX_TYPE " "                 \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                               \
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "                    \
        "%32, %33, p, 1, 1, " TRANS ";\n}\n"                                                     \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),   \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),            \
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),         \
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),         \
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),         \
          "+f"(d[31])                                                                            \
        : "l"(da), "l"(db), "r"(accumulate));                                                    \
  }
KFORGE_FMHA_WGMMA_SS_TT(wgmma_ss64_tt_bf16, "bf16", "1, 1")
KFORGE_FMHA_WGMMA_SS_TT(wgmma_ss64_tt_f16, "f16", "1, 1")
// A K-major, B MN-major (DK_SS: dK += dS^T Q with dS^T from shared memory).
KFORGE_FMHA_WGMMA_SS_TT(wgmma_ss64_nt_bf16, "bf16", "0, 1")
KFORGE_FMHA_WGMMA_SS_TT(wgmma_ss64_nt_f16, "f16", "0, 1")
#undef KFORGE_FMHA_WGMMA_SS_TT

// DQ_SMEM's bulk reductions: detail::bulk_reduce_add_f32 and its group waits (fmha_bwd_kernel.cuh).

// p[0..3] += {a, b, c, d} in global memory, one vector reduction (sm_90); p is 16-byte aligned.
__device__ __forceinline__ void atomic_add4(float* p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}

// DQ_TMA: the {32, 16} fp32 box of `map` at {c0 (column), c1 (row)} += the box at `src` (128-byte
// swizzle), in this thread's bulk group.
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}

template <typename T>
__device__ __forceinline__ void ss_tt(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    wgmma_ss64_tt_bf16(d, da, db, acc);
  } else {
    wgmma_ss64_tt_f16(d, da, db, acc);
  }
}
template <typename T>
__device__ __forceinline__ void ss_nt(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    wgmma_ss64_nt_bf16(d, da, db, acc);
  } else {
    wgmma_ss64_nt_f16(d, da, db, acc);
  }
}

// cp.async of a [ROWS][HDIM] tile into the swizzled layout (HDIM / 64 halves of ROWS x 128
// bytes); rows >= valid_rows are zero-filled. Thread t copies chunk t % (HDIM / 8) of rows
// t / (HDIM / 8) + i * (rows per pass): a multiple of 8 apart, so row % 8 is the same for every i.
template <typename T, int ROWS, int HDIM>
__device__ __forceinline__ void load_swz(uint32_t sbase, const T* g, int64_t stride, int valid_rows,
                                         int tid) {
  constexpr int kChunks = HDIM / 8;
  constexpr int kRowsPerPass = kThreads / kChunks;
  static_assert(kRowsPerPass % 8 == 0 && ROWS % kRowsPerPass == 0, "tile loader");
  const int c = tid % kChunks;
  const int r = tid / kChunks;
  const uint32_t dst = sbase + (c / 8) * (ROWS * 128) + r * 128 + (((c % 8) ^ (r % 8)) << 4);
  const T* src = g + static_cast<int64_t>(r) * stride + c * 8;
#pragma unroll
  for (int i = 0; i < ROWS / kRowsPerPass; ++i) {
    const bool valid = r + i * kRowsPerPass < valid_rows;
    detail::cp_async16(dst + i * kRowsPerPass * 128,
                       valid ? src + static_cast<int64_t>(i) * kRowsPerPass * stride : g, valid);
  }
}

// The first 64-row query block that sees the key block at n0 (fmha_bwd_kernel.cuh's rule: causal,
// bottom-right aligned; m_total when none does).
template <bool CAUSAL>
__device__ __forceinline__ int first_query_block(int sq, int sk, int n0, int m_total) {
  if (!CAUSAL) return 0;
  const int r_min = max(0, n0 - (sk - sq));
  return r_min >= sq ? m_total : r_min / kBlockM;
}

// P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)) in place: accumulator entry 4 j + 2 r + e is
// key n0 + key_l + 8 r, query column 8 j + 2 t + e of the step's rows r0 ..; where the key block
// crosses sk or the causal diagonal, the keys past sk and above the diagonal get 0.
template <bool CAUSAL>
__device__ __forceinline__ void softmax_pt(float (&st)[32], const float* lse_s, float scale_log2,
                                           int n0, int key_l, int r0, int t, int sq, int sk) {
  const bool masked = n0 + kBlockN > sk || (CAUSAL && n0 + kBlockN - 1 > r0 + sk - sq);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = 8 * j + 2 * t;
    const float2 l = *reinterpret_cast<const float2*>(lse_s + col);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = n0 + key_l + 8 * r;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = detail::fast_exp2(fmaf(st[4 * j + 2 * r + e], scale_log2, -(e ? l.y : l.x)));
        if (masked) {
          const int row = r0 + col + e;
          if (key >= sk || (CAUSAL && key > row + sk - sq)) x = 0.f;
        }
        st[4 * j + 2 * r + e] = x;
      }
    }
  }
}

// An m64 accumulator as wgmma's register A operand: k-step kk = query columns 16 kk .. 16 kk + 15
// = accumulator n-tiles 2 kk and 2 kk + 1 (the mma.m16n8k16 A-fragment order).
template <typename T>
__device__ __forceinline__ void pack_a(const float (&x)[32], uint32_t (&a)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = detail::Mma<T>::pack(x[8 * kk + 0], x[8 * kk + 1]);
    a[kk][1] = detail::Mma<T>::pack(x[8 * kk + 2], x[8 * kk + 3]);
    a[kk][2] = detail::Mma<T>::pack(x[8 * kk + 4], x[8 * kk + 5]);
    a[kk][3] = detail::Mma<T>::pack(x[8 * kk + 6], x[8 * kk + 7]);
  }
}

// dK * scale and dV of this thread's keys key0 and key0 + 8 (those below sk) from the
// accumulators, in the input dtype, 4 bytes a store.
template <typename T, int KH>
__device__ __forceinline__ void store_dkdv(const float (&dk)[KH][32], const float (&dv)[KH][32],
                                           T* gdK, T* gdV, int64_t dk_row_stride,
                                           int64_t dv_row_stride, int key0, int sk, int t,
                                           float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key < sk) {
      T* rk = gdK + static_cast<int64_t>(key) * dk_row_stride + 2 * t;
      T* rv = gdV + static_cast<int64_t>(key) * dv_row_stride + 2 * t;
#pragma unroll
      for (int dh = 0; dh < KH; ++dh) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          *reinterpret_cast<uint32_t*>(rk + dh * 64 + j * 8) = detail::Mma<T>::pack(
              dk[dh][4 * j + 2 * r] * scale, dk[dh][4 * j + 2 * r + 1] * scale);
          *reinterpret_cast<uint32_t*>(rv + dh * 64 + j * 8) =
              detail::Mma<T>::pack(dv[dh][4 * j + 2 * r], dv[dh][4 * j + 2 * r + 1]);
        }
      }
    }
  }
}

// wgmma descriptors' k-steps (16-byte units): K-major, k-step kk at half kk / 4, byte 32 (kk % 4) of
// the row; MN-major, 16 rows of 128 bytes further.
__device__ __forceinline__ uint64_t kmajor_step(int kk, uint64_t half_units) {
  return (kk / 4) * half_units + (kk % 4) * 2;
}
constexpr uint64_t kRows16Units = (16 * 128) >> 4;

// S^T = K_wg Q^T, then dP^T = V_wg dO^T: two wgmma groups of HDIM / 16 k-steps, m64n64k16, both
// operands K-major in shared memory (k_a, v_a: this warpgroup's 64 rows of K and V; q_b, do_b:
// the step's Q and dO buffers).
template <typename T, int HDIM>
__device__ __forceinline__ void issue_st_dp(float (&st)[32], float (&dp)[32], uint64_t k_a,
                                            uint64_t v_a, uint64_t q_b, uint64_t do_b,
                                            uint64_t kv_half_units, uint64_t q_half_units) {
  using sm90::Wgmma;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HDIM / 16; ++kk) {
    Wgmma<T>::template ss_first<64>(st, k_a + kmajor_step(kk, kv_half_units),
                                    q_b + kmajor_step(kk, q_half_units), kk > 0);
  }
  sm90::wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < HDIM / 16; ++kk) {
    Wgmma<T>::template ss_first<64>(dp, v_a + kmajor_step(kk, kv_half_units),
                                    do_b + kmajor_step(kk, q_half_units), kk > 0);
  }
  sm90::wgmma_commit();
}

// acc[dh] += A B over 64 rows of the step (4 k-steps): A from registers (pack_a's order), B read
// MN-major from `b` (a Q or dO buffer: column half dh at dh * half_units); one wgmma group. dV +=
// P^T dO and dK += dS^T Q.
template <typename T, int KH>
__device__ __forceinline__ void issue_rs(float (&acc)[KH][32], const uint32_t (&a)[4][4], uint64_t b,
                                         uint64_t half_units) {
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int dh = 0; dh < KH; ++dh) {
      sm90::Wgmma<T>::rs(acc[dh], a[kk], b + dh * half_units + kk * kRows16Units);
    }
  }
  sm90::wgmma_commit();
}

#endif  // KFORGE_FMHA_HAS_SM90_BODY

// DQT: dQ's adds by TMA reductions (DQ_TMA, dq_map used) or as DQ_SMEM says (dq_map unused).
template <typename T, int HDIM, bool CAUSAL, bool DQT>
__global__ void __launch_bounds__(kThreads, 1)
    fmha_bwd_sm90_kernel(const BwdParams p, const __grid_constant__ CUtensorMap dq_map) {
#if defined(KFORGE_FMHA_HAS_SM90_BODY)
  using namespace detail;
  using namespace sm90;
  using S = Shape<HDIM, DQT>;
  constexpr int BN = kBlockN;
  constexpr int BM = kBlockM;
  constexpr int KH = S::kHalves;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = (1024u - (raw_addr & 1023u)) & 1023u;
  unsigned char* base = smem_raw + pad;
  const uint32_t sbase = raw_addr + pad;
  const uint32_t sK = sbase + S::kOffK;
  const uint32_t sV = sbase + S::kOffV;
  const uint32_t sQ = sbase + S::kOffQ;
  const uint32_t sDo = sbase + S::kOffDo;
  const uint32_t sDs = sbase + S::kOffDs;
  const float* sLse = reinterpret_cast<const float*>(base + S::kOffLse);
  const float* sD = reinterpret_cast<const float*>(base + S::kOffD);

  const int n_block = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid % 128) / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const BwdSeq s = bwd_seq(p, b);
  const int sq = s.sq, sk = s.sk;
  const int n0 = n_block * BN;
  if (n0 >= sk) return;

  // The query blocks that see this key block.
  const int m_total = (sq + BM - 1) / BM;
  const int m_first = first_query_block<CAUSAL>(sq, sk, n0, m_total);
  const int m_count = m_total - m_first;
  const int n_iter = m_count * p.head_ratio;  // (query head of the group, query block) pairs
  const int h_first = kv_head * p.head_ratio;

  const T* gK = static_cast<const T*>(p.k) + s.k + kv_head * p.k_head_stride +
                static_cast<int64_t>(n0) * p.k_row_stride;
  const T* gV = static_cast<const T*>(p.v) + s.v + kv_head * p.v_head_stride +
                static_cast<int64_t>(n0) * p.v_row_stride;
  load_swz<T, BN, HDIM>(sK, gK, p.k_row_stride, sk - n0, tid);
  load_swz<T, BN, HDIM>(sV, gV, p.v_row_stride, sk - n0, tid);

  // Q, dO, LSE * log2(e) and D of step `it` into buffer `buf`. Rows past the sequence are
  // zero-filled: Q = dO = 0 there gives S = 0, P = exp2(0 - 0) = 1, dP = 0, D = 0, so dS = 0 and
  // P^T dO = 0; nothing of those rows reaches dK, dV or dQ (as in the portable kernel).
  auto load_step = [&](int it, int buf) {
    const int h = h_first + it / m_count;
    const int r0 = (m_first + it % m_count) * BM;
    const T* gQ = static_cast<const T*>(p.q) + s.q + h * p.q_head_stride +
                  static_cast<int64_t>(r0) * p.q_row_stride;
    const T* gDo = static_cast<const T*>(p.dout) + s.dout + h * p.do_head_stride +
                   static_cast<int64_t>(r0) * p.do_row_stride;
    load_swz<T, BM, HDIM>(sQ + buf * S::kQTile, gQ, p.q_row_stride, sq - r0, tid);
    load_swz<T, BM, HDIM>(sDo + buf * S::kQTile, gDo, p.do_row_stride, sq - r0, tid);
    if (tid < BM) {
      const bool valid = r0 + tid < sq;
      const int64_t w = h * p.rows + s.ws_row + r0 + tid;
      cp_async4(sbase + S::kOffLse + (buf * BM + tid) * 4, valid ? p.lse_log2 + w : p.lse_log2,
                valid);
      cp_async4(sbase + S::kOffD + (buf * BM + tid) * 4, valid ? p.dpsum + w : p.dpsum, valid);
    }
  };
  constexpr int NS = S::kStages;
  if (n_iter > 0) load_step(0, 0);
  cp_async_commit();
  if constexpr (NS == 3) {
    if (n_iter > 1) load_step(1, 1);
    cp_async_commit();
  }

  float dk[KH][32], dv[KH][32];
#pragma unroll
  for (int h = 0; h < KH; ++h) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      dk[h][i] = 0.f;
      dv[h][i] = 0.f;
    }
  }

  // Descriptors (the 14-bit address field is in 16-byte units; offsets below are too).
  // K-major A operands: this warpgroup's 64 rows of K and V; k-step kk at half kk / 4, byte
  // 32 (kk % 4) of the row.
  const uint64_t k_a = make_desc(sK + wg * 64 * 128);
  const uint64_t v_a = make_desc(sV + wg * 64 * 128);
  // Q, dO buffer 0 as K-major B (S^T, dP^T) and as MN-major B (dK, dV); K as MN-major B (dQ);
  // dS^T as MN-major A (dQ). MN-major k-step kk: 16 rows of 128 bytes further.
  const uint64_t q_desc = make_desc(sQ);
  const uint64_t do_desc = make_desc(sDo);
  const uint64_t k_desc = make_desc(sK);
  const uint64_t ds_desc = make_desc(sDs);
  constexpr uint64_t kQTileU = S::kQTile >> 4;
  constexpr uint64_t kQHalfU = S::kQHalf >> 4;
  constexpr uint64_t kKvHalfU = S::kKvHalf >> 4;
  constexpr uint64_t kRows16U = kRows16Units;

  const float scale_log2 = p.scale_log2;
  const int key_l = wg * 64 + warp * 16 + g;  // this thread's first key in the block (+8)

  for (int it = 0; it < n_iter; ++it) {
    const int buf = NS == 2 ? (it & 1) : it % NS;
    cp_async_wait<NS - 2>();  // every group but the newest (step it + NS - 2's) has landed
    fence_proxy_async();  // this thread's cp.async writes, visible to the wgmma (async) proxy
    __syncthreads();      // step it's tiles are in; every wgmma of step it - 1 has completed
    // step it + NS - 1 into the buffer of step it - 1
    if (it + NS - 1 < n_iter) load_step(it + NS - 1, NS == 2 ? (buf ^ 1) : (it + NS - 1) % NS);
    cp_async_commit();

    const int h = h_first + it / m_count;
    const int m_block = m_first + it % m_count;
    const int r0 = m_block * BM;
    const float* lse_s = sLse + buf * BM;
    const float* d_s = sD + buf * BM;

    // S^T = K_wg Q^T, then dP^T = V_wg dO^T: two groups.
    float st[32], dp[32];
    issue_st_dp<T, HDIM>(st, dp, k_a, v_a, q_desc + buf * kQTileU, do_desc + buf * kQTileU, kKvHalfU,
                         kQHalfU);
    wgmma_wait1();  // S^T done; dP^T may still run
    keep(st);

    softmax_pt<CAUSAL>(st, lse_s, scale_log2, n0, key_l, r0, t, sq, sk);  // P^T

    // P^T's A fragments (DK_SS: live until the step's last wait, dV reads them asynchronously).
    uint32_t pa[4][4];
    // dV += P^T dO: P^T as the register A operand (k-step kk = query columns 16 kk .. 16 kk +
    // 15 = accumulator n-tiles 2 kk and 2 kk + 1, the mma.m16n8k16 A-fragment order).
    {
      pack_a<T>(st, pa);
      issue_rs<T, KH>(dv, pa, do_desc + buf * kQTileU, kQHalfU);
      if constexpr (kDkSs) {
        wgmma_wait1();  // dP^T done; dV runs on while dS is computed (pa held until it ends)
        keep(dp);
      } else {
        wgmma_wait0();  // dP^T and dV done: pa is free
        keep(pa);
#pragma unroll
        for (int dh = 0; dh < KH; ++dh) keep(dv[dh]);
        keep(dp);
      }
    }

    // dS^T = P^T (dP^T - D): A fragments for dK, and the swizzled dS^T tile for dQ (row key_l +
    // 8 r, 4-byte word t of chunk j; key_l % 8 = g). DK_SS: the tile only.
    [[maybe_unused]] uint32_t da[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int j = 2 * kk + hi;
        const float2 d = *reinterpret_cast<const float2*>(d_s + 8 * j + 2 * t);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float ds0 = st[4 * j + 2 * r] * (dp[4 * j + 2 * r] - d.x);
          const float ds1 = st[4 * j + 2 * r + 1] * (dp[4 * j + 2 * r + 1] - d.y);
          const uint32_t packed = Mma<T>::pack(ds0, ds1);
          if constexpr (!kDkSs) da[kk][2 * hi + r] = packed;
          *reinterpret_cast<uint32_t*>(base + S::kOffDs + (key_l + 8 * r) * 128 +
                                       ((j ^ g) << 4) + t * 4) = packed;
        }
      }
    }

    if constexpr (kDkSs) {
      // This warpgroup's 64 rows of dS^T visible to its wgmma (async proxy); then dK, issued
      // before the 256-thread barrier that dQ needs at head dim 128 (DEFER_DK: after dQ).
      fence_proxy_async();
      if (HDIM == 64 || !kDeferDk<HDIM>) {
        if (wg == 0) {  // literal ids: ptxas then reserves 3 barriers, not all 16
          named_sync(2, 128);
        } else {
          named_sync(3, 128);
        }
      }
      if constexpr (!kDeferDk<HDIM>) {
        // dK += dS^T Q with dS^T as the K-major A operand (this warpgroup's 64 rows; k-step kk:
        // 32 bytes along the row).
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
          for (int dh = 0; dh < KH; ++dh) {
            ss_nt<T>(dk[dh], make_desc(sDs + wg * 64 * 128) + kk * 2,
                     q_desc + buf * kQTileU + dh * kQHalfU + kk * kRows16U, 1);
          }
        }
        wgmma_commit();
      }
      if constexpr (HDIM == 128) named_sync(1, kThreads);  // the other warpgroup's dS^T too
    } else {
      issue_rs<T, KH>(dk, da, q_desc + buf * kQTileU, kQHalfU);  // dK += dS^T Q

      // dS^T visible to the async proxy, then to the warpgroup(s) that read it.
      fence_proxy_async();
      if constexpr (HDIM == 128) {
        named_sync(1, kThreads);
      } else {
        if (wg == 0) {  // literal ids: ptxas then reserves 3 barriers, not all 16
          named_sync(2, 128);
        } else {
          named_sync(3, 128);
        }
      }
    }

    // dQ = dS K: head dim 128, columns 64 wg .. over the 128 keys; head dim 64, all columns over
    // this warpgroup's 64 keys.
    constexpr int kDqSteps = HDIM == 128 ? BN / 16 : 4;
    const int ks0 = HDIM == 128 ? 0 : wg * 4;
    const int dcol0 = HDIM == 128 ? wg * 64 : 0;
    float dq[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDqSteps; ++kk) {
      ss_tt<T>(dq, ds_desc + (ks0 + kk) * kRows16U,
               k_desc + (HDIM == 128 ? wg : 0) * kKvHalfU + (ks0 + kk) * kRows16U, kk > 0);
    }
    wgmma_commit();
    if constexpr (kDeferDk<HDIM>) {
      wgmma_fence();  // dK as above, behind dQ
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int dh = 0; dh < KH; ++dh) {
          ss_nt<T>(dk[dh], make_desc(sDs + wg * 64 * 128) + kk * 2,
                   q_desc + buf * kQTileU + dh * kQHalfU + kk * kRows16U, 1);
        }
      }
      wgmma_commit();
      wgmma_wait1();  // dV and dQ done: pa is free; dK runs on under the dQ adds
      keep(pa);
#pragma unroll
      for (int dh = 0; dh < KH; ++dh) keep(dv[dh]);
      keep(dq);
    } else if constexpr (kDkSs) {
      wgmma_wait0();  // dV, dK and dQ done: pa is free
      keep(pa);
#pragma unroll
      for (int dh = 0; dh < KH; ++dh) {
        keep(dv[dh]);
        keep(dk[dh]);
      }
      keep(dq);
    } else {
      wgmma_wait1();  // dK done: da is free
      keep(da);
#pragma unroll
      for (int dh = 0; dh < KH; ++dh) keep(dk[dh]);
      wgmma_wait0();  // dQ done
      keep(dq);
    }

    // Accumulator entry 4 j + 2 r + e of dq: query row 16 warp + g + 8 r, column dcol0 + 8 j +
    // 2 t + e.
    float* dq_acc = p.dq_accum + (h * p.rows + s.ws_row) * HDIM;
    if constexpr (DQT) {
      // This warp's rows 16 warp .. 16 warp + 15 as two boxes of 32 columns: entry 4 j + 2 r + e
      // (row g + 8 r of the 16, column 8 j + 2 t + e) in box j / 4, 16-byte chunk 2 (j % 4) + t / 2
      // of its 128-byte row, swizzled by the row's low 3 bits (g), byte 8 (t % 2) of the chunk.
      const uint32_t sdq = sbase + S::kOffDq + (wg * 4 + warp) * kDqTmaWarpBytes;
      if (lane == 0) bulk_wait_read_all();  // last step's reductions have read these boxes
      __syncwarp();
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          st_shared_f32x2(sdq + (j / 4) * (kDqTmaWarpBytes / 2) + (g + 8 * r) * 128 +
                              (((2 * (j % 4) + t / 2) ^ g) << 4) + (t % 2) * 8,
                          dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
        }
      }
      fence_proxy_async();  // the generic-proxy stores, visible to the TMA unit
      __syncwarp();
      if (lane == 0) {
        const int row = static_cast<int>(h * p.rows + s.ws_row) + r0 + warp * 16;
        tma_reduce_add_2d(&dq_map, sdq, dcol0, row);
        tma_reduce_add_2d(&dq_map, sdq + kDqTmaWarpBytes / 2, dcol0 + 32, row);
        bulk_commit_group();
      }
    } else if constexpr (kDqSmem) {
      // This warp's rows 16 warp .. 16 warp + 15 of its warpgroup's tile; lane l < 16 adds row l
      // (256 bytes: columns dcol0 .. dcol0 + 63) once the whole warp has written it.
      const int wrow0 = warp * 16;
      const uint32_t sdq = sbase + S::kOffDq + wg * kDqWgBytes + wrow0 * kDqRowBytes;
      if (lane < 16) bulk_wait_read_all();  // last step's reduction of row `lane` has read it
      __syncwarp();
      const uint32_t mine = sdq + g * kDqRowBytes + t * 8;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          st_shared_f32x2(mine + r * 8 * kDqRowBytes + j * 32, dq[4 * j + 2 * r],
                          dq[4 * j + 2 * r + 1]);
        }
      }
      fence_proxy_async();  // the generic-proxy stores, visible to the bulk reduction
      __syncwarp();
      if (lane < 16 && r0 + wrow0 + lane < sq) {
        bulk_reduce_add_f32(dq_acc + static_cast<int64_t>(r0 + wrow0 + lane) * HDIM + dcol0,
                            sdq + lane * kDqRowBytes, 64 * 4);
        bulk_commit_group();
      }
    } else if constexpr (kDqV4<HDIM>) {
      // Lanes t and t ^ 1 swap halves so that each adds 4 consecutive columns of one row
      // (red.global.add.v4.f32): the even lane columns 2 t .. 2 t + 3 of row g, the odd lane
      // columns 2 t - 2 .. 2 t + 1 of row g + 8.
      const bool odd = (t & 1) != 0;
      const int row = r0 + warp * 16 + g + (odd ? 8 : 0);
      float* dst = dq_acc + static_cast<int64_t>(row) * HDIM + dcol0 + 2 * (t & ~1);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float x0 = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * j] : dq[4 * j + 2], 1);
        const float x1 = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * j + 1] : dq[4 * j + 3], 1);
        if (row < sq) {
          if (odd) {
            atomic_add4(dst + 8 * j, x0, x1, dq[4 * j + 2], dq[4 * j + 3]);
          } else {
            atomic_add4(dst + 8 * j, dq[4 * j], dq[4 * j + 1], x0, x1);
          }
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = r0 + warp * 16 + g + 8 * r;
        if (row < sq) {
          float* dst = dq_acc + static_cast<int64_t>(row) * HDIM + dcol0 + 2 * t;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            atomic_add2(dst + 8 * j, dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
          }
        }
      }
    }
    if constexpr (kDeferDk<HDIM>) {
      wgmma_wait0();  // dK done (it reads this step's Q and dS^T)
#pragma unroll
      for (int dh = 0; dh < KH; ++dh) keep(dk[dh]);
    }
  }

  cp_async_wait<0>();  // n_iter == 0: the K / V loads are still in flight
  if constexpr (DQT || kDqSmem) bulk_wait_all();  // shared memory stays valid until the reductions end

  // dK (scaled) and dV of this thread's keys, in the input dtype (zero where no query sees the
  // key block).
  T* gdK = static_cast<T*>(p.dk) + s.dk + kv_head * p.dk_head_stride;
  T* gdV = static_cast<T*>(p.dv) + s.dv + kv_head * p.dv_head_stride;
  store_dkdv<T, KH>(dk, dv, gdK, gdV, p.dk_row_stride, p.dv_row_stride, n0 + key_l, sk, t,
                    p.softmax_scale);
#endif  // KFORGE_FMHA_HAS_SM90_BODY
}

}  // namespace sm90bwd

// True when this library's code for the current device holds the sm_90a body of the backward
// kernel (checked once per device, as sm90_available()).
template <typename T, int HDIM>
bool bwd_sm90_available() {
  static int state[64] = {};  // 0: unknown, 1: yes, 2: no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev < 64) {
    const int st = __atomic_load_n(&state[dev], __ATOMIC_ACQUIRE);
    if (st != 0) return st == 1;
  }
  cudaFuncAttributes attr;
  const bool yes =
      cudaFuncGetAttributes(&attr, sm90bwd::fmha_bwd_sm90_kernel<T, HDIM, false, false>) == cudaSuccess &&
      attr.binaryVersion == 90;
  if (!yes) cudaGetLastError();
  if (dev < 64) __atomic_store_n(&state[dev], yes ? 1 : 2, __ATOMIC_RELEASE);
  return yes;
}

namespace sm90bwd {

// DQ_TMA's tensor map: the dQ accumulator as [rows] x [hdim] fp32 (rows = heads x workspace rows),
// {32, 16} boxes, 128-byte swizzle. False when the driver has no cuTensorMapEncodeTiled or refuses.
inline bool encode_dq_map(CUtensorMap* map, float* dq_accum, int64_t rows, int hdim) {
  const tma_host::EncodeTiledFn fn = tma_host::encode_tiled();
  if (fn == nullptr || rows < 1 || rows >= (int64_t{1} << 31)) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(hdim), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(hdim) * sizeof(float)};
  const cuuint32_t box[2] = {32, 16};
  const cuuint32_t elem_strides[2] = {1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, dq_accum, dims, strides, box, elem_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// KFORGE_FMHA_BWD_SM90_DQ=rows: DQ_SMEM's kernel instead of DQ_TMA's (A/B runs; read at every call).
inline bool dq_rows_forced() {
  const char* v = std::getenv("KFORGE_FMHA_BWD_SM90_DQ");
  return v != nullptr && std::strcmp(v, "rows") == 0;
}

template <typename T, int HDIM, bool CAUSAL, bool DQT>
cudaError_t launch_main(const BwdParams& p, const CUtensorMap& map, int n_ctas, cudaStream_t stream) {
  constexpr int kSmem = Shape<HDIM, DQT>::kSmemBytes;
  cudaError_t err = detail::raise_smem_limit_once<fmha_bwd_sm90_kernel<T, HDIM, CAUSAL, DQT>>(kSmem);
  if (err != cudaSuccess) return err;
  fmha_bwd_sm90_kernel<T, HDIM, CAUSAL, DQT>
      <<<dim3(n_ctas, p.num_heads_k, p.batch), kThreads, kSmem, stream>>>(p, map);
  return cudaGetLastError();
}

}  // namespace sm90bwd

}  // namespace kforge_fmha

#include "fmha_bwd_sm90_tl.cuh"  // the TMA-loads kernel (the default for fixed-length batches)

namespace kforge_fmha {
namespace sm90bwd {

// The largest of the three kernels' dynamic shared memory (TL's, DQ_TMA's and its fallback), for
// the launch manifest: one entry covers all (their mangled names share the manifest's substring).
constexpr unsigned int max_smem(int a, int b, int c) {
  return static_cast<unsigned int>(a > b ? (a > c ? a : c) : (b > c ? b : c));
}
template <int HDIM>
constexpr unsigned int kLaunchSmem =
    max_smem(TlShape<HDIM>::kSmemBytes, Shape<HDIM, true>::kSmemBytes, Shape<HDIM, false>::kSmemBytes);

}  // namespace sm90bwd

// Preprocess (portable), the sm_90a main kernel, convert (portable).
template <typename T, int HDIM, bool CAUSAL>
cudaError_t launch_bwd_sm90(const BwdParams& p, cudaStream_t stream) {
  cudaError_t err = launch_bwd_preprocess<T, HDIM, HDIM>(p, stream);
  if (err != cudaSuccess) return err;
  const int n_ctas = (p.seqlen_k + sm90bwd::kBlockN - 1) / sm90bwd::kBlockN;
  if (n_ctas > 0 && p.batch > 0 && p.num_heads_k > 0) {
    CUtensorMap map{};  // unused by the DQ_SMEM kernel
    bool launched = false;
    if constexpr (sm90bwd::kDqTma) {
      err = sm90bwd::launch_main_tl<T, HDIM, CAUSAL>(p, n_ctas, stream);
      if (err != cudaErrorNotSupported || sm90bwd::tl_required()) {
        if (err != cudaSuccess) return err;
        return launch_bwd_convert<T, HDIM, HDIM>(p, stream);
      }
      err = cudaSuccess;
    }
    if constexpr (sm90bwd::kDqTma) {
      if (!sm90bwd::dq_rows_forced() &&
          sm90bwd::encode_dq_map(&map, p.dq_accum, static_cast<int64_t>(p.num_heads) * p.rows, HDIM)) {
        err = sm90bwd::launch_main<T, HDIM, CAUSAL, true>(p, map, n_ctas, stream);
        launched = true;
      }
    }
    if (!launched) err = sm90bwd::launch_main<T, HDIM, CAUSAL, false>(p, map, n_ctas, stream);
    if (err != cudaSuccess) return err;
  }
  return launch_bwd_convert<T, HDIM, HDIM>(p, stream);
}

}  // namespace kforge_fmha

// The dynamic shared memory the launcher asks for, for the launch manifest: the sm_90a pass (and
// the host pass) declare it; in the other archs' passes the kernel is a stub that is never
// launched, so they declare 0 (sm_120's 99 KiB per block would otherwise fail `kforge doctor`).
#if defined(KFORGE_FMHA_HAS_SM90_BODY) || !defined(__CUDA_ARCH__)
#define KFORGE_FMHA_BWD_SM90_SMEM(HDIM) kforge_fmha::sm90bwd::kLaunchSmem<HDIM>
#else
#define KFORGE_FMHA_BWD_SM90_SMEM(HDIM) 0
#endif

// One compile unit per (element type, head dim): both masks, and the launch manifest. The
// preprocess and convert launchers are instantiated in the portable unit of the pair
// (fmha_bwd_*_hdim*.cu): extern here, so that this unit does not compile their kernels again.
#define KFORGE_FMHA_INSTANTIATE_BWD_SM90(T, HDIM)                                              \
  extern template cudaError_t kforge_fmha::launch_bwd_preprocess<T, HDIM, HDIM>(               \
      const kforge_fmha::BwdParams&, cudaStream_t);                                            \
  extern template cudaError_t kforge_fmha::launch_bwd_convert<T, HDIM, HDIM>(                  \
      const kforge_fmha::BwdParams&, cudaStream_t);                                            \
  template bool kforge_fmha::bwd_sm90_available<T, HDIM>();                                    \
  template cudaError_t kforge_fmha::launch_bwd_sm90<T, HDIM, false>(                           \
      const kforge_fmha::BwdParams&, cudaStream_t);                                            \
  template cudaError_t kforge_fmha::launch_bwd_sm90<T, HDIM, true>(                            \
      const kforge_fmha::BwdParams&, cudaStream_t);                                            \
  [[maybe_unused]] static __device__ const KforgeLaunchSmem kforge_launch_smem[] = {           \
      {"fmha_bwd_sm90_kernel", KFORGE_FMHA_BWD_SM90_SMEM(HDIM)}};
