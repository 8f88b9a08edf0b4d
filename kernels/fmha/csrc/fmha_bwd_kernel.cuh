// FlashAttention-2-style backward pass for sm_80 and newer (mma.sync, ldmatrix, cp.async): the
// portable path of kforge_fmha_bwd. Three kernels, launched in this order on one stream:
//
// 1. preprocess: one warp per query row computes D = rowsum(dO * O) in fp32, converts the
//    forward's LSE (natural log) to LSE * log2(e) (a row that saw no key, LSE = -inf, gets +inf so
//    its P is exactly 0), and zeroes the row's fp32 dQ accumulator (and, in the deterministic mode,
//    the dQ semaphores).
// 2. main: one CTA per (key block, kv head, batch). K and V of the key block stay in shared
//    memory; the CTA loops over the query heads of its GQA group and, for each, over the query
//    blocks that see the key block (bottom-right aligned causal mask, as the forward: query row r
//    of a sequence with lengths (sq, sk) sees key c iff c <= r + sk - sq). Q, dO, LSE and D of
//    query block i + 1 stream in with cp.async while block i is computed. Each warp owns 16 keys
//    and works on transposed tiles, so that every product but dQ takes its A operand from
//    registers or from its own rows:
//      S^T  = K Q^T                     (16 keys x BLOCK_M queries per warp)
//      P^T  = exp2(S^T * scale * log2(e) - LSE * log2(e))      (the forward's softmax, recomputed)
//      dP^T = V dO^T
//      dV  += P^T dO                    (P^T from the accumulators, as the forward's P V)
//      dS^T = P^T * (dP^T - D)
//      dK  += dS^T Q                    (dK scaled by softmax_scale once, at the end)
//      dQ  += dS K                      (dS^T through shared memory; fp32 atomics into the
//                                        accumulator; the scale is applied by the convert kernel)
//    dK and dV of the kv head are summed over the query heads of its group inside the CTA, in
//    registers: deterministic, no atomics. dQ is summed over key blocks with fp32 atomicAdd, in an
//    order that depends on scheduling, unless BwdParams::deterministic: then the key blocks of a
//    (batch, head, query block) add their dQ in a fixed order (highest key block first), each
//    waiting on a per-block counter in the workspace. The grid is ordered so that every block a
//    CTA waits for was scheduled before it.
// 3. convert: dQ = softmax_scale * dQ_accum, in the input dtype, with dQ's strides.
//
// Tile shapes per (head_dim_qk, head_dim_v) are in fmha_bwd_config.h. Variants for tuning sweeps
// (benchmarks/fmha_bwd_sweep.py), all off by default (the default kernels compile to the same
// cubins as before they existed): slabs of 32 keys (slab_mtiles 2, SPLIT 2 only: a warp holds
// two 16-key m-tiles, so every Q / dO / P^T / dS^T fragment it loads feeds two mma instead of
// one, the main lever on shared-memory traffic per mma); dQ's adds as red.global.add.v4.f32
// (KFORGE_FMHA_BWD_DQ_V4, sm_90+); one dO buffer (do_buffers 1, SPLIT 2: the next step's dO is
// loaded after dV, under dK and dQ); tiles over sm_120's 99 KiB (KFORGE_FMHA_BWD_SMEM_LIMIT).
#pragma once

#include "fmha_bwd_config.h"
#include "fmha_fwd_kernel.cuh"  // detail:: cp.async, ldmatrix, mma.sync, swizzle, tile loads
#include "fmha_manifest.h"

// dQ's staged adds (fmha_bwd_config.h, KFORGE_FMHA_BWD_DQ_BULK) in this compile pass: sm_90
// and newer.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KFORGE_FMHA_BWD_BULK_HERE 1
#else
#define KFORGE_FMHA_BWD_BULK_HERE 0
#endif

