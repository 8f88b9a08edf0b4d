// FlashAttention-2-style fused forward attention for sm_80 and newer.
//
// One CTA computes one (BLOCK_M query rows, head, batch) tile. Each of the 4 warps owns
// 16 * M_TILES query rows. K and V tiles of BLOCK_N keys stream through shared memory
// with cp.async (the V load of a step overlaps Q K^T, the K load of the next step overlaps
// the softmax and P V). Matrix products use ldmatrix (+ .trans for V) and
// mma.sync.m16n8k16 with fp32 accumulation; the softmax is online, in the exp2 domain,
// with the scale folded into log2(e). Causal masking is bottom-right aligned (key j is
// visible to query i when j <= i + seqlen_k - seqlen_q); fully masked tiles are skipped
// and only tiles crossing the diagonal or the end of the keys are masked.
// Shared memory rows are XOR-swizzled in 16-byte chunks, so ldmatrix and cp.async are
// free of bank conflicts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <type_traits>

#include "fmha_manifest.h"
#include "fmha_params.h"

namespace kforge_fmha {

// Tile configuration per (head dim of Q/K, head dim of V); HDIM_V defaults to HDIM.
template <int HDIM, int HDIM_V = HDIM>
struct FwdConfig;

// Tile shapes. BLOCK_M = WARPS * 16 rows * M_TILES. The macros exist for tuning sweeps
// (pass -DKFORGE_FMHA_H128_BN=... in CMAKE_CUDA_FLAGS); the defaults are the tuned values.
#ifndef KFORGE_FMHA_H64_MTILES
#define KFORGE_FMHA_H64_MTILES 2
#endif
#ifndef KFORGE_FMHA_H64_BN
#define KFORGE_FMHA_H64_BN 64
#endif
#ifndef KFORGE_FMHA_H64_QREGS
#define KFORGE_FMHA_H64_QREGS 1
#endif
#ifndef KFORGE_FMHA_H128_MTILES
#define KFORGE_FMHA_H128_MTILES 2
#endif
#ifndef KFORGE_FMHA_H128_BN
#define KFORGE_FMHA_H128_BN 32
#endif
#ifndef KFORGE_FMHA_H128_QREGS
#define KFORGE_FMHA_H128_QREGS 0
#endif
#ifndef KFORGE_FMHA_LAZY_RESCALE
#define KFORGE_FMHA_LAZY_RESCALE 2  // 0: rescale O every step; 1: when alpha != 1 (vote per row); 2: stale max (tuned)
#endif
#ifndef KFORGE_FMHA_H64_STAGES
#define KFORGE_FMHA_H64_STAGES 1
#endif
#ifndef KFORGE_FMHA_H64_SLICE
#define KFORGE_FMHA_H64_SLICE 32
#endif
#ifndef KFORGE_FMHA_H128_STAGES
#define KFORGE_FMHA_H128_STAGES 1
#endif
#ifndef KFORGE_FMHA_H128_SLICE
#define KFORGE_FMHA_H128_SLICE 32
#endif
#ifndef KFORGE_FMHA_FWD_ROUNDED_SUM
// 1: normalise O by the sum of P as rounded to the input dtype (the weights P V really used),
// the LSE still from the fp32 sum. With the stale max (LAZY_RESCALE 2) a row's largest P is
// 2^x, x in (0, 8], not 1, and its rounding scales the whole row of O (up to 2^-9 in bf16); D =
// rowsum(dO * O) carries that into the backward's dS (issue 31, scripts/softmax_rounding_model.py).
// Costs a rounding and an add per score element: to be timed before it becomes the default.
#define KFORGE_FMHA_FWD_ROUNDED_SUM 0
#endif
#ifndef KFORGE_FMHA_POLY_EXP_EVERY
#define KFORGE_FMHA_POLY_EXP_EVERY 0  // N > 0: every N-th n-tile of S uses poly_exp2
#endif
#ifndef KFORGE_FMHA_QK_UNROLL
#define KFORGE_FMHA_QK_UNROLL 0  // 0: unroll the Q K^T k-loop fully; N: unroll by N (Q in smem only)
#endif
#ifndef KFORGE_FMHA_H64_WARPS
#define KFORGE_FMHA_H64_WARPS 4
#endif
#ifndef KFORGE_FMHA_H128_WARPS
#define KFORGE_FMHA_H128_WARPS 4
#endif
template <>
struct FwdConfig<64> {
  static constexpr int kMTiles = KFORGE_FMHA_H64_MTILES;
  static constexpr int kBlockN = KFORGE_FMHA_H64_BN;
  static constexpr bool kQInRegs = KFORGE_FMHA_H64_QREGS != 0;
  static constexpr int kWarps = KFORGE_FMHA_H64_WARPS;
  static constexpr int kStages = KFORGE_FMHA_H64_STAGES;
  static constexpr int kSlice = KFORGE_FMHA_H64_SLICE;
};
template <>
struct FwdConfig<128> {
  static constexpr int kMTiles = KFORGE_FMHA_H128_MTILES;
  static constexpr int kBlockN = KFORGE_FMHA_H128_BN;
  static constexpr bool kQInRegs = KFORGE_FMHA_H128_QREGS != 0;
  static constexpr int kWarps = KFORGE_FMHA_H128_WARPS;
  static constexpr int kStages = KFORGE_FMHA_H128_STAGES;
  static constexpr int kSlice = KFORGE_FMHA_H128_SLICE;
};

// d_qk != d_v (the portable kernel only; FlashMLA-style prefill has (192, 128)). (192, 128):
// 128 query rows as 8 warps of one 16-row slab (with hdim 128's two slabs per warp, the wider
// Q K^T spills on sm_80) and 64-key tiles (FlashAttention-2's hdim-192 shape: 8 independent
// accumulator chains in Q K^T instead of 4), 88 KiB of shared memory; KFORGE_FMHA_FWD_192_BN=32
// gives the 32-key tiles of before (68 KiB). (128, 192): 4 warps of one slab (64 query rows), so
// the O accumulators (24 n-tiles) stay at 96 registers; 32-key tiles (KFORGE_FMHA_FWD_128X192_BN).
#ifndef KFORGE_FMHA_FWD_192_BN
#define KFORGE_FMHA_FWD_192_BN 64
#endif
#ifndef KFORGE_FMHA_FWD_192_STAGES
#define KFORGE_FMHA_FWD_192_STAGES 1  // 2 (double-buffered K / V) fits sm_120 with 32-key tiles only
#endif
#ifndef KFORGE_FMHA_FWD_128X192_BN
#define KFORGE_FMHA_FWD_128X192_BN 32
#endif
template <>
struct FwdConfig<192, 128> {
  static constexpr int kMTiles = 1;
  static constexpr int kBlockN = KFORGE_FMHA_FWD_192_BN;
  static constexpr bool kQInRegs = false;
  static constexpr int kWarps = 8;
  static constexpr int kStages = KFORGE_FMHA_FWD_192_STAGES;
  static constexpr int kSlice = 32;
};
template <>
struct FwdConfig<128, 192> {
  static constexpr int kMTiles = 1;
  static constexpr int kBlockN = KFORGE_FMHA_FWD_128X192_BN;
  static constexpr bool kQInRegs = false;
  static constexpr int kWarps = 4;
  static constexpr int kStages = 1;
  static constexpr int kSlice = 32;
};

template <int HDIM, int HDIM_V = HDIM>
struct FwdShape {
  using C = FwdConfig<HDIM, HDIM_V>;
  static constexpr int kWarps = C::kWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMinBlocks = kWarps >= 8 ? 1 : 2;
  static constexpr int kMTiles = C::kMTiles;
  static constexpr int kBlockM = kWarps * 16 * kMTiles;
  static constexpr int kBlockN = C::kBlockN;
  static constexpr bool kQInRegs = C::kQInRegs;
  static constexpr int kStages = C::kStages;
  static constexpr int kSlice = kStages == 1 ? kBlockN : C::kSlice;
  static_assert(kStages == 1 || kStages == 2, "1 or 2 K/V stages");
  static_assert(kBlockN % kSlice == 0 && kSlice % 16 == 0, "slice must divide the key tile");
  // The Q tile doubles as the O staging buffer, so it holds max(HDIM, HDIM_V) columns.
  static constexpr int kQCols = HDIM > HDIM_V ? HDIM : HDIM_V;
  template <typename T>
  static constexpr int smem_bytes() {
    return (kBlockM * kQCols + kStages * kBlockN * (HDIM + HDIM_V)) * static_cast<int>(sizeof(T));
  }
};

namespace detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][HDIM] tile.
template <int HDIM>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * HDIM + ((chunk ^ (row & 7)) << 3);
}