namespace kforge_fmha {

template <int HDIM_QK, int HDIM_V>
struct BwdShape {
  static constexpr BwdTile kTile = *bwd_tile(HDIM_QK, HDIM_V);
  static constexpr int kWarps = kTile.warps;
  static constexpr int kSplit = kTile.split;  // warps per slab
  static constexpr int kMt = kTile.slab_mtiles;  // 16-key m-tiles per slab
  static constexpr int kSlabKeys = 16 * kMt;
  static constexpr int kSlabs = kWarps / kSplit;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockN = kSlabKeys * kSlabs;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kQuerySlice = kTile.query_slice;
  static constexpr int kDsStride = kBlockM + 8;  // dS^T row, padded: conflict-free ldmatrix
  // Shared memory carve-up, in bytes (2-byte elements).
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kBlockN * HDIM_QK * 2;
  static constexpr int kOffQ = kOffV + kBlockN * HDIM_V * 2;
  static constexpr int kOffDo = kOffQ + 2 * kBlockM * HDIM_QK * 2;
  static constexpr int kDoBufs = kTile.do_buffers;
  static constexpr int kOffDs = kOffDo + kDoBufs * kBlockM * HDIM_V * 2;
  static constexpr bool kPairs = kTile.warp_pairs != 0;  // warp pairs: roles, not column halves
  static constexpr int kOffPt = kOffDs + kBlockN * kDsStride * 2;  // P^T (SPLIT 2 only)
  static constexpr int kOffLse = kOffPt + (kPairs ? 0 : kSplit - 1) * kBlockN * kDsStride * 2;
  static constexpr int kOffD = kOffLse + 2 * kBlockM * 4;
  static constexpr int kOffPx = kOffD + 2 * kBlockM * 4;  // warp pairs: P^T handed over, fp32
  static constexpr int kOffDqStage = kOffPx + (kPairs ? 4 * kBlockN * kBlockM : 0);
  static constexpr int kSmemBytes = kOffDqStage + bwd_dq_stage_bytes(kTile);
  static_assert(kSmemBytes == bwd_smem_bytes(kTile), "fmha_bwd_config.h's size is this carve-up");
  static_assert(kOffPx % 16 == 0, "the hand-over tile takes 16-byte stores");
  static_assert(kBlockM % 16 == 0 && kBlockM <= kThreads, "query block");
  static_assert(kSplit == 1 || kSplit == 2, "one or two warps per 16-key slab");
  static_assert(kMt == 1 || (kMt == 2 && kSplit == 2) || (kPairs && kMt == 4),
                "32-key slabs: two warps a slab (64 with warp pairs)");
  static_assert(!kPairs || (kSplit == 2 && kTile.do_buffers == 2 && (HDIM_QK == HDIM_V || kMt == 1)),
                "warp pairs: two warps a slab, two dO buffers; 16-key slabs when d_qk != d_v");
  static_assert(kDoBufs == 2 || (kDoBufs == 1 && kSplit == 2), "one dO buffer: SPLIT 2 only");
  static_assert(kQuerySlice % 16 == 0 && (kBlockM / (kPairs ? 1 : kSplit)) % kQuerySlice == 0,
                "query slice");
  static_assert(HDIM_QK % (16 * kSplit) == 0 && HDIM_V % (16 * kSplit) == 0, "column split");
  static_assert((kDsStride * 2 / 16) % 2 == 1, "dS^T rows must be an odd number of 16-byte chunks");
  // dQ = dS K: the BLOCK_M x HDIM_QK product is split over the warps, kWarpsM along the rows
  // (16-row tiles) and kWarpsD along the columns; each warp does kMTilesPerWarp row tiles (every
  // kWarpsM-th) and kDqCols columns in chunks of kDqChunk (an accumulator of kMTilesPerWarp *
  // kDqChunk / 2 floats; each K fragment feeds the kMTilesPerWarp row tiles).
  static constexpr int kMTilesQ = kBlockM / 16;
  static constexpr int kWarpsM = bwd_dq_warps_m(kTile);
  static constexpr int kWarpsD = kWarps / kWarpsM;
  static constexpr int kMTilesPerWarp = kMTilesQ / kWarpsM;
  static constexpr int kDqCols = HDIM_QK / kWarpsD;
  static constexpr int kDqChunk = kDqCols % 64 == 0 ? 64 : (kDqCols % 48 == 0 ? 48 : 32);
  static_assert(kWarpsM >= 1 && kWarpsM <= kWarps && kWarps % kWarpsM == 0 &&
                    kMTilesQ % kWarpsM == 0,
                "dQ warp split");
  // DQ_BULK: a warp's staging tile, rows of kDqCols + 8 floats (conflict-free float2 stores:
  // rows 0-3 of a half-warp start 8 banks apart); lane l adds row l of it.
  static constexpr int kDqStageRow = (kDqCols + 8) * 4;  // bytes
  static constexpr int kDqStageWarp = kMTilesPerWarp * 16 * kDqStageRow;
  static constexpr bool kDqBulk = bwd_dq_stage_bytes(kTile) > 0;  // dQ staged on this tile
  static constexpr int kDqBulkMode = kDqBulk ? bwd_dq_bulk(kTile) : 0;  // 1 bulk, 2 staged v4
  static_assert(bwd_dq_stage_bytes(kTile) == 0 || bwd_dq_stage_bytes(kTile) == kWarps * kDqStageWarp,
                "fmha_bwd_config.h's staging size");
  static_assert(!kDqBulk || kMTilesPerWarp * 16 <= 32, "staged dQ: a lane a row");
  static_assert(HDIM_QK % kWarpsD == 0 && kDqCols % kDqChunk == 0 && kDqChunk % 16 == 0,
                "dQ column split");
};

// Preprocess and convert kernels: 4 warps, 64 query rows per CTA.
inline constexpr int kBwdRowsPerCta = 64;

namespace detail {

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;  // 0 bytes read: zero-filled
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Bulk reductions (sm_90 and newer): [gdst .. + bytes) += [ssrc .. + bytes) (fp32),
// asynchronously, in this thread's bulk group; both 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gdst, uint32_t ssrc, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   gdst),
               "r"(ssrc), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ float4 ld_shared_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// This thread's bulk reductions have read their shared memory (it may be overwritten).
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// This thread's bulk reductions are complete.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// This thread's generic-proxy shared-memory stores, visible to the bulk (async) proxy.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#endif

// Two packed 2-byte pairs (Mma<T>::pack's layout) back to four floats.
template <typename T>
__device__ __forceinline__ float4 unpack4(uint2 u) {
  float2 lo, hi;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  } else {
    lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  }
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Warp pairs: the P^T hand-over between the two warps of a slab (named barrier id, 64 threads).
__device__ __forceinline__ void pair_arrive(int id) {
  asm volatile("bar.arrive %0, 64;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void pair_sync(int id) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory");
}

// Warp pairs, the second product: acc[mt][0 .. DT) += F B over the slice's query columns, F
// (P^T or dS^T) as A fragments and B ([query][d] rows of ROW elements: dO or Q) transposed by
// ldmatrix; acc has DTA >= DT n-tiles (the larger of the pair's two rows).
template <typename T, int DT, int ROW, int MT, int NTS, int DTA>
__device__ __forceinline__ void pair_second_product(float (&acc)[MT][DTA][4],
                                                    const uint32_t (&fa)[MT][NTS / 2][4],
                                                    uint32_t b2, int c0, const SwzCols& t_cols) {
  constexpr int ES = static_cast<int>(sizeof(T));
#pragma unroll
  for (int kk = 0; kk < ((KFORGE_FMHA_BWD_DIAG & 8) ? 0 : NTS / 2); ++kk) {
#pragma unroll
    for (int dd = 0; dd < DT / 2; ++dd) {
      uint32_t bv[4];
      ldsm_x4_t(bv, b2 + (c0 + kk * 16) * ROW * ES + t_cols.at(dd));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma<T>::run(acc[mt][2 * dd], fa[mt][kk], bv[0], bv[1]);
        Mma<T>::run(acc[mt][2 * dd + 1], fa[mt][kk], bv[2], bv[3]);
      }
    }
  }
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// *p += a, *(p + 1) += b in global memory, as one vector reduction where the arch has it (sm_90
// and newer: half the dQ atomic instructions), else as two fp32 atomics. p is 8-byte aligned.
__device__ __forceinline__ void atomic_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// *p .. *(p + 3) += a, b, c, d as one vector reduction (sm_90 and newer). p is 16-byte aligned.
__device__ __forceinline__ void atomic_add4(float* p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}
#endif

// A [ROWS][HDIM] tile whose rows are all in the sequence: load_tile's chunks to the same swizzled
// slots, without its per-chunk bound (a compare and two 64-bit selects a 16-byte chunk).
template <int ROWS, int HDIM, int kThreads, typename T>
__device__ __forceinline__ void load_tile_full(T* smem, const T* gmem, int64_t row_stride, int tid) {
  constexpr int kChunks = HDIM / 8;
  constexpr int kRowsPerIter = kThreads / kChunks;
  if constexpr (kThreads % kChunks != 0 || kRowsPerIter == 0 || ROWS % kRowsPerIter != 0 ||
                kRowsPerIter % 8 != 0) {  // load_tile_any's order
    constexpr int kTotal = ROWS * kChunks;
#pragma unroll
    for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      if (kTotal % kThreads == 0 || idx < kTotal) {
        const int row = idx / kChunks;
        const int c = idx % kChunks;
        cp_async16(smem_addr(smem + swz<HDIM>(row, c)),
                   gmem + static_cast<int64_t>(row) * row_stride + c * 8, true);
      }
    }
  } else {
    const int row = tid / kChunks;
    const int c = tid % kChunks;
    const T* src = gmem + static_cast<int64_t>(row) * row_stride + c * 8;
    const uint32_t dst = smem_addr(smem + swz<HDIM>(row, c));
    const int64_t step = static_cast<int64_t>(kRowsPerIter) * row_stride;
#pragma unroll
    for (int i = 0; i < ROWS / kRowsPerIter; ++i) {
      cp_async16(dst + i * kRowsPerIter * HDIM * static_cast<int>(sizeof(T)), src + i * step, true);
    }
  }
}

// load_tile of a query tile: rows at or past valid_rows zero-filled. A tile whose rows are all
// valid (every query block but a sequence's last) takes load_tile_full, unless
// KFORGE_FMHA_BWD_FULL_TILE_LOADS is 0 (the per-chunk bounds everywhere, as before).
template <int ROWS, int HDIM, int kThreads, typename T>
__device__ __forceinline__ void load_query_tile(T* smem, const T* gmem, int64_t row_stride,
                                                int valid_rows, int tid) {
#if KFORGE_FMHA_BWD_FULL_TILE_LOADS
  if (valid_rows >= ROWS) {
    load_tile_full<ROWS, HDIM, kThreads>(smem, gmem, row_stride, tid);
    return;
  }
#endif
  load_tile<ROWS, HDIM, kThreads>(smem, gmem, row_stride, valid_rows, tid);
}

// The S^T / dP^T k-loops as i (rolled) x u (unrolled), k-step kk = U i + u, with U =
// kstep_unroll<K>(unroll): the unroll, or K when that covers every step.
template <int K>
__host__ __device__ constexpr int kstep_unroll(int unroll) {
  return unroll >= K ? K : unroll;
}
// SwzCols::at_dyn(U i + u) for u < U known after unrolling. For U = 1, 2 or 4, U i and u are
// disjoint bits of kk % 4, so the offset is at(u) with bits toggled by i (one LOP3 a step and
// operand, the same value): ((2 (kk % 4)) ^ x) << 4 = at(u) ^ ((U i % 4) << 5), plus
// (kk / 4) * 128 = (U i / 4) * 128. Any other U: at_dyn.
template <int U>
__device__ __forceinline__ uint32_t kstep_off(const SwzCols& c, int i, int u) {
  if constexpr (U == 1 || U == 2 || U == 4) {
    return (c.at(u) ^ (static_cast<uint32_t>((U * i) & 3) << 5)) +
           static_cast<uint32_t>((U * i) >> 2) * 128;
  } else {
    return c.at_dyn(U * i + u);
  }
}

template <typename T>
__device__ __forceinline__ float2 to_float2(uint32_t x);
template <>
__device__ __forceinline__ float2 to_float2<__half>(uint32_t x) {
  return __half22float2(*reinterpret_cast<const __half2*>(&x));
}
template <>
__device__ __forceinline__ float2 to_float2<__nv_bfloat16>(uint32_t x) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
}

// Where sequence b lives: its lengths (clamped to the grid's max_seqlen and to the workspace, so
// a bad cu_seqlens cannot make a kernel write out of bounds), the element offsets of its row 0
// in every tensor (heads not included) and its first row in the workspace arrays.
struct BwdSeq {
  int sq, sk;
  int64_t ws_row;
  int64_t q, o, dout, dq, lse;
  int64_t k, v, dk, dv;
};

__device__ __forceinline__ BwdSeq bwd_seq(const BwdParams& p, int b) {
  BwdSeq s;
  if (p.cu_seqlens_q != nullptr) {
    const int start = p.cu_seqlens_q[b];
    int len = p.cu_seqlens_q[b + 1] - start;
    if (start < 0 || start > p.rows) len = 0;
    len = max(0, min(len, min(p.seqlen_q, static_cast<int>(p.rows - (start < 0 ? 0 : start)))));
    s.sq = len;
    s.ws_row = start < 0 ? 0 : start;
    s.q = s.ws_row * p.q_row_stride;
    s.o = s.ws_row * p.o_row_stride;
    s.dout = s.ws_row * p.do_row_stride;
    s.dq = s.ws_row * p.dq_row_stride;
    s.lse = s.ws_row;
  } else {
    s.sq = p.seqlen_q;
    s.ws_row = static_cast<int64_t>(b) * p.seqlen_q;
    s.q = b * p.q_batch_stride;
    s.o = b * p.o_batch_stride;
    s.dout = b * p.do_batch_stride;
    s.dq = b * p.dq_batch_stride;
    s.lse = b * p.lse_batch_stride;
  }
  if (p.cu_seqlens_k != nullptr) {
    const int start = p.cu_seqlens_k[b];
    const int len = p.cu_seqlens_k[b + 1] - start;
    s.sk = start < 0 ? 0 : max(0, min(len, p.seqlen_k));
    const int64_t st = start < 0 ? 0 : start;
    s.k = st * p.k_row_stride;
    s.v = st * p.v_row_stride;
    s.dk = st * p.dk_row_stride;
    s.dv = st * p.dv_row_stride;
  } else {
    s.sk = p.seqlen_k;
    s.k = b * p.k_batch_stride;
    s.v = b * p.v_batch_stride;
    s.dk = b * p.dk_batch_stride;
    s.dv = b * p.dv_batch_stride;
  }
  return s;
}

// The first query block (of BM rows) that sees key n0: 0, or (causal, bottom-right aligned) the
// block of the first row that does; m_total when none does.
template <bool CAUSAL>
__device__ __forceinline__ int bwd_first_query_block(int n0, int sq, int sk, int bm, int m_total) {
  if (!CAUSAL) return 0;
  const int r_min = max(0, n0 - (sk - sq));
  return r_min >= sq ? m_total : r_min / bm;
}

// The key block's K and V rows (from key n0 of kv_head) into shared memory, rows past the keys
// zero-filled (one cp.async group is left open: the caller commits).
template <int BN, int HDIM_QK, int HDIM_V, int NT, typename T>
__device__ __forceinline__ void load_kv_block(T* sK, T* sV, const BwdParams& p, const BwdSeq& s,
                                              int kv_head, int n0, int tid) {
  const T* gK = static_cast<const T*>(p.k) + s.k + kv_head * p.k_head_stride +
                static_cast<int64_t>(n0) * p.k_row_stride;
  const T* gV = static_cast<const T*>(p.v) + s.v + kv_head * p.v_head_stride +
                static_cast<int64_t>(n0) * p.v_row_stride;
  load_tile<BN, HDIM_QK, NT>(sK, gK, p.k_row_stride, s.sk - n0, tid);
  load_tile<BN, HDIM_V, NT>(sV, gV, p.v_row_stride, s.sk - n0, tid);
}

// LSE * log2(e) and D of query rows r0 .. r0 + BM of head h into sLse, sD (threads 0 .. BM - 1),
// zero past the sequence.
template <int BM>
__device__ __forceinline__ void load_lse_d(float* sLse, float* sD, const BwdParams& p,
                                           const BwdSeq& s, int h, int r0, int tid) {
  if (tid < BM) {
    const bool valid = r0 + tid < s.sq;
    const int64_t w = h * p.rows + s.ws_row + r0 + tid;
    cp_async4(smem_addr(sLse + tid), valid ? p.lse_log2 + w : p.lse_log2, valid);
    cp_async4(smem_addr(sD + tid), valid ? p.dpsum + w : p.dpsum, valid);
  }
}

}  // namespace detail

// ---- 1. preprocess --------------------------------------------------------------------------