// ldmatrix addressing. A lane reads 16-byte chunk 2*j + c0 of a row whose (row & 7) is r7, so
// the swizzled chunk is (2*j) ^ x with x = c0 ^ r7 < 8, i.e. (j / 4) * 8 + ((2 * (j % 4)) ^ x):
// four per-lane offsets (kept in registers) plus an immediate, instead of one register per j.
struct SwzCols {
  uint32_t off[4];  // bytes
  __device__ __forceinline__ explicit SwzCols(int x_) : x(x_) {
#pragma unroll
    for (int i = 0; i < 4; ++i) off[i] = static_cast<uint32_t>(((2 * i) ^ x) << 4);
  }
  int x;
  // j must be known after unrolling, so that off[] stays in registers.
  __device__ __forceinline__ uint32_t at(int j) const { return off[j % 4] + (j / 4) * 128; }
  // For loops that are not fully unrolled: two integer ops instead of a register array.
  __device__ __forceinline__ uint32_t at_dyn(int j) const {
    return static_cast<uint32_t>((((2 * (j & 3)) ^ x) << 4) + (j >> 2) * 128);
  }
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0 bytes read: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <typename T>
struct Mma;
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float x, float y) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float x, float y) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// x rounded to T (to nearest even), as a float.
template <typename T>
__device__ __forceinline__ float round_to(float x);
template <>
__device__ __forceinline__ float round_to<__half>(float x) {
  return __half2float(__float2half_rn(x));
}
template <>
__device__ __forceinline__ float round_to<__nv_bfloat16>(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x for x <= 0 on the FMA/ALU pipes (no MUFU): round-to-nearest split x = j + f with the
// 1.5 * 2^23 trick, a degree-4 polynomial for 2^f on [-0.5, 0.5] (relative error ~4e-5, below
// the fp16/bf16 rounding of P), and j added to the exponent bits. Used for a fraction of the
// softmax exponentials to take load off the MUFU unit (KFORGE_FMHA_POLY_EXP_EVERY).
__device__ __forceinline__ float poly_exp2(float x) {
  const float xc = fmaxf(x, -126.f);
  const float t = xc + 12582912.f;  // 1.5 * 2^23: the integer part lands in the low mantissa bits
  const int j = __float_as_int(t);
  const float f = xc - (t - 12582912.f);
  float p = fmaf(f, 0.009618129f, 0.05550411f);
  p = fmaf(p, f, 0.24022651f);
  p = fmaf(p, f, 0.69314718f);
  p = fmaf(p, f, 1.0f);
  // Exactly 0 below 2^-125 (masked scores are -inf; empty rows must sum to 0).
  return x < -125.f ? 0.f : __int_as_float(__float_as_int(p) + (j << 23));
}

// Issue cp.async for a [ROWS][HDIM] tile; rows at or past `valid_rows` are zero-filled.
// Thread t always copies chunk t % CHUNKS of rows t / CHUNKS + i * ROWS_PER_ITER, so the
// global address advances by a constant and the swizzled shared offset is an immediate.
// Tiles whose rows do not split evenly over the threads (hdim 192: 24 chunks a row) take the
// generic loop of load_tile_any: thread t copies chunks t, t + kThreads, ... of the tile.
template <int ROWS, int HDIM, int kThreads, typename T>
__device__ __forceinline__ void load_tile_any(T* smem, const T* gmem, int64_t row_stride,
                                              int valid_rows, int tid) {
  constexpr int kChunks = HDIM / 8;
  constexpr int kTotal = ROWS * kChunks;
#pragma unroll
  for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    if (kTotal % kThreads == 0 || idx < kTotal) {
      const int row = idx / kChunks;
      const int c = idx % kChunks;
      const bool valid = row < valid_rows;
      cp_async16(smem_addr(smem + swz<HDIM>(row, c)),
                 valid ? gmem + static_cast<int64_t>(row) * row_stride + c * 8 : gmem, valid);
    }
  }
}

template <int ROWS, int HDIM, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* smem, const T* gmem, int64_t row_stride,
                                          int valid_rows, int tid) {
  constexpr int kChunks = HDIM / 8;
  constexpr int kRowsPerIter = kThreads / kChunks;
  if constexpr (kThreads % kChunks != 0 || kRowsPerIter == 0 || ROWS % kRowsPerIter != 0 ||
                kRowsPerIter % 8 != 0) {
    load_tile_any<ROWS, HDIM, kThreads>(smem, gmem, row_stride, valid_rows, tid);
  } else {
    constexpr int kIters = ROWS / kRowsPerIter;
    const int row = tid / kChunks;
    const int c = tid % kChunks;
    const T* src = gmem + static_cast<int64_t>(row) * row_stride + c * 8;
    const uint32_t dst = smem_addr(smem + swz<HDIM>(row, c));
    const int64_t step = static_cast<int64_t>(kRowsPerIter) * row_stride;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const bool valid = row + i * kRowsPerIter < valid_rows;
      cp_async16(dst + i * kRowsPerIter * HDIM * static_cast<int>(sizeof(T)),
                 valid ? src + i * step : gmem, valid);
    }
  }
}

// The forward's tile load. Rows that load_tile splits evenly over the threads take load_tile;
// rows of 8k 16-byte chunks that do not (hdim 192: 24 chunks, 256 threads) go in groups of 8
// chunks: thread t copies chunk t % 8 of each group of rows t / 8 + i * (kThreads / 8), so
// (the swizzle only permutes chunks inside a group of 8) every shared offset is the thread's
// base plus an immediate and every global one its base plus i * row step plus 16 bytes * group,
// where load_tile_any divides each chunk index by the row's chunks and selects its pointer
// per chunk. FULL: every row of the tile is valid (a key tile below the last), so no bound and
// no pointer select; only the d_qk != d_v kernels pass it (the others load as before). The
// backward keeps load_tile.
template <int ROWS, int HDIM, int kThreads, bool FULL = false, typename T>
__device__ __forceinline__ void load_tile_fwd(T* smem, const T* gmem, int64_t row_stride,
                                              int valid_rows, int tid) {
  constexpr int kChunks = HDIM / 8;
  constexpr int kDefaultRows = kThreads / kChunks;  // load_tile's rows a pass
  constexpr bool kDefault = kThreads % kChunks == 0 && kDefaultRows > 0 &&
                            kDefaultRows % 8 == 0 && ROWS % kDefaultRows == 0;
  constexpr bool kGrouped = !kDefault && kChunks % 8 == 0 && kThreads % 64 == 0 &&
                            ROWS % (kThreads / 8) == 0;
  if constexpr (!kGrouped && !(kDefault && FULL)) {
    load_tile<ROWS, HDIM, kThreads>(smem, gmem, row_stride, valid_rows, tid);
  } else {
    // G chunks of a row a thread a pass: load_tile's mapping (G = 1) or groups of 8 (G = 8).
    constexpr int G = kGrouped ? 8 : kChunks;
    constexpr int kRowsPerIter = kThreads / G;  // a multiple of 8: (row & 7) fixed over passes
    constexpr int kIters = ROWS / kRowsPerIter;
    const int row = tid / G;
    const int c = tid % G;
    const T* src = gmem + static_cast<int64_t>(row) * row_stride + c * 8;
    const uint32_t dst = smem_addr(smem + swz<HDIM>(row, c));
    const int64_t step = static_cast<int64_t>(kRowsPerIter) * row_stride;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const bool valid = FULL || row + i * kRowsPerIter < valid_rows;
      // A row past the end reads nothing (0 bytes); its pointer stays inside the tile's row 0
      // (every tile the kernel loads has one valid row).
      const T* s = valid ? src + i * step : gmem;
#pragma unroll
      for (int g = 0; g < kChunks / G; ++g) {
        cp_async16(dst + (i * kRowsPerIter * HDIM + g * 64) * static_cast<int>(sizeof(T)),
                   s + g * 64, valid);
      }
    }
  }
}