template <typename T, int HDIM_QK, int HDIM_V>
__global__ void __launch_bounds__(128) fmha_bwd_preprocess_kernel(const BwdParams p) {
  using namespace detail;
  constexpr float kLog2e = 1.4426950408889634f;
  const int head = blockIdx.y;
  const int b = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const BwdSeq s = bwd_seq(p, b);
  if (p.dq_semaphore != nullptr && blockIdx.x == 0) {
    int* sem = p.dq_semaphore + (static_cast<int64_t>(b) * p.num_heads + head) * p.m_blocks;
    for (int i = threadIdx.x; i < p.m_blocks; i += blockDim.x) sem[i] = 0;
  }
  const T* o = static_cast<const T*>(p.o) + s.o + head * p.o_head_stride;
  const T* dout = static_cast<const T*>(p.dout) + s.dout + head * p.do_head_stride;
  const float* lse = p.lse + s.lse + head * p.lse_head_stride;
  const int64_t ws = head * p.rows + s.ws_row;
  constexpr int kRowsPerWarp = kBwdRowsPerCta / 4;
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = blockIdx.x * kBwdRowsPerCta + warp * kRowsPerWarp + i;
    if (row >= s.sq) break;
    float sum = 0.f;
#pragma unroll
    for (int c = lane; c < HDIM_V / 8; c += 32) {
      const uint4 a = *reinterpret_cast<const uint4*>(o + row * p.o_row_stride + c * 8);
      const uint4 d = *reinterpret_cast<const uint4*>(dout + row * p.do_row_stride + c * 8);
      const uint32_t av[4] = {a.x, a.y, a.z, a.w};
      const uint32_t dv[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = to_float2<T>(av[e]);
        const float2 y = to_float2<T>(dv[e]);
        sum = fmaf(x.x, y.x, fmaf(x.y, y.y, sum));
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      const float l = lse[row];
      p.dpsum[ws + row] = sum;
      p.lse_log2[ws + row] = l == -__builtin_huge_valf() ? __builtin_huge_valf() : l * kLog2e;
    }
    float4* acc = reinterpret_cast<float4*>(p.dq_accum + (ws + row) * HDIM_QK);
#pragma unroll
    for (int c = lane; c < HDIM_QK / 4; c += 32) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// ---- 3. convert -------------------------------------------------------------------------------

template <typename T, int HDIM_QK>
__global__ void __launch_bounds__(128) fmha_bwd_convert_dq_kernel(const BwdParams p) {
  using namespace detail;
  const int head = blockIdx.y;
  const int b = blockIdx.z;
  const BwdSeq s = bwd_seq(p, b);
  constexpr int kChunks = HDIM_QK / 8;
  const float* acc = p.dq_accum + (head * p.rows + s.ws_row) * HDIM_QK;
  T* dq = static_cast<T*>(p.dq) + s.dq + head * p.dq_head_stride;
  const float scale = p.softmax_scale;
  for (int idx = threadIdx.x; idx < kBwdRowsPerCta * kChunks; idx += blockDim.x) {
    const int row = blockIdx.x * kBwdRowsPerCta + idx / kChunks;
    const int c = idx % kChunks;
    if (row >= s.sq) break;  // idx grows with the row
    const float4 x = *reinterpret_cast<const float4*>(acc + static_cast<int64_t>(row) * HDIM_QK + c * 8);
    const float4 y =
        *reinterpret_cast<const float4*>(acc + static_cast<int64_t>(row) * HDIM_QK + c * 8 + 4);
    uint4 out;
    out.x = Mma<T>::pack(x.x * scale, x.y * scale);
    out.y = Mma<T>::pack(x.z * scale, x.w * scale);
    out.z = Mma<T>::pack(y.x * scale, y.y * scale);
    out.w = Mma<T>::pack(y.z * scale, y.w * scale);
    *reinterpret_cast<uint4*>(dq + row * p.dq_row_stride + c * 8) = out;
  }
}

// ---- 2. main ----------------------------------------------------------------------------------

template <typename T, int HDIM_QK, int HDIM_V, bool CAUSAL>
__global__ void __launch_bounds__(BwdShape<HDIM_QK, HDIM_V>::kThreads, 1)
    fmha_bwd_kernel(const BwdParams p) {
  using namespace detail;
  using S = BwdShape<HDIM_QK, HDIM_V>;
  constexpr int NTHREADS = S::kThreads;
  constexpr int BN = S::kBlockN;
  constexpr int BM = S::kBlockM;
  constexpr int KQ = HDIM_QK / 16;  // k-steps over head_dim_qk
  constexpr int KV = HDIM_V / 16;   // k-steps over head_dim_v
  constexpr int QS = S::kQuerySlice;  // query columns per S^T slice
  constexpr int NTS = QS / 8;         // n-tiles of an S^T / dP^T slice
  constexpr int SPLIT = S::kSplit;
  constexpr int MT = S::kMt;  // 16-key m-tiles of this warp's slab
  constexpr bool kPairs = S::kPairs;  // warp pairs: one accumulator a warp, dV or dK (whole rows)
  constexpr int DTQ = kPairs ? 1 : HDIM_QK / 8 / SPLIT;  // n-tiles of this warp's dK columns
  constexpr int DTV = kPairs ? 1 : HDIM_V / 8 / SPLIT;   // n-tiles of this warp's dV columns
  constexpr int DTP = (HDIM_QK > HDIM_V ? HDIM_QK : HDIM_V) / 8;  // warp pairs: n-tiles, a row
  constexpr int kCols = kPairs ? BM : BM / SPLIT;  // query columns of S^T this warp computes
  constexpr int ES = static_cast<int>(sizeof(T));
  constexpr uint32_t kQBuf = BM * HDIM_QK * ES;  // bytes of one Q buffer
  constexpr uint32_t kDoBuf = BM * HDIM_V * ES;
  constexpr bool kDoSingle = S::kDoBufs == 1;  // one dO buffer, loaded after dV
#ifdef KFORGE_FMHA_BWD_KUNROLL  // one value for every pair (a tuning sweep)
  constexpr int kKUnroll = KFORGE_FMHA_BWD_KUNROLL;
#else
  constexpr int kKUnroll = S::kTile.k_unroll;
#endif

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw + S::kOffK);
  T* sV = reinterpret_cast<T*>(smem_raw + S::kOffV);
  T* sQ = reinterpret_cast<T*>(smem_raw + S::kOffQ);
  T* sDo = reinterpret_cast<T*>(smem_raw + S::kOffDo);
  T* sDs = reinterpret_cast<T*>(smem_raw + S::kOffDs);
  T* sPt = reinterpret_cast<T*>(smem_raw + S::kOffPt);
  float* sLse = reinterpret_cast<float*>(smem_raw + S::kOffLse);
  float* sD = reinterpret_cast<float*>(smem_raw + S::kOffD);

  // Causal: low key blocks see the most query rows, so they go first. The deterministic mode adds
  // dQ highest key block first, and a CTA waits only for higher key blocks: those must have been
  // scheduled before it, so it walks the key blocks from the top.
  const bool det = p.dq_semaphore != nullptr;
  const int n_block = det ? static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)
                          : static_cast<int>(blockIdx.x);
  const int kv_head = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  const BwdSeq s = bwd_seq(p, b);
  const int sq = s.sq, sk = s.sk;
  const int n0 = n_block * BN;
  if (n0 >= sk) return;
  const int n_blocks_seq = (sk + BN - 1) / BN;

  // The query blocks that see this key block: all, or (causal) from the block of the first row
  // that sees key n0.
  const int m_total = (sq + BM - 1) / BM;
  const int m_first = bwd_first_query_block<CAUSAL>(n0, sq, sk, BM, m_total);
  const int m_count = m_total - m_first;
  const int n_iter = m_count * p.head_ratio;  // (query head of the group, query block) pairs
  const int h_first = kv_head * p.head_ratio;

  load_kv_block<BN, HDIM_QK, HDIM_V, NTHREADS>(sK, sV, p, s, kv_head, n0, tid);
  cp_async_commit();

  // Q, dO, LSE * log2(e) and D of step `it` into buffer `buf`. Rows past the sequence are
  // zero-filled: Q = dO = 0 there gives S = 0, P = exp2(0 - 0) = 1, dP = 0, D = 0, so dS = 0 and
  // P^T dO = 0; nothing of those rows reaches dK, dV or dQ.
  // One dO buffer (kDoSingle): dO of step `it` alone, issued once every warp is done with dV.
  // A step is named by its (query head h, first query row r0); the loop walks them with two
  // counters (the query block runs fastest), so no step divides by m_count.
  auto load_do = [&](int h, int r0) {
    const T* gDo = static_cast<const T*>(p.dout) + s.dout + h * p.do_head_stride +
                   static_cast<int64_t>(r0) * p.do_row_stride;
    load_query_tile<BM, HDIM_V, NTHREADS>(sDo, gDo, p.do_row_stride, sq - r0, tid);
  };
  auto load_step = [&](int h, int r0, int buf) {
    const T* gQ = static_cast<const T*>(p.q) + s.q + h * p.q_head_stride +
                  static_cast<int64_t>(r0) * p.q_row_stride;
    const T* gDo = static_cast<const T*>(p.dout) + s.dout + h * p.do_head_stride +
                   static_cast<int64_t>(r0) * p.do_row_stride;
    load_query_tile<BM, HDIM_QK, NTHREADS>(sQ + buf * BM * HDIM_QK, gQ, p.q_row_stride, sq - r0,
                                           tid);
    if constexpr (!kDoSingle) {
      load_query_tile<BM, HDIM_V, NTHREADS>(sDo + buf * BM * HDIM_V, gDo, p.do_row_stride, sq - r0,
                                            tid);
    }
    load_lse_d<BM>(sLse + buf * BM, sD + buf * BM, p, s, h, r0, tid);
  };
  if (n_iter > 0) {
    load_step(h_first, m_first * BM, 0);
    if constexpr (kDoSingle) load_do(h_first, m_first * BM);
  }
  cp_async_commit();

  float dk[kPairs ? 1 : MT][DTQ][4], dv[kPairs ? 1 : MT][DTV][4];
  float dkv[kPairs ? MT : 1][kPairs ? DTP : 1][4];  // warp pairs: this warp's dV or dK rows
#pragma unroll
  for (int mt = 0; mt < (kPairs ? MT : 1); ++mt) {
#pragma unroll
    for (int j = 0; j < (kPairs ? DTP : 1); ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dkv[mt][j][e] = 0.f;
    }
  }
#pragma unroll
  for (int mt = 0; mt < (kPairs ? 1 : MT); ++mt) {
#pragma unroll
    for (int j = 0; j < DTQ; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[mt][j][e] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < DTV; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dv[mt][j][e] = 0.f;
    }
  }

  // ldmatrix lane bases (see SwzCols). This warp's 16 MT keys are rows wrow .. of K / V (m-tile
  // mt: 16 mt more); with SPLIT 2 its partner warp (warp + kSlabs) shares them: each computes S^T
  // for half of the query columns (cw ..) and holds half of the dK / dV columns (tile half).
  const int wrow = (warp % S::kSlabs) * S::kSlabKeys;
  const int half = warp / S::kSlabs;
  const int cw = kPairs ? 0 : half * kCols;
  // A operands K_w, V_w ([key][d], row-major): row wrow + lane % 16, chunk 2 kk + lane / 16.
  const uint32_t k_a = smem_addr(sK + (wrow + lane % 16) * HDIM_QK);
  const uint32_t v_a = smem_addr(sV + (wrow + lane % 16) * HDIM_V);
  const SwzCols a_cols((lane / 16) ^ (lane % 8));
  // B operands Q^T, dO^T from [query][d] tiles (as the forward's K): rows (lane / 16) * 8 +
  // lane % 8, chunk 2 kk + (lane / 8) % 2.
  const uint32_t q_b = smem_addr(sQ + ((lane / 16) * 8 + lane % 8) * HDIM_QK);
  const uint32_t do_b = smem_addr(sDo + ((lane / 16) * 8 + lane % 8) * HDIM_V);
  const SwzCols b_cols(((lane / 8) % 2) ^ (lane % 8));
  // B operands dO, Q, K as [k][n] tiles, transposed by ldmatrix (as the forward's V): row
  // lane % 16, chunk 2 dp + lane / 16.
  const uint32_t q_t = smem_addr(sQ + (lane % 16) * HDIM_QK);
  const uint32_t do_t = smem_addr(sDo + (lane % 16) * HDIM_V);
  const uint32_t k_t = smem_addr(sK + (lane % 16) * HDIM_QK);
  const SwzCols t_cols((lane / 16) ^ (lane % 8));
  // A operand dS (queries x keys) from the dS^T tile [key][query], transposed: lanes 0-7 give
  // keys 0-7 at query column 0, lanes 8-15 the same keys at column 8, lanes 16-31 keys 8-15.
  const uint32_t ds_a = smem_addr(sDs + ((lane % 8) + 8 * (lane / 16)) * S::kDsStride +
                                  8 * ((lane / 8) % 2));
  // SPLIT 2: A operands P^T, dS^T of this warp's keys ([key][query], not transposed).
  const uint32_t pt_w = smem_addr(sPt + (wrow + lane % 16) * S::kDsStride + 8 * (lane / 16));
  const uint32_t ds_w = smem_addr(sDs + (wrow + lane % 16) * S::kDsStride + 8 * (lane / 16));

  const float scale_log2 = p.scale_log2;
  const int warp_m = warp % S::kWarpsM;  // dQ split
  const int warp_d = warp / S::kWarpsM;

  int h = h_first, m_block = m_first;  // step it's query head and query block
  for (int it = 0; it < n_iter; ++it) {
    const int buf = it & 1;
    // The next step's: the next query block, or the first one of the next query head.
    const bool wrap = m_block + 1 == m_total;
    const int h_next = wrap ? h + 1 : h;
    const int m_next = wrap ? m_first : m_block + 1;
    cp_async_wait<0>();
    __syncthreads();  // step it's tiles are in; every warp is done with step it - 1
    if (it + 1 < n_iter) load_step(h_next, m_next * BM, buf ^ 1);
    cp_async_commit();

    const int r0 = m_block * BM;
    const float* lse_s = sLse + buf * BM;
    const float* d_s = sD + buf * BM;

    // The chain S^T -> P^T -> dP^T -> dS^T -> dV, dK runs per slice of QS query columns (QS =
    // BLOCK_M, or 16 for the widest head dims: fewer fp32 registers live at once, at the cost of
    // reloading the K_w / V_w fragments per slice).
    const bool masked = n0 + BN > sk || (CAUSAL && n0 + BN - 1 > r0 + sk - sq);
#ifdef KFORGE_FMHA_BWD_SLICE_UNROLL  // 1: the query-slice loop stays a loop (register pressure)
#pragma unroll(KFORGE_FMHA_BWD_SLICE_UNROLL)
#else
#pragma unroll
#endif
    for (int sl = 0; sl < kCols / QS; ++sl) {
      const int c0 = cw + sl * QS;  // first query column of the slice
      if constexpr (kPairs) {
        // Warp pairs. Role 0 (warp < kSlabs): X = S^T = K_w Q^T, P^T, handed over, dV += P^T dO.
        // Role 1: X = dP^T = V_w dO^T, P^T taken over, dS^T, dK += dS^T Q. With d_qk == d_v both
        // products of a role have the same shape, so the code is shared and the operands are
        // picked by the role; with d_qk != d_v each role runs its own shapes (the pair still
        // balances: S^T and dK have d_qk, dP^T and dV d_v). Every fragment feeds the MT m-tiles.
        const int role = half;
        const int slab = warp % S::kSlabs;
        const uint32_t a1 = role ? v_a : k_a;  // (d_qk == d_v)
        const uint32_t b1 = role ? do_b + buf * kDoBuf : q_b + buf * kQBuf;
        float xs[MT][NTS][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int j = 0; j < NTS; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) xs[mt][j][e] = 0.f;
          }
        }
        // X = A_w B^T over KS k-steps of rows ROW elements long; every fragment feeds the MT
        // m-tiles. (A macro, not a function: the d_qk == d_v kernels keep the SASS they had.)
#define KFORGE_BWD_PAIR_X(KS, ROW, A1, B1)                                           \
  _Pragma("unroll(kKUnroll)") for (int kk = 0; kk < (KS); ++kk) {                  \
    uint32_t a[MT][4];                                                             \
    _Pragma("unroll") for (int mt = 0; mt < MT; ++mt) {                            \
      ldsm_x4(a[mt], (A1) + mt * 16 * (ROW) * ES + a_cols.at_dyn(kk));             \
    }                                                                              \
    _Pragma("unroll") for (int np = 0; np < NTS / 2; ++np) {                       \
      uint32_t bq[4];                                                              \
      ldsm_x4(bq, (B1) + (c0 + np * 16) * (ROW) * ES + b_cols.at_dyn(kk));         \
      _Pragma("unroll") for (int mt = 0; mt < MT; ++mt) {                          \
        Mma<T>::run(xs[mt][2 * np], a[mt], bq[0], bq[1]);                          \
        Mma<T>::run(xs[mt][2 * np + 1], a[mt], bq[2], bq[3]);                      \
      }                                                                            \
    }                                                                              \
  }
        if constexpr (HDIM_QK == HDIM_V) {
          KFORGE_BWD_PAIR_X(KQ, HDIM_QK, a1, b1)
        } else if (role) {
          KFORGE_BWD_PAIR_X(KV, HDIM_V, v_a, do_b + buf * kDoBuf)
        } else {
          KFORGE_BWD_PAIR_X(KQ, HDIM_QK, k_a, q_b + buf * kQBuf)
        }
#undef KFORGE_BWD_PAIR_X
        // The hand-over tile of this slab and slice: float4 (mt, j) of lane l at (mt NTS + j)
        // 32 + l (consecutive lanes, consecutive 16 bytes: no bank conflicts).
        float4* px = reinterpret_cast<float4*>(smem_raw + S::kOffPx) +
                     (slab * (kCols / QS) + sl) * (MT * NTS * 32) + lane;
        // KFORGE_FMHA_BWD_PT_BF16: the same tile in the input dtype, 8 bytes a lane (the packed
        // A fragments role 0 computes for dV anyway), at the same base.
        uint2* pxh = reinterpret_cast<uint2*>(smem_raw + S::kOffPx) +
                     (slab * (kCols / QS) + sl) * (MT * NTS * 32) + lane;
        uint32_t fa[MT][NTS / 2][4];  // P^T (role 0) or dS^T (role 1) as A fragments
        if (role == 0) {
          // P^T, masked where the block holds the end of the keys or crosses the causal diagonal.
#pragma unroll
          for (int j = 0; j < NTS; ++j) {
            const int col = c0 + j * 8 + 2 * (lane % 4);
            const float2 l = *reinterpret_cast<const float2*>(lse_s + col);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                const int key = n0 + wrow + mt * 16 + lane / 4 + 8 * r;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  float x = fast_exp2(fmaf(xs[mt][j][2 * r + e], scale_log2, -(e ? l.y : l.x)));
                  if (masked) {
                    const int row = r0 + col + e;
                    if (key >= sk || (CAUSAL && key > row + sk - sq)) x = 0.f;
                  }
                  xs[mt][j][2 * r + e] = x;
                }
              }
              if constexpr (!(KFORGE_FMHA_BWD_DIAG & 4) && !KFORGE_FMHA_BWD_PT_BF16) {
                px[(mt * NTS + j) * 32] =
                    make_float4(xs[mt][j][0], xs[mt][j][1], xs[mt][j][2], xs[mt][j][3]);
              }
            }
          }
          if constexpr (!(KFORGE_FMHA_BWD_DIAG & 4) && !KFORGE_FMHA_BWD_PT_BF16) {
            pair_arrive(1 + slab);
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int kk = 0; kk < NTS / 2; ++kk) {
#pragma unroll
              for (int hi = 0; hi < 2; ++hi) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                  fa[mt][kk][2 * hi + r] =
                      Mma<T>::pack(xs[mt][2 * kk + hi][2 * r], xs[mt][2 * kk + hi][2 * r + 1]);
                }
                if constexpr (KFORGE_FMHA_BWD_PT_BF16 && !(KFORGE_FMHA_BWD_DIAG & 4)) {
                  pxh[(mt * NTS + 2 * kk + hi) * 32] =
                      make_uint2(fa[mt][kk][2 * hi], fa[mt][kk][2 * hi + 1]);
                }
              }
            }
          }
          if constexpr (!(KFORGE_FMHA_BWD_DIAG & 4) && KFORGE_FMHA_BWD_PT_BF16) {
            pair_arrive(1 + slab);
          }
        } else {
          // dS^T = P^T (dP^T - D), as A fragments for dK and in shared memory for dQ.
          if constexpr (!(KFORGE_FMHA_BWD_DIAG & 4)) pair_sync(1 + slab);
#pragma unroll
          for (int kk = 0; kk < NTS / 2; ++kk) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
              const int j = 2 * kk + hi;
              const int col = c0 + j * 8 + 2 * (lane % 4);
              const float2 d = *reinterpret_cast<const float2*>(d_s + col);
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                const float4 pt = (KFORGE_FMHA_BWD_DIAG & 4) ? make_float4(1.f, 1.f, 1.f, 1.f)
                                  : KFORGE_FMHA_BWD_PT_BF16 ? unpack4<T>(pxh[(mt * NTS + j) * 32])
                                                            : px[(mt * NTS + j) * 32];
                const float pv[4] = {pt.x, pt.y, pt.z, pt.w};
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                  const float ds0 = pv[2 * r] * (xs[mt][j][2 * r] - d.x);
                  const float ds1 = pv[2 * r + 1] * (xs[mt][j][2 * r + 1] - d.y);
                  const uint32_t packed = Mma<T>::pack(ds0, ds1);
                  fa[mt][kk][2 * hi + r] = packed;
                  *reinterpret_cast<uint32_t*>(
                      sDs + (wrow + mt * 16 + lane / 4 + 8 * r) * S::kDsStride + col) = packed;
                }
              }
            }
          }
        }
        // dV += P^T dO (role 0) or dK += dS^T Q (role 1): [query][d] tiles, transposed.
        if constexpr (HDIM_QK == HDIM_V) {
          pair_second_product<T, DTP, HDIM_V, MT, NTS>(
              dkv, fa, role ? q_t + buf * kQBuf : do_t + buf * kDoBuf, c0, t_cols);
        } else if (role) {
          pair_second_product<T, HDIM_QK / 8, HDIM_QK, MT, NTS>(dkv, fa, q_t + buf * kQBuf, c0,
                                                                t_cols);
        } else {
          pair_second_product<T, HDIM_V / 8, HDIM_V, MT, NTS>(dkv, fa, do_t + buf * kDoBuf, c0,
                                                              t_cols);
        }
      } else {

        // S^T = K_w Q^T.
        float st[MT][NTS][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int j = 0; j < NTS; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) st[mt][j][e] = 0.f;
          }
        }