// Where one CTA's (query block, head, batch) tile lives, for both forward kernels: the sequence
// lengths of this batch entry (varlen through cu_seqlens, or padded), the first query row, the
// Q/K/V/O pointers (GQA: the K/V head is head / head_ratio), the LSE offset, and how many key
// tiles of block_n keys the block visits (a causal mask, bottom-right aligned, cuts the rest).
template <typename T>
struct TileSetup {
  int sq, sk;        // query and key lengths
  int row0;          // first query row of this block
  int64_t lse_off;   // LSE index of row 0 of this batch entry (before head and row)
  int n_blocks;      // key tiles this block visits
  const T* q;        // row row0 of this head's Q
  const T* k;        // key 0 of this head's K
  const T* v;        // key 0 of this head's V
  T* o;              // row row0 of this head's O
};

// Fills `t` and returns true, or returns false when the block starts past the last query row
// (the CTA has nothing to do). VARLEN false: the caller runs fixed-length batches only (the
// cu_seqlens pointers are not read).
template <typename T, bool CAUSAL, bool VARLEN = true>
__device__ __forceinline__ bool setup_tile(const FwdParams& p, int m_block, int head, int b,
                                           int block_m, int block_n, TileSetup<T>& t) {
  int sq = p.seqlen_q, sk = p.seqlen_k;
  int64_t q_off, o_off, lse_off, k_off, v_off;
  if (VARLEN && p.cu_seqlens_q != nullptr) {
    const int start = p.cu_seqlens_q[b];
    sq = p.cu_seqlens_q[b + 1] - start;
    q_off = start * p.q_row_stride;
    o_off = start * p.o_row_stride;
    lse_off = start;
  } else {
    q_off = b * p.q_batch_stride;
    o_off = b * p.o_batch_stride;
    lse_off = b * p.lse_batch_stride;
  }
  if (VARLEN && p.cu_seqlens_k != nullptr) {
    const int start = p.cu_seqlens_k[b];
    sk = p.cu_seqlens_k[b + 1] - start;
    k_off = start * p.k_row_stride;
    v_off = start * p.v_row_stride;
  } else {
    k_off = b * p.k_batch_stride;
    v_off = b * p.v_batch_stride;
  }
  const int row0 = m_block * block_m;
  if (row0 >= sq) return false;
  const int kv_head = head / p.head_ratio;
  int n_blocks = (sk + block_n - 1) / block_n;
  if (CAUSAL) {
    // Last visible key of the last row of this block, bottom-right aligned.
    const int last_row = min(sq, row0 + block_m) - 1;
    const int last_key = last_row + sk - sq;
    n_blocks = min(n_blocks, last_key < 0 ? 0 : (last_key + block_n) / block_n);
  }
  t.sq = sq;
  t.sk = sk;
  t.row0 = row0;
  t.lse_off = lse_off;
  t.n_blocks = n_blocks;
  t.q = static_cast<const T*>(p.q) + q_off + head * p.q_head_stride + row0 * p.q_row_stride;
  t.k = static_cast<const T*>(p.k) + k_off + kv_head * p.k_head_stride;
  t.v = static_cast<const T*>(p.v) + v_off + kv_head * p.v_head_stride;
  t.o = static_cast<T*>(p.o) + o_off + head * p.o_head_stride + row0 * p.o_row_stride;
  return true;
}

// The sum of one query row whose partial sums sit in 4 adjacent lanes (the mma/wgmma accumulator
// layout).
__device__ __forceinline__ float quad_sum(float partial_sum) {
  float sum = partial_sum;
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  return sum;
}
// The LSE (natural log) of a row from its whole sum: -inf for a row with no visible key.
__device__ __forceinline__ float row_lse(float sum, float row_max, float scale_log2) {
  constexpr float kLn2 = 0.6931471805599453f;
  return !(sum > 0.f) ? -__builtin_huge_valf() : (row_max * scale_log2 + __log2f(sum)) * kLn2;
}
// End of the online softmax for one query row whose partial sums sit in 4 adjacent lanes:
// reduce the sum, write the row's LSE (natural log) from lane 4k when `row` < sq, and return the
// factor that normalises O (0 for a row with no visible key).
__device__ __forceinline__ float finish_row(const FwdParams& p, float partial_sum, float row_max,
                                            float scale_log2, int64_t lse_index, bool write_lse) {
  const float sum = quad_sum(partial_sum);
  if (p.lse != nullptr && write_lse) p.lse[lse_index] = row_lse(sum, row_max, scale_log2);
  return !(sum > 0.f) ? 0.f : 1.f / sum;
}

// Raise KERNEL's dynamic shared memory limit to `smem` bytes before its first launch on the current
// device (the limit is a per-device setting of each kernel; each instantiation of this template keeps
// its own per-device flags). Devices past 63 are configured at every call. std::atomic, not the
// GCC __atomic builtins: this host code also builds with MSVC (FlashMLA carries this header).
template <auto KERNEL>
cudaError_t raise_smem_limit_once(int smem) {
  static std::atomic<int> configured[64];  // zero-initialised (static storage): 0 not yet, 1 done
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 64 || configured[dev].load(std::memory_order_acquire) == 0) {
    err = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    if (dev < 64) configured[dev].store(1, std::memory_order_release);
  }
  return cudaSuccess;
}

}  // namespace detail

template <typename T, int HDIM, bool CAUSAL, int HDIM_V = HDIM>
__global__ void __launch_bounds__(FwdShape<HDIM, HDIM_V>::kThreads,
                                  FwdShape<HDIM, HDIM_V>::kMinBlocks)
    fmha_fwd_kernel(const FwdParams p) {
  using namespace detail;
  using S = FwdShape<HDIM, HDIM_V>;
  constexpr int MT = S::kMTiles;
  constexpr int NTHREADS = S::kThreads;
  constexpr int BM = S::kBlockM;
  constexpr int BN = S::kBlockN;
  constexpr int KT = HDIM / 16;  // k-steps of Q K^T
  constexpr int STAGES = S::kStages;
  constexpr int SLICE = S::kSlice;  // keys per softmax update
  constexpr int NT = SLICE / 8;     // n-tiles of S
  constexpr int DT = HDIM_V / 8;  // n-tiles of O
  constexpr float kNegInf = -__builtin_huge_valf();
  constexpr bool kFullLoads = HDIM != HDIM_V;  // unmasked steps load K and V without the bound

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * S::kQCols;
  T* sV = sK + STAGES * BN * HDIM;

  // Heavy (late) query blocks first: they have the most key tiles under a causal mask.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  TileSetup<T> tile;
  if (!setup_tile<T, CAUSAL>(p, m_block, head, b, BM, BN, tile)) return;
  const int sq = tile.sq, sk = tile.sk, row0 = tile.row0, n_blocks = tile.n_blocks;
  const int64_t lse_off = tile.lse_off;
  const T* gQ = tile.q;
  const T* gK = tile.k;
  const T* gV = tile.v;
  T* gO = tile.o;

  load_tile_fwd<BM, HDIM, NTHREADS>(sQ, gQ, p.q_row_stride, sq - row0, tid);
  if (n_blocks > 0) {
    const int nb = n_blocks - 1;
    const int buf = STAGES == 1 ? 0 : (nb & 1);
    load_tile_fwd<BN, HDIM, NTHREADS>(sK + buf * BN * HDIM,
                                  gK + static_cast<int64_t>(nb) * BN * p.k_row_stride,
                                  p.k_row_stride, sk - nb * BN, tid);
  }
  cp_async_commit();
  // V of the first step is in flight while Q and K land (its own group in the 1-stage
  // pipeline, so the first Q K^T only waits for Q and K).
  if (n_blocks > 0) {
    const int nb = n_blocks - 1;
    const int buf = STAGES == 1 ? 0 : (nb & 1);
    load_tile_fwd<BN, HDIM_V, NTHREADS>(sV + buf * BN * HDIM_V,
                                    gV + static_cast<int64_t>(nb) * BN * p.v_row_stride,
                                    p.v_row_stride, sk - nb * BN, tid);
  }
  cp_async_commit();

  const int warp_row = warp * 16 * MT;  // first row of this warp inside the block

  uint32_t qf[S::kQInRegs ? MT : 1][S::kQInRegs ? KT : 1][4];
  float acc[MT][DT][4];
  float row_max[MT][2], row_sum[MT][2];
  constexpr bool kRoundedSum = KFORGE_FMHA_FWD_ROUNDED_SUM != 0;
  float rsum[MT][kRoundedSum ? 2 : 1];  // KFORGE_FMHA_FWD_ROUNDED_SUM: the rounded P's sum
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int d = 0; d < DT; ++d) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][d][e] = 0.f;
    }
    row_max[mt][0] = row_max[mt][1] = kNegInf;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