#if KFORGE_FMHA_BWD_KLOOP_XOR
        static_assert(KQ % kstep_unroll<KQ>(kKUnroll) == 0 && KV % kstep_unroll<KV>(kKUnroll) == 0,
                      "KFORGE_FMHA_BWD_KLOOP_XOR: the unroll divides the k-steps");
#pragma unroll 1
        for (int i = 0; i < KQ / kstep_unroll<KQ>(kKUnroll); ++i)
#pragma unroll
          for (int u = 0; u < kstep_unroll<KQ>(kKUnroll); ++u) {
#define KFORGE_BWD_A_OFF kstep_off<kstep_unroll<KQ>(kKUnroll)>(a_cols, i, u)
#define KFORGE_BWD_B_OFF kstep_off<kstep_unroll<KQ>(kKUnroll)>(b_cols, i, u)
#else
#pragma unroll(kKUnroll)
        for (int kk = 0; kk < KQ; ++kk) {
#define KFORGE_BWD_A_OFF a_cols.at_dyn(kk)
#define KFORGE_BWD_B_OFF b_cols.at_dyn(kk)
#endif
          if constexpr (MT == 1) {  // (as written before slabs of two m-tiles: the same code)
            uint32_t a[4];
            ldsm_x4(a, k_a + KFORGE_BWD_A_OFF);
#pragma unroll
            for (int np = 0; np < NTS / 2; ++np) {
              uint32_t bq[4];
              ldsm_x4(bq, q_b + buf * kQBuf + (c0 + np * 16) * HDIM_QK * ES + KFORGE_BWD_B_OFF);
              Mma<T>::run(st[0][2 * np], a, bq[0], bq[1]);
              Mma<T>::run(st[0][2 * np + 1], a, bq[2], bq[3]);
            }
          } else {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              ldsm_x4(a[mt], k_a + mt * 16 * HDIM_QK * ES + KFORGE_BWD_A_OFF);
            }
#pragma unroll
            for (int np = 0; np < NTS / 2; ++np) {
              uint32_t bq[4];
              ldsm_x4(bq, q_b + buf * kQBuf + (c0 + np * 16) * HDIM_QK * ES + KFORGE_BWD_B_OFF);
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                Mma<T>::run(st[mt][2 * np], a[mt], bq[0], bq[1]);
                Mma<T>::run(st[mt][2 * np + 1], a[mt], bq[2], bq[3]);
              }
            }
          }
        }