#pragma unroll
    for (int r = 0; r < (kRoundedSum ? 2 : 1); ++r) rsum[mt][r] = 0.f;
  }

  if constexpr (STAGES == 1) {
    cp_async_wait<1>();  // Q and K
  } else {
    cp_async_wait<0>();  // Q, K and V
  }
  __syncthreads();
  if constexpr (S::kQInRegs) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        const int row = warp_row + mt * 16 + (lane % 16);
        ldsm_x4(qf[mt][kk], smem_addr(sQ + swz<HDIM>(row, kk * 2 + lane / 16)));
      }
    }
  }

  const float scale_log2 = p.scale_log2;

  // Per-lane ldmatrix bases (row part) and swizzled column offsets; see SwzCols.
  const uint32_t q_base = smem_addr(sQ + (warp_row + lane % 16) * HDIM);
  const uint32_t k_base = smem_addr(sK + ((lane / 16) * 8 + lane % 8) * HDIM);
  const uint32_t v_base = smem_addr(sV + (lane % 16) * HDIM_V);
  const SwzCols q_cols((lane / 16) ^ (lane % 8));
  const SwzCols k_cols(((lane / 8) % 2) ^ (lane % 8));
  const SwzCols v_cols((lane / 16) ^ (lane % 8));

  // A key tile needs masking when it holds the end of the keys or crosses the diagonal. Those
  // are the highest tiles, which run first; the rest run through a copy of the step compiled
  // without any masking code (less register pressure in the steady state).
  auto needs_mask = [&](int n) {
    return (n + 1) * BN > sk || (CAUSAL && n * BN + BN - 1 > row0 + sk - sq);
  };

  // S[MT][NT] = Q K^T for NT * 8 keys whose swizzled tile starts at k_addr (lane base).
  auto qk = [&](float (&sc)[MT][NT][4], uint32_t k_addr) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mt][t][e] = 0.f;
      }
    }
    constexpr bool kPartial = KFORGE_FMHA_QK_UNROLL > 0 && !S::kQInRegs;
    constexpr int kUnroll = kPartial ? KFORGE_FMHA_QK_UNROLL : KT;
#pragma unroll(kUnroll)
    for (int kk = 0; kk < KT; ++kk) {
      uint32_t a[MT][4];
      const uint32_t q_off = kPartial ? q_cols.at_dyn(kk) : q_cols.at(kk);
      const uint32_t k_off = kPartial ? k_cols.at_dyn(kk) : k_cols.at(kk);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (S::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][kk][e];
        } else {
          ldsm_x4(a[mt], q_base + mt * 16 * HDIM * int(sizeof(T)) + q_off);
        }
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bk[4];
        ldsm_x4(bk, k_addr + np * 16 * HDIM * int(sizeof(T)) + k_off);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma<T>::run(sc[mt][2 * np], a[mt], bk[0], bk[1]);
          Mma<T>::run(sc[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }
  };

  auto apply_mask = [&](float (&sc)[MT][NT][4], int col0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + warp_row + mt * 16 + lane / 4 + 8 * r;
        const int limit = CAUSAL ? min(sk, row + sk - sq + 1) : sk;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = col0 + t * 8 + 2 * (lane % 4) + e;
            if (col >= limit) sc[mt][t][2 * r + e] = kNegInf;
          }
        }
      }
    }
  };

  // Online softmax in the exp2 domain; S becomes P (unnormalised), O is rescaled.
  auto softmax = [&](float (&sc)[MT][NT][4]) {
    if constexpr (KFORGE_FMHA_LAZY_RESCALE == 2) {
      // Stale-max variant: keep each row's reference max until some row of the warp grows by
      // more than 2^8, so P stays <= 256 (safe in fp16/bf16 and fp32 sums) and O is rescaled
      // only on those rare steps (one warp vote per step instead of 4 * DT multiplies per row).
      float mx[MT][2];
      bool grow = false;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float m = row_max[mt][r];
#pragma unroll
          for (int t = 0; t < NT; ++t) m = fmaxf(m, fmaxf(sc[mt][t][2 * r], sc[mt][t][2 * r + 1]));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          mx[mt][r] = m;
          grow |= (m - row_max[mt][r]) * scale_log2 > 8.f;  // -inf reference: inf > 8
        }
      }
      if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float m_scaled = (mx[mt][r] == kNegInf) ? 0.f : mx[mt][r] * scale_log2;
            const float alpha = fast_exp2(row_max[mt][r] * scale_log2 - m_scaled);
            row_max[mt][r] = mx[mt][r];
            row_sum[mt][r] *= alpha;
            if constexpr (kRoundedSum) rsum[mt][r] *= alpha;
#pragma unroll
            for (int d = 0; d < DT; ++d) {
              acc[mt][d][2 * r] *= alpha;
              acc[mt][d][2 * r + 1] *= alpha;
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float m_scaled = (row_max[mt][r] == kNegInf) ? 0.f : row_max[mt][r] * scale_log2;
          float sum = 0.f, sum_r = 0.f;
#pragma unroll
          for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float x = fast_exp2(fmaf(sc[mt][t][2 * r + e], scale_log2, -m_scaled));
              sum += x;
              if constexpr (kRoundedSum) {
                const float xr = round_to<T>(x);  // P V's weight (packing it again is exact)
                sc[mt][t][2 * r + e] = xr;
                sum_r += xr;
              } else {
                sc[mt][t][2 * r + e] = x;
              }
            }
          }
          row_sum[mt][r] += sum;
          if constexpr (kRoundedSum) rsum[mt][r] += sum_r;
        }
      }
    } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mt][r];
#pragma unroll
        for (int t = 0; t < NT; ++t) mx = fmaxf(mx, fmaxf(sc[mt][t][2 * r], sc[mt][t][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_scaled = (mx == kNegInf) ? 0.f : mx * scale_log2;
        const float alpha = fast_exp2(row_max[mt][r] * scale_log2 - m_scaled);
        row_max[mt][r] = mx;
        float sum = 0.f, sum_r = 0.f;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float arg = fmaf(sc[mt][t][2 * r + e], scale_log2, -m_scaled);
            const bool poly = KFORGE_FMHA_POLY_EXP_EVERY > 0 &&
                              (t % (KFORGE_FMHA_POLY_EXP_EVERY > 0 ? KFORGE_FMHA_POLY_EXP_EVERY : 1)) ==
                                  (KFORGE_FMHA_POLY_EXP_EVERY > 0 ? KFORGE_FMHA_POLY_EXP_EVERY - 1 : 0);
            const float x = poly ? poly_exp2(arg) : fast_exp2(arg);
            sum += x;
            if constexpr (kRoundedSum) {
              const float xr = round_to<T>(x);
              sc[mt][t][2 * r + e] = xr;
              sum_r += xr;
            } else {
              sc[mt][t][2 * r + e] = x;
            }
          }
        }
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
        if constexpr (kRoundedSum) rsum[mt][r] = rsum[mt][r] * alpha + sum_r;
        if (!KFORGE_FMHA_LAZY_RESCALE || __any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
          for (int d = 0; d < DT; ++d) {
            acc[mt][d][2 * r] *= alpha;
            acc[mt][d][2 * r + 1] *= alpha;
          }
        }
      }
    }
    }
  };

  // O += P V for the NT * 8 keys whose swizzled V tile starts at v_addr (lane base).
  auto pv = [&](float (&sc)[MT][NT][4], uint32_t v_addr) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = Mma<T>::pack(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
        a[mt][1] = Mma<T>::pack(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
        a[mt][2] = Mma<T>::pack(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
        a[mt][3] = Mma<T>::pack(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t bv[4];
        ldsm_x4_t(bv, v_addr + kk * 16 * HDIM_V * int(sizeof(T)) + v_cols.at(dp));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma<T>::run(acc[mt][2 * dp], a[mt], bv[0], bv[1]);
          Mma<T>::run(acc[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  };

  // full: every key of tile n is below sk (the loads of an unmasked step); the bound is dropped
  // at d_qk != d_v only, so that the other pairs' loads stay as they were.
  auto load_k = [&](int n, int buf, auto full) {
    load_tile_fwd<BN, HDIM, NTHREADS, kFullLoads && decltype(full)::value>(
        sK + buf * BN * HDIM, gK + static_cast<int64_t>(n) * BN * p.k_row_stride, p.k_row_stride,
        sk - n * BN, tid);
  };
  auto load_v = [&](int n, int buf, auto full) {
    load_tile_fwd<BN, HDIM_V, NTHREADS, kFullLoads && decltype(full)::value>(
        sV + buf * BN * HDIM_V, gV + static_cast<int64_t>(n) * BN * p.v_row_stride,
        p.v_row_stride, sk - n * BN, tid);
  };
  constexpr uint32_t kTileBytes = BN * HDIM * sizeof(T);
  constexpr uint32_t kVTileBytes = BN * HDIM_V * sizeof(T);

  auto step = [&](int n, auto masked) {
    // An unmasked step's tiles (n, and n - 1 below it) hold no key at or past sk.
    const std::bool_constant<!decltype(masked)::value> full{};
    if constexpr (STAGES == 1) {
      // Two barriers per step (as in FlashAttention-2): here K(n) has landed and every warp is
      // done reading sV; after Q K^T, V(n) has landed and every warp is done reading sK.
      if (n != n_blocks - 1) {  // the first step's V was issued with Q and K
        cp_async_wait<0>();
        __syncthreads();
        load_v(n, 0, full);
        cp_async_commit();
      }
      float sc[MT][NT][4];
      qk(sc, k_base);
      if constexpr (decltype(masked)::value) apply_mask(sc, n * BN);
      cp_async_wait<0>();
      __syncthreads();
      if (n > 0) load_k(n - 1, 0, full);
      cp_async_commit();
      softmax(sc);
      pv(sc, v_base);
    } else {
      // Double-buffered K and V: one barrier per step. Tile n-1 loads into the other buffer
      // while tile n is consumed in slices of SLICE keys.
      const int buf = n & 1;
      cp_async_wait<0>();
      __syncthreads();
      if (n > 0) {
        load_k(n - 1, buf ^ 1, full);
        load_v(n - 1, buf ^ 1, full);
      }
      cp_async_commit();
#pragma unroll
      for (int sl = 0; sl < BN / SLICE; ++sl) {
        float sc[MT][NT][4];
        qk(sc, k_base + buf * kTileBytes + sl * SLICE * HDIM * int(sizeof(T)));
        if constexpr (decltype(masked)::value) apply_mask(sc, n * BN + sl * SLICE);
        softmax(sc);
        pv(sc, v_base + buf * kVTileBytes + sl * SLICE * HDIM_V * int(sizeof(T)));
      }
    }
  };

  int n = n_blocks - 1;
  for (; n >= 0 && needs_mask(n); --n) step(n, std::true_type{});
  for (; n >= 0; --n) step(n, std::false_type{});

  // Epilogue: normalise, write LSE, stage O through this warp's rows of sQ, store 16 bytes
  // per thread. A warp only ever reads its own rows of sQ, so no CTA barrier is needed, except
  // when O's rows are not Q's (d_qk != d_v): then one warp's O rows overlap another's Q rows.
  if constexpr (HDIM != HDIM_V) __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + warp_row + mt * 16 + lane / 4 + 8 * r;
      float inv = finish_row(p, row_sum[mt][r], row_max[mt][r], scale_log2,
                             lse_off + head * p.lse_head_stride + row, (lane % 4) == 0 && row < sq);
      if constexpr (kRoundedSum) {
        const float sr = quad_sum(rsum[mt][r]);
        inv = !(sr > 0.f) ? 0.f : 1.f / sr;
      }
#pragma unroll
      for (int d = 0; d < DT; ++d) {
        acc[mt][d][2 * r] *= inv;
        acc[mt][d][2 * r + 1] *= inv;
      }
    }
#pragma unroll
    for (int d = 0; d < DT; ++d) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp_row + mt * 16 + lane / 4 + 8 * r;
        const int col = d * 8 + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(sQ + swz<HDIM_V>(row, d) + (col & 7)) =
            Mma<T>::pack(acc[mt][d][2 * r], acc[mt][d][2 * r + 1]);
      }
    }
  }
  __syncwarp();
  constexpr int kChunks = HDIM_V / 8;
  constexpr int kWarpChunks = 16 * MT * kChunks;
#pragma unroll
  for (int i = 0; i < kWarpChunks / 32; ++i) {
    const int idx = i * 32 + lane;
    const int row = warp_row + idx / kChunks;
    const int c = idx % kChunks;
    if (row0 + row < sq) {
      *reinterpret_cast<uint4*>(gO + static_cast<int64_t>(row) * p.o_row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(sQ + swz<HDIM_V>(row, c));
    }
  }
}

template <typename T, int HDIM, bool CAUSAL, int HDIM_V>
cudaError_t launch_fwd(const FwdParams& params, cudaStream_t stream) {
  using S = FwdShape<HDIM, HDIM_V>;
  constexpr int smem = S::template smem_bytes<T>();
  static_assert(HDIM == HDIM_V || smem <= 101376,
                "a d_qk != d_v forward tile must fit sm_120's 101,376 B of shared memory a block");
  auto kernel = fmha_fwd_kernel<T, HDIM, CAUSAL, HDIM_V>;
  cudaError_t err = detail::raise_smem_limit_once<fmha_fwd_kernel<T, HDIM, CAUSAL, HDIM_V>>(smem);
  if (err != cudaSuccess) return err;
  const dim3 grid((params.seqlen_q + S::kBlockM - 1) / S::kBlockM, params.num_heads, params.batch);
  kernel<<<grid, S::kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace kforge_fmha

// d_qk != d_v: the portable kernel only, in a compile unit of its own (with the launch manifest
// of fmha_manifest.h).
#define KFORGE_FMHA_INSTANTIATE_QKV(T, HDIM, HDIM_V)                                          \
  template cudaError_t kforge_fmha::launch_fwd<T, HDIM, false, HDIM_V>(                        \
      const kforge_fmha::FwdParams&, cudaStream_t);                                            \
  template cudaError_t kforge_fmha::launch_fwd<T, HDIM, true, HDIM_V>(                         \
      const kforge_fmha::FwdParams&, cudaStream_t);                                            \
  [[maybe_unused]] static __device__ const KforgeLaunchSmem kforge_launch_smem[] = {           \
      {"fmha_fwd_kernel", kforge_fmha::FwdShape<HDIM, HDIM_V>::smem_bytes<T>()}};

#define KFORGE_FMHA_INSTANTIATE(T, HDIM)                                                       \
  template cudaError_t kforge_fmha::launch_fwd<T, HDIM, false>(const kforge_fmha::FwdParams&, \
                                                               cudaStream_t);                \
  template cudaError_t kforge_fmha::launch_fwd<T, HDIM, true>(const kforge_fmha::FwdParams&,  \
                                                              cudaStream_t);