#undef KFORGE_BWD_A_OFF
#undef KFORGE_BWD_B_OFF

        // P^T, masked where the block holds the end of the keys or crosses the causal diagonal.
#pragma unroll
        for (int j = 0; j < NTS; ++j) {
          const int col = c0 + j * 8 + 2 * (lane % 4);
          const float2 l = *reinterpret_cast<const float2*>(lse_s + col);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int key = n0 + wrow + mt * 16 + lane / 4 + 8 * r;
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float x = fast_exp2(fmaf(st[mt][j][2 * r + e], scale_log2, -(e ? l.y : l.x)));
                if (masked) {
                  const int row = r0 + col + e;
                  if (key >= sk || (CAUSAL && key > row + sk - sq)) x = 0.f;
                }
                st[mt][j][2 * r + e] = x;
              }
            }
          }
        }

        if constexpr (SPLIT == 1) {
          // P^T as A fragments in the input dtype (the m16n8 accumulators of two adjacent n-tiles
          // are the m16k16 A operand, as the forward's P); dV += P^T dO.
          uint32_t pa[NTS / 2][4];
#pragma unroll
          for (int kk = 0; kk < NTS / 2; ++kk) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                pa[kk][2 * hi + r] =
                    Mma<T>::pack(st[0][2 * kk + hi][2 * r], st[0][2 * kk + hi][2 * r + 1]);
              }
            }
          }
#pragma unroll
          for (int kk = 0; kk < NTS / 2; ++kk) {
#pragma unroll
            for (int dd = 0; dd < DTV / 2; ++dd) {
              uint32_t bv[4];
              ldsm_x4_t(bv, do_t + (kDoSingle ? 0 : buf) * kDoBuf + (c0 + kk * 16) * HDIM_V * ES + t_cols.at(dd));
              Mma<T>::run(dv[0][2 * dd], pa[kk], bv[0], bv[1]);
              Mma<T>::run(dv[0][2 * dd + 1], pa[kk], bv[2], bv[3]);
            }
          }
        } else {
          // P^T to shared memory, for the dV product of both warps of the slab.
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int j = 0; j < NTS; ++j) {
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                *reinterpret_cast<uint32_t*>(sPt + (wrow + mt * 16 + lane / 4 + 8 * r) * S::kDsStride +
                                             c0 + j * 8 + 2 * (lane % 4)) =
                    Mma<T>::pack(st[mt][j][2 * r], st[mt][j][2 * r + 1]);
              }
            }
          }
        }

        // dP^T = V_w dO^T.
        float dp[MT][NTS][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int j = 0; j < NTS; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[mt][j][e] = 0.f;
          }
        }
#if KFORGE_FMHA_BWD_KLOOP_XOR
#pragma unroll 1
        for (int i = 0; i < KV / kstep_unroll<KV>(kKUnroll); ++i)
#pragma unroll
          for (int u = 0; u < kstep_unroll<KV>(kKUnroll); ++u) {
#define KFORGE_BWD_A_OFF kstep_off<kstep_unroll<KV>(kKUnroll)>(a_cols, i, u)
#define KFORGE_BWD_B_OFF kstep_off<kstep_unroll<KV>(kKUnroll)>(b_cols, i, u)
#else
#pragma unroll(kKUnroll)
        for (int kk = 0; kk < KV; ++kk) {
#define KFORGE_BWD_A_OFF a_cols.at_dyn(kk)
#define KFORGE_BWD_B_OFF b_cols.at_dyn(kk)
#endif
          if constexpr (MT == 1) {  // (as written before slabs of two m-tiles: the same code)
            uint32_t a[4];
            ldsm_x4(a, v_a + KFORGE_BWD_A_OFF);
#pragma unroll
            for (int np = 0; np < NTS / 2; ++np) {
              uint32_t bd[4];
              ldsm_x4(bd, do_b + (kDoSingle ? 0 : buf) * kDoBuf + (c0 + np * 16) * HDIM_V * ES + KFORGE_BWD_B_OFF);
              Mma<T>::run(dp[0][2 * np], a, bd[0], bd[1]);
              Mma<T>::run(dp[0][2 * np + 1], a, bd[2], bd[3]);
            }
          } else {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              ldsm_x4(a[mt], v_a + mt * 16 * HDIM_V * ES + KFORGE_BWD_A_OFF);
            }
#pragma unroll
            for (int np = 0; np < NTS / 2; ++np) {
              uint32_t bd[4];
              ldsm_x4(bd, do_b + (kDoSingle ? 0 : buf) * kDoBuf + (c0 + np * 16) * HDIM_V * ES + KFORGE_BWD_B_OFF);
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                Mma<T>::run(dp[mt][2 * np], a[mt], bd[0], bd[1]);
                Mma<T>::run(dp[mt][2 * np + 1], a[mt], bd[2], bd[3]);
              }
            }
          }
        }

#undef KFORGE_BWD_A_OFF
#undef KFORGE_BWD_B_OFF

        // dS^T = P^T (dP^T - D), as A fragments for dK and in shared memory for dQ.
        uint32_t da[NTS / 2][4];  // SPLIT 1 (one m-tile): dK's A fragments
#pragma unroll
        for (int kk = 0; kk < NTS / 2; ++kk) {
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) {
            const int j = 2 * kk + hi;
            const int col = c0 + j * 8 + 2 * (lane % 4);
            const float2 d = *reinterpret_cast<const float2*>(d_s + col);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                const float ds0 = st[mt][j][2 * r] * (dp[mt][j][2 * r] - d.x);
                const float ds1 = st[mt][j][2 * r + 1] * (dp[mt][j][2 * r + 1] - d.y);
                const uint32_t packed = Mma<T>::pack(ds0, ds1);
                if (mt == 0) da[kk][2 * hi + r] = packed;
                *reinterpret_cast<uint32_t*>(sDs + (wrow + mt * 16 + lane / 4 + 8 * r) * S::kDsStride +
                                             col) = packed;
              }
            }
          }
        }

        if constexpr (SPLIT == 1) {
          // dK += dS^T Q.
#pragma unroll
          for (int kk = 0; kk < NTS / 2; ++kk) {
#pragma unroll
            for (int dd = 0; dd < DTQ / 2; ++dd) {
              uint32_t bq[4];
              ldsm_x4_t(bq, q_t + buf * kQBuf + (c0 + kk * 16) * HDIM_QK * ES + t_cols.at(dd));
              Mma<T>::run(dk[0][2 * dd], da[kk], bq[0], bq[1]);
              Mma<T>::run(dk[0][2 * dd + 1], da[kk], bq[2], bq[3]);
            }
          }
        }
      }
    }

    __syncthreads();  // dS^T (and P^T) of every warp is in shared memory

    if constexpr (SPLIT == 2 && !kPairs) {
      // dV += P^T dO and dK += dS^T Q over the whole query block, for this warp's half of the
      // columns (the B tiles' chunks start at half * columns / 8: a run-time swizzle offset).
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldsm_x4(a[mt], pt_w + (mt * 16 * S::kDsStride + kk * 16) * ES);
        }
#pragma unroll
        for (int dd = 0; dd < DTV / 2; ++dd) {
          uint32_t bv[4];
          ldsm_x4_t(bv, do_t + (kDoSingle ? 0 : buf) * kDoBuf + kk * 16 * HDIM_V * ES +
                            t_cols.at_dyn(half * (DTV / 2) + dd));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Mma<T>::run(dv[mt][2 * dd], a[mt], bv[0], bv[1]);
            Mma<T>::run(dv[mt][2 * dd + 1], a[mt], bv[2], bv[3]);
          }
        }
      }
      if constexpr (kDoSingle) {
        // Every warp is done with this step's dO: the next step's loads under dK and dQ.
        __syncthreads();
        if (it + 1 < n_iter) load_do(h_next, m_next * BM);
        cp_async_commit();
      }
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldsm_x4(a[mt], ds_w + (mt * 16 * S::kDsStride + kk * 16) * ES);
        }
#pragma unroll
        for (int dd = 0; dd < DTQ / 2; ++dd) {
          uint32_t bq[4];
          ldsm_x4_t(bq, q_t + buf * kQBuf + kk * 16 * HDIM_QK * ES +
                            t_cols.at_dyn(half * (DTQ / 2) + dd));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Mma<T>::run(dk[mt][2 * dd], a[mt], bq[0], bq[1]);
            Mma<T>::run(dk[mt][2 * dd + 1], a[mt], bq[2], bq[3]);
          }
        }
      }
    }

    // dQ += dS K for this warp's rows and columns, added to the fp32 accumulator.
    int* sem = nullptr;
    if (det) {
      // Key blocks add in descending order: this one goes after the (n_max - n_block) above it.
      int n_max = n_blocks_seq - 1;
      if (CAUSAL) n_max = min(n_max, (min(sq, r0 + BM) - 1 + sk - sq) / BN);
      sem = p.dq_semaphore + (static_cast<int64_t>(b) * p.num_heads + h) * p.m_blocks + m_block;
      if (tid == 0) {
        while (ld_acquire(sem) != n_max - n_block) {
        }
      }
      __syncthreads();
    }
    // This lane's first dQ row (row lane / 4 of its first row tile) and first column in the
    // fp32 accumulator: every add below is at a constant offset from dq_l.
    const int row_l = r0 + warp_m * 16 + lane / 4;
    float* dq_l = p.dq_accum + (h * p.rows + s.ws_row + row_l) * HDIM_QK +
                  warp_d * S::kDqCols + 2 * (lane % 4);
    constexpr int MQ = S::kMTilesPerWarp;  // row tiles of this warp: warp_m + kWarpsM * mq
#if KFORGE_FMHA_BWD_BULK_HERE
    // DQ_BULK (not in the deterministic mode): this warp's staging tile, free once the bulk
    // reductions of the last step have read it.
    const uint32_t sdq = smem_addr(smem_raw + S::kOffDqStage + warp * S::kDqStageWarp);
    if (S::kDqBulkMode == 1 && !det) {
      if (lane < MQ * 16) bulk_wait_read_all();
      __syncwarp();
    }
#endif
#pragma unroll
    for (int ch = 0; ch < ((KFORGE_FMHA_BWD_DIAG & 2) ? 0 : S::kDqCols / S::kDqChunk); ++ch) {
      const int d0 = warp_d * S::kDqCols + ch * S::kDqChunk;
      float acc[MQ][S::kDqChunk / 8][4];
#pragma unroll
      for (int mq = 0; mq < MQ; ++mq) {
#pragma unroll
        for (int j = 0; j < S::kDqChunk / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mq][j][e] = 0.f;
        }
      }
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks) {
        uint32_t a[MQ][4];
#pragma unroll
        for (int mq = 0; mq < MQ; ++mq) {
          ldsm_x4_t(a[mq], ds_a + (ks * 16 * S::kDsStride + (warp_m + mq * S::kWarpsM) * 16) * ES);
        }
#pragma unroll
        for (int jp = 0; jp < S::kDqChunk / 16; ++jp) {
          uint32_t bk[4];
          ldsm_x4_t(bk, k_t + ks * 16 * HDIM_QK * ES + t_cols.at_dyn(d0 / 16 + jp));
#pragma unroll
          for (int mq = 0; mq < MQ; ++mq) {
            Mma<T>::run(acc[mq][2 * jp], a[mq], bk[0], bk[1]);
            Mma<T>::run(acc[mq][2 * jp + 1], a[mq], bk[2], bk[3]);
          }
        }
      }
#if KFORGE_FMHA_BWD_BULK_HERE
      if (S::kDqBulk && !det) {
#pragma unroll
        for (int mq = 0; mq < MQ; ++mq) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int j = 0; j < S::kDqChunk / 8; ++j) {
              st_shared_f32x2(sdq + (mq * 16 + lane / 4 + 8 * r) * S::kDqStageRow +
                                  (ch * S::kDqChunk + j * 8 + 2 * (lane % 4)) * 4,
                              acc[mq][j][2 * r], acc[mq][j][2 * r + 1]);
            }
          }
        }
        continue;
      }
#endif
#pragma unroll
      for (int mq = 0; mq < MQ; ++mq) {
        constexpr int kRowStep = S::kWarpsM * 16;  // rows between this warp's row tiles
#if KFORGE_FMHA_BWD_DQ_V4 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        // Four adjacent columns of one row a lane: lanes 2i and 2i + 1 swap a pair (the even
        // lane keeps row lane / 4 and takes its partner's columns of it, the odd lane row
        // lane / 4 + 8), then one red.global.add.v4.f32 per n-tile: half the reductions.
        {
          const int odd = lane & 1;
          const int row = row_l + mq * kRowStep + 8 * odd;
          float* dst = dq_l + (mq * kRowStep + 8 * odd) * HDIM_QK + ch * S::kDqChunk - 2 * odd;
#pragma unroll
          for (int j = 0; j < S::kDqChunk / 8; ++j) {
            const float s0 = odd ? acc[mq][j][0] : acc[mq][j][2];
            const float s1 = odd ? acc[mq][j][1] : acc[mq][j][3];
            const float g0 = __shfl_xor_sync(0xffffffffu, s0, 1);
            const float g1 = __shfl_xor_sync(0xffffffffu, s1, 1);
            if (row < sq) {
              if (odd) {
                atomic_add4(dst + j * 8, g0, g1, acc[mq][j][2], acc[mq][j][3]);
              } else {
                atomic_add4(dst + j * 8, acc[mq][j][0], acc[mq][j][1], g0, g1);
              }
            }
          }
        }
#else
        // A query block inside the sequence (all but its last) adds without the row bounds, so
        // that every add is dq_l + an immediate (with the bounds the compiler recomputes the
        // 64-bit row address inside each bound's branch).
        auto add_rows = [&](bool all_rows) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int row = row_l + mq * kRowStep + 8 * r;
            if ((all_rows || row < sq) &&
                (!(KFORGE_FMHA_BWD_DIAG & 1) || acc[mq][0][2 * r] == 1e30f)) {
              float* dst = dq_l + (mq * kRowStep + 8 * r) * HDIM_QK + ch * S::kDqChunk;
#pragma unroll
              for (int j = 0; j < S::kDqChunk / 8; ++j) {
                atomic_add2(dst + j * 8, acc[mq][j][2 * r], acc[mq][j][2 * r + 1]);
              }
            }
          }
        };
        if (r0 + BM <= sq) {
          add_rows(true);
        } else {
          add_rows(false);
        }
#endif
      }
    }
#if KFORGE_FMHA_BWD_BULK_HERE
    if constexpr (S::kDqBulkMode == 2) {
      if (!det) {
      // Staged red.v4: the lanes read the tile back a row-contiguous float4 each (kDqCols / 4
      // lanes a row, conflict-free) and add it with red.global.add.v4.f32: every instruction
      // covers whole 128-byte rows, half the instructions of .v2 from the fragments.
      constexpr int kC4 = S::kDqCols / 4;
      static_assert(32 % kC4 == 0 && (MQ * 16 * kC4) % 32 == 0, "staged v4: whole rows a pass");
      __syncwarp();
#pragma unroll
      for (int i = 0; i < MQ * 16 * kC4 / 32; ++i) {
        const int lr = (i * 32 + lane) / kC4;
        const int c4 = lane % kC4;
        const float4 v = ld_shared_f32x4(sdq + lr * S::kDqStageRow + c4 * 16);
        const int row = r0 + (warp_m + S::kWarpsM * (lr / 16)) * 16 + lr % 16;
        if (row < sq && !(KFORGE_FMHA_BWD_DIAG & 2)) {
          atomic_add4(p.dq_accum + (h * p.rows + s.ws_row + row) * HDIM_QK + warp_d * S::kDqCols +
                          c4 * 4,
                      v.x, v.y, v.z, v.w);
        }
      }
      }
    }
    if (S::kDqBulkMode == 1 && !det) {
      // Row l of the staging tile is query row r0 + (warp_m + kWarpsM (l / 16)) 16 + l % 16.
      fence_proxy_async_smem();
      __syncwarp();
      const int row = r0 + (warp_m + S::kWarpsM * (lane / 16)) * 16 + lane % 16;
      if (lane < MQ * 16 && row < sq && !(KFORGE_FMHA_BWD_DIAG & 2)) {
        bulk_reduce_add_f32(p.dq_accum + (h * p.rows + s.ws_row + row) * HDIM_QK +
                                warp_d * S::kDqCols,
                            sdq + lane * S::kDqStageRow, S::kDqCols * 4);
        bulk_commit_group();
      }
    }
#endif
    if (det) {
      __syncthreads();  // every thread's adds are issued before the release
      if (tid == 0) {
        __threadfence();
        atomicAdd(sem, 1);
      }
    }
    h = h_next;
    m_block = m_next;
  }
#if KFORGE_FMHA_BWD_BULK_HERE
  if (S::kDqBulkMode == 1 && !det) {
    bulk_wait_all();  // the staging tiles stay valid until the reductions are done
  }
#endif

  // dK (scaled) and dV of this warp's 16 MT keys, in the input dtype.
  const float scale = p.softmax_scale;
  T* gdK = static_cast<T*>(p.dk) + s.dk + kv_head * p.dk_head_stride;
  T* gdV = static_cast<T*>(p.dv) + s.dv + kv_head * p.dv_head_stride;
  if constexpr (kPairs) {
    // Role 0 holds dV, role 1 dK (whole rows of the slab's keys).
    T* out = half ? gdK : gdV;
    const int64_t stride = half ? p.dk_row_stride : p.dv_row_stride;
    const float sc = half ? scale : 1.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = n0 + wrow + mt * 16 + lane / 4 + 8 * r;
        if (key < sk) {
          T* row = out + static_cast<int64_t>(key) * stride + 2 * (lane % 4);
#pragma unroll
          for (int j = 0; j < DTP; ++j) {
            if (HDIM_QK == HDIM_V || j < (half ? HDIM_QK : HDIM_V) / 8) {
              *reinterpret_cast<uint32_t*>(row + j * 8) =
                  Mma<T>::pack(dkv[mt][j][2 * r] * sc, dkv[mt][j][2 * r + 1] * sc);
            }
          }
        }
      }
    }
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = n0 + wrow + mt * 16 + lane / 4 + 8 * r;
        if (key < sk) {
          T* rk = gdK + static_cast<int64_t>(key) * p.dk_row_stride + half * (HDIM_QK / SPLIT) +
                  2 * (lane % 4);
          T* rv = gdV + static_cast<int64_t>(key) * p.dv_row_stride + half * (HDIM_V / SPLIT) +
                  2 * (lane % 4);
#pragma unroll
          for (int j = 0; j < DTQ; ++j) {
            *reinterpret_cast<uint32_t*>(rk + j * 8) =
                Mma<T>::pack(dk[mt][j][2 * r] * scale, dk[mt][j][2 * r + 1] * scale);
          }
#pragma unroll
          for (int j = 0; j < DTV; ++j) {
            *reinterpret_cast<uint32_t*>(rv + j * 8) =
                Mma<T>::pack(dv[mt][j][2 * r], dv[mt][j][2 * r + 1]);
          }
        }
      }
    }
  }
}

// ---- launch -----------------------------------------------------------------------------------

// The preprocess and convert kernels alone (the sm_90a main kernel, fmha_bwd_sm90.cuh, runs
// between them too).
template <typename T, int HDIM_QK, int HDIM_V>
cudaError_t launch_bwd_preprocess(const BwdParams& p, cudaStream_t stream) {
  const int m_ctas = (p.seqlen_q + kBwdRowsPerCta - 1) / kBwdRowsPerCta;
  if (m_ctas <= 0 || p.batch <= 0 || p.num_heads <= 0) return cudaSuccess;
  fmha_bwd_preprocess_kernel<T, HDIM_QK, HDIM_V>
      <<<dim3(m_ctas, p.num_heads, p.batch), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int HDIM_QK, int HDIM_V>
cudaError_t launch_bwd_convert(const BwdParams& p, cudaStream_t stream) {
  const int m_ctas = (p.seqlen_q + kBwdRowsPerCta - 1) / kBwdRowsPerCta;
  if (m_ctas <= 0 || p.batch <= 0 || p.num_heads <= 0) return cudaSuccess;
  fmha_bwd_convert_dq_kernel<T, HDIM_QK>
      <<<dim3(m_ctas, p.num_heads, p.batch), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

#if KFORGE_FMHA_BWD_128_WIDE
#include "fmha_bwd_wide.cuh"
#endif

template <typename T, int HDIM_QK, int HDIM_V, bool CAUSAL>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using S = BwdShape<HDIM_QK, HDIM_V>;
  cudaError_t err = launch_bwd_preprocess<T, HDIM_QK, HDIM_V>(p, stream);
  if (err != cudaSuccess) return err;
#if KFORGE_FMHA_BWD_128_WIDE
  if constexpr (HDIM_QK == 128 && HDIM_V == 128) {
    if (p.dq_semaphore == nullptr) {  // the deterministic mode keeps fmha_bwd_kernel
      using W = BwdWide<HDIM_QK>;
      const int n_wide = (p.seqlen_k + W::kBlockN - 1) / W::kBlockN;
      if (n_wide > 0) {
        err = detail::raise_smem_limit_once<fmha_bwd_wide_kernel<T, HDIM_QK, CAUSAL>>(W::kSmemBytes);
        if (err != cudaSuccess) return err;
        fmha_bwd_wide_kernel<T, HDIM_QK, CAUSAL>
            <<<dim3(n_wide, p.num_heads_k, p.batch), W::kThreads, W::kSmemBytes, stream>>>(p);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
      }
      return launch_bwd_convert<T, HDIM_QK, HDIM_V>(p, stream);
    }
  }
#endif
  const int n_ctas = (p.seqlen_k + S::kBlockN - 1) / S::kBlockN;
  if (n_ctas > 0) {
    auto kernel = fmha_bwd_kernel<T, HDIM_QK, HDIM_V, CAUSAL>;
    err = detail::raise_smem_limit_once<fmha_bwd_kernel<T, HDIM_QK, HDIM_V, CAUSAL>>(S::kSmemBytes);
    if (err != cudaSuccess) return err;
    kernel<<<dim3(n_ctas, p.num_heads_k, p.batch), S::kThreads, S::kSmemBytes, stream>>>(p);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return launch_bwd_convert<T, HDIM_QK, HDIM_V>(p, stream);
}

}  // namespace kforge_fmha

// The wide-step kernel's launch manifest record, in builds that have it (KFORGE_FMHA_BWD_128_WIDE).
#if KFORGE_FMHA_BWD_128_WIDE
#define KFORGE_FMHA_BWD_WIDE_ENTRY(HDIM_QK, HDIM_V) \
  , {"fmha_bwd_wide_kernel", kforge_fmha::bwd_wide_smem(HDIM_QK, HDIM_V)}
#else
#define KFORGE_FMHA_BWD_WIDE_ENTRY(HDIM_QK, HDIM_V)
#endif

// One compile unit per (element type, head-dim pair): both masks, and the launch manifest.
#define KFORGE_FMHA_INSTANTIATE_BWD(T, HDIM_QK, HDIM_V)                                        \
  template cudaError_t kforge_fmha::launch_bwd_preprocess<T, HDIM_QK, HDIM_V>(                 \
      const kforge_fmha::BwdParams&, cudaStream_t);                                            \
  template cudaError_t kforge_fmha::launch_bwd_convert<T, HDIM_QK, HDIM_V>(                    \
      const kforge_fmha::BwdParams&, cudaStream_t);                                            \
  template cudaError_t kforge_fmha::launch_bwd<T, HDIM_QK, HDIM_V, false>(                     \
      const kforge_fmha::BwdParams&, cudaStream_t);                                            \
  template cudaError_t kforge_fmha::launch_bwd<T, HDIM_QK, HDIM_V, true>(                      \
      const kforge_fmha::BwdParams&, cudaStream_t);                                            \
  [[maybe_unused]] static __device__ const KforgeLaunchSmem kforge_launch_smem[] = {           \
      {"fmha_bwd_kernel", kforge_fmha::BwdShape<HDIM_QK, HDIM_V>::kSmemBytes}                  \
      KFORGE_FMHA_BWD_WIDE_ENTRY(HDIM_QK, HDIM_V)};
