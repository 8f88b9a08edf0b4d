// Hopper (sm_90a) backward main kernel with TMA loads ("TL"): the default sm_90a backward for
// fixed-length batches since 2026-11-28 (fmha_bwd_sm90.cuh's kernel stays for varlen, for tensor
// maps the driver refuses, and for KFORGE_FMHA_BWD_SM90_LOADS=cpasync, read at every call for A/B
// runs). Included by fmha_bwd_sm90.cuh, whose Shape, helpers and dQ tensor map it shares.
//
// Same CTA, tiles, layouts and products as fmha_bwd_sm90.cuh's DQ_TMA kernel (2 warpgroups, 128
// keys, 64-row query steps, dQ added by per-warp 2-D TMA reductions). What differs is the step:
//  - Loads. One thread issues each step's loads as TMA copies (Q and dO: 4-D maps over
//    [batch][seqlen][heads][d], {64, 64} boxes in the 128-byte swizzle, which is the layout the
//    cp.async loader writes; LSE * log2(e) and D: 3-D fp32 maps over the workspace's [heads][batch]
//    [seqlen], {64} boxes), two steps ahead into three buffers, each completing a "full" mbarrier.
//    Rows past the sequence are out of the maps, so TMA fills them with zeros, as the cp.async
//    loader did (see fmha_bwd_sm90.cuh's load_step: nothing of those rows reaches dK, dV or dQ).
//    The 256 threads wait on the step's mbarrier instead of cp.async groups and a CTA barrier.
//  - One barrier a step, not two. Both warpgroups meet once, after writing dS^T (dQ reads both
//    warpgroups' dS^T at head dim 128; at 64 the meeting keeps them in step). A thread past that
//    barrier knows every thread has finished the step before, so thread 0 then refills the
//    buffers of the step before with the step two ahead; and dS^T has two buffers, so the next
//    step's dS^T never overwrites the one the other warpgroup's dQ may still read.
//  - The order of FlashAttention-3's step (hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp, the same
//    structure, written anew here): S^T and dP^T; P^T once S^T is in; dS^T once dP^T is in (in
//    registers and to shared memory); then dV += P^T dO is issued, and runs under the barrier;
//    dQ = dS K is issued, dV waited for; dK += dS^T Q is issued and runs under dQ's stores.
//  - dQ's adds straddle two steps (TL_DEFER_DQ): a step stores its dQ tile to the warp's staging
//    boxes; the next step, once its S^T and dP^T are issued, fences the stores and issues the TMA
//    reductions (the last step's after the loop).
//  - dK and dV leave through shared memory (TL_EPILOGUE): stmatrix into the K and V tiles, then
//    16-byte rows.
// Measurements: docs/benchmarks/fmha-bwd.md, "Seventh run" (H200: 1.01-1.03x SDPA cuDNN's backward
// at bf16 head dim 128, 2k-16k, causal and not; the cp.async kernel was 0.65-0.73x).
#pragma once

#include "fmha_bwd_sm90_loads.h"

namespace kforge_fmha {

// The tensor maps of one TL launch (a __grid_constant__ kernel parameter).
struct BwdTlMaps {
  CUtensorMap dq;   // fmha_bwd_sm90.cuh's encode_dq_map
  CUtensorMap q;    // {d, seqlen_q, heads, batch}, {64, 64} boxes
  CUtensorMap dout;
  CUtensorMap lse;  // {seqlen_q, batch, heads} fp32, {64} boxes
  CUtensorMap dpsum;
};

namespace sm90bwd {

// Tuning knobs of the TL kernel (benchmarks/fmha_bwd_sweep.py --path sm90):
// TL_ORDER (off): dK += dS^T Q is issued right behind dV, before the barrier (both run under it), and
// dQ alone after it; the step then waits once for dV, dK and dQ.
#ifndef KFORGE_FMHA_BWD_SM90_TL_ORDER
#define KFORGE_FMHA_BWD_SM90_TL_ORDER 0
#endif
// TL_STMATRIX (on): the dS^T tile goes to shared memory as 4 stmatrix.x4 a thread instead of 16
// 4-byte stores. H200 sweep of 2026-11-28 11:47 (bf16, 16k tokens): +1-6% at head dim 128, -2% to
// +3% at 64; TL_ORDER lost 3-8% at 128 and is off. (Issuing the next step's S^T and dP^T at the
// end of a step, behind its dK, was measured at 11:50 and removed: 128 spill bytes at head dim 128
// and 0.63-0.66x of this kernel's speed there, 0.80-0.81x at 64.)
#ifndef KFORGE_FMHA_BWD_SM90_TL_STMATRIX
#define KFORGE_FMHA_BWD_SM90_TL_STMATRIX 1
#endif
// TL_DEFER_DQ (on): a step's dQ tile is stored to the staging boxes at the end of the step, and
// the proxy fence and the TMA reductions follow at the next step, after its S^T and dP^T are
// issued (the stores have landed by then, so the fence is short); off: all of it at the end of
// the step. H200 profile of 2026-11-28 11:58: the stores, the fence that waits for them and the
// issue of the reductions were about a fifth of the warp stall samples, between one step's
// products and the next's; sweep of 12:03 at head dim 128: +1-4%. (Holding the tile in registers
// and doing all of it at the next step was -14 to -18% there, 116 spill bytes; removed.)
#ifndef KFORGE_FMHA_BWD_SM90_TL_DEFER_DQ
#define KFORGE_FMHA_BWD_SM90_TL_DEFER_DQ 1
#endif
constexpr bool kTlDeferDq = KFORGE_FMHA_BWD_SM90_TL_DEFER_DQ != 0;
// TL_EPILOGUE (on): dK and dV leave through shared memory (stmatrix into the K and V tiles, then
// 16-byte rows to global memory) when their pointers and row strides are 16-byte aligned, instead
// of 4-byte stores from the accumulators (a CTA's last act; it matters most for short sequences).
// H200 sweep of 2026-11-28 12:10 at head dim 128, 2k and 4k: +1-4%.
#ifndef KFORGE_FMHA_BWD_SM90_TL_EPILOGUE
#define KFORGE_FMHA_BWD_SM90_TL_EPILOGUE 1
#endif
constexpr bool kTlEpilogue = KFORGE_FMHA_BWD_SM90_TL_EPILOGUE != 0;
constexpr bool kTlOrder = KFORGE_FMHA_BWD_SM90_TL_ORDER != 0;
constexpr bool kTlStm = KFORGE_FMHA_BWD_SM90_TL_STMATRIX != 0;

template <int HDIM>
struct TlShape {
  static_assert(HDIM == 64 || HDIM == 128, "head dim 64 or 128");
  static constexpr int kStages = 3;
  static constexpr int kHalves = HDIM / 64;
  static constexpr int kKvTile = kBlockN * HDIM * 2;
  static constexpr int kQTile = kBlockM * HDIM * 2;
  static constexpr int kQHalf = kBlockM * 128;
  static constexpr int kKvHalf = kBlockN * 128;
  static constexpr int kDsTile = kBlockN * kBlockM * 2;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKvTile;
  static constexpr int kOffQ = kOffV + kKvTile;
  static constexpr int kOffDo = kOffQ + kStages * kQTile;
  static constexpr int kOffDs = kOffDo + kStages * kQTile;        // 2 buffers
  static constexpr int kOffDq = kOffDs + 2 * kDsTile;             // 8 warps x 4 KiB
  static constexpr int kOffLse = kOffDq + (kThreads / 32) * kDqTmaWarpBytes;  // kStages x 64 floats
  static constexpr int kOffD = kOffLse + kStages * kBlockM * 4;
  static constexpr int kOffBar = kOffD + kStages * kBlockM * 4;   // kStages "full" mbarriers
  static constexpr int kSmemBytes = kOffBar + kStages * 8 + 1024;  // + alignment slack
  static constexpr uint32_t kStepBytes = 2 * kQTile + 2 * kBlockM * 4;  // what a step's loads bring
  static_assert(kSmemBytes <= 232448, "227 KiB");
  static_assert(kOffDs % 1024 == 0 && kOffDq % 1024 == 0 && kOffQ % 1024 == 0 && kOffDo % 1024 == 0,
                "swizzled tiles start on 1024-byte boundaries");
  static_assert(kOffLse % 128 == 0 && kOffD % 128 == 0, "TMA destinations: 128-byte aligned");
};

#if defined(KFORGE_FMHA_HAS_SM90_BODY)
// One 3-D TMA tile load {c0, c1, c2} into shared memory, completing its bytes on the mbarrier.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
#endif

template <typename T, int HDIM, bool CAUSAL>
__global__ void __launch_bounds__(kThreads, 1)
    fmha_bwd_sm90_kernel_tl(const BwdParams p, const __grid_constant__ BwdTlMaps maps) {
#if defined(KFORGE_FMHA_HAS_SM90_BODY)
  using namespace detail;
  using namespace sm90;
  using sm90tma::mbar_expect_tx;
  using sm90tma::mbar_init;
  using sm90tma::mbar_wait;
  using sm90tma::tma_load_4d;
  using S = TlShape<HDIM>;
  constexpr int BN = kBlockN;
  constexpr int BM = kBlockM;
  constexpr int KH = S::kHalves;
  constexpr int NS = S::kStages;

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
  const uint32_t sBar = sbase + S::kOffBar;
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

  const int m_total = (sq + BM - 1) / BM;
  const int m_first = first_query_block<CAUSAL>(sq, sk, n0, m_total);
  const int m_count = m_total - m_first;
  const int n_iter = m_count * p.head_ratio;
  const int h_first = kv_head * p.head_ratio;

  // Step `it`'s Q, dO, LSE and D into buffer `buf` (thread 0 only).
  auto load_step = [&](int it, int buf) {
    const int h = h_first + it / m_count;
    const int r0 = (m_first + it % m_count) * BM;
    const uint32_t bar = sBar + buf * 8;
    mbar_expect_tx(bar, S::kStepBytes);
#pragma unroll
    for (int hh = 0; hh < KH; ++hh) {
      tma_load_4d(sQ + buf * S::kQTile + hh * S::kQHalf, &maps.q, hh * 64, r0, h, b, bar);
      tma_load_4d(sDo + buf * S::kQTile + hh * S::kQHalf, &maps.dout, hh * 64, r0, h, b, bar);
    }
    tma_load_3d(sbase + S::kOffLse + buf * BM * 4, &maps.lse, r0, b, h, bar);
    tma_load_3d(sbase + S::kOffD + buf * BM * 4, &maps.dpsum, r0, b, h, bar);
  };

  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < NS; ++i) mbar_init(sBar + i * 8, 1);
    sm90tma::fence_mbar_init();
  }
  const T* gK = static_cast<const T*>(p.k) + s.k + kv_head * p.k_head_stride +
                static_cast<int64_t>(n0) * p.k_row_stride;
  const T* gV = static_cast<const T*>(p.v) + s.v + kv_head * p.v_head_stride +
                static_cast<int64_t>(n0) * p.v_row_stride;
  load_swz<T, BN, HDIM>(sK, gK, p.k_row_stride, sk - n0, tid);
  load_swz<T, BN, HDIM>(sV, gV, p.v_row_stride, sk - n0, tid);
  cp_async_commit();
  __syncthreads();  // the mbarriers are initialised
  if (tid == 0) {
    if (n_iter > 0) load_step(0, 0);
    if (n_iter > 1) load_step(1, 1);
  }
  cp_async_wait<0>();
  fence_proxy_async();  // K and V (cp.async, generic proxy), visible to the wgmma
  __syncthreads();

  float dk[KH][32], dv[KH][32];
#pragma unroll
  for (int h = 0; h < KH; ++h) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      dk[h][i] = 0.f;
      dv[h][i] = 0.f;
    }
  }

  const uint64_t k_a = make_desc(sK + wg * 64 * 128);
  const uint64_t v_a = make_desc(sV + wg * 64 * 128);
  const uint64_t q_desc = make_desc(sQ);
  const uint64_t do_desc = make_desc(sDo);
  const uint64_t k_desc = make_desc(sK);
  const uint64_t ds_desc = make_desc(sDs);
  constexpr uint64_t kQTileU = S::kQTile >> 4;
  constexpr uint64_t kQHalfU = S::kQHalf >> 4;
  constexpr uint64_t kKvHalfU = S::kKvHalf >> 4;
  constexpr uint64_t kDsTileU = S::kDsTile >> 4;
  constexpr uint64_t kRows16U = kRows16Units;

  const float scale_log2 = p.scale_log2;
  const int key_l = wg * 64 + warp * 16 + g;

  // S^T = K_wg Q^T and dP^T = V_wg dO^T of step `it` (two groups), once its loads have landed.
  float st[32], dp[32];
  auto issue_sdp = [&](int it) {
    const int buf = it % NS;
    mbar_wait(sBar + buf * 8, (it / NS) & 1);  // step it's Q, dO, LSE and D have landed
    issue_st_dp<T, HDIM>(st, dp, k_a, v_a, q_desc + buf * kQTileU, do_desc + buf * kQTileU, kKvHalfU,
                         kQHalfU);
  };

  // dQ's adds: fmha_bwd_sm90.cuh's DQ_TMA boxes (this warp's 16 rows from workspace row `row`).
  const uint32_t sdq = sbase + S::kOffDq + (wg * 4 + warp) * kDqTmaWarpBytes;
  const int dcol0 = HDIM == 128 ? wg * 64 : 0;
  auto stage_dq = [&](const float (&v)[32]) {  // the tile into this warp's staging boxes
    if (lane == 0) bulk_wait_read_all();  // the last reductions have read them
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        st_shared_f32x2(sdq + (j / 4) * (kDqTmaWarpBytes / 2) + (g + 8 * r) * 128 +
                            (((2 * (j % 4) + t / 2) ^ g) << 4) + (t % 2) * 8,
                        v[4 * j + 2 * r], v[4 * j + 2 * r + 1]);
      }
    }
  };
  auto reduce_dq = [&](int row) {  // the staged boxes added to the accumulator
    fence_proxy_async();  // the generic-proxy stores, visible to the TMA unit
    __syncwarp();
    if (lane == 0) {
      tma_reduce_add_2d(&maps.dq, sdq, dcol0, row);
      tma_reduce_add_2d(&maps.dq, sdq + kDqTmaWarpBytes / 2, dcol0 + 32, row);
      bulk_commit_group();
    }
  };
  int row_prev = 0;  // TL_DEFER_DQ: the first workspace row of the step before's staged tile

  int h = h_first, m_block = m_first;  // step it's query head and block (no divisions a step)
  for (int it = 0; it < n_iter; ++it) {
    const int buf = it % NS;
    const int dsb = it & 1;
    issue_sdp(it);
    if (kTlDeferDq && it > 0) reduce_dq(row_prev);

    const int r0 = m_block * BM;
    const float* lse_s = sLse + buf * BM;
    const float* d_s = sD + buf * BM;

    wgmma_wait1();  // S^T done; dP^T may still run
    keep(st);

    softmax_pt<CAUSAL>(st, lse_s, scale_log2, n0, key_l, r0, t, sq, sk);  // P^T

    wgmma_wait0();  // dP^T done
    keep(dp);
    // dS^T = P^T (dP^T - D): dK's A fragments, and the swizzled dS^T tile (buffer dsb) for dQ.
    uint32_t da[4][4];
    const uint32_t ds_off = S::kOffDs + dsb * S::kDsTile;
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
          da[kk][2 * hi + r] = packed;
          if constexpr (!kTlStm) {
            *reinterpret_cast<uint32_t*>(base + ds_off + (key_l + 8 * r) * 128 + ((j ^ g) << 4) +
                                         t * 4) = packed;
          }
        }
      }
      if constexpr (kTlStm) {
        // Matrix i of the four is (j = 2 kk + i / 2, key rows + 8 (i % 2)); lane l addresses row
        // l % 8 of matrix l / 8 (a key row whose % 8 is l % 8: the swizzle's XOR).
        const int mi = lane / 8, row = lane % 8;
        const int j = 2 * kk + mi / 2;
        sm90tma::stmatrix_x4(sbase + ds_off + (wg * 64 + warp * 16 + 8 * (mi % 2) + row) * 128 +
                                 ((j ^ row) << 4),
                             da[kk][0], da[kk][1], da[kk][2], da[kk][3]);
      }
    }

    // dV += P^T dO (P^T as the register A operand), running under the barrier below.
    uint32_t pa[4][4];
    pack_a<T>(st, pa);
    issue_rs<T, KH>(dv, pa, do_desc + buf * kQTileU, kQHalfU);
    // dK += dS^T Q (dS^T from the registers, Q read MN-major): one wgmma group.
    auto issue_dk = [&] { issue_rs<T, KH>(dk, da, q_desc + buf * kQTileU, kQHalfU); };
    if constexpr (kTlOrder) issue_dk();  // right behind dV

    // dS^T visible to the async proxy; both warpgroups meet (every thread is past step it - 1).
    fence_proxy_async();
    named_sync(1, kThreads);
    if (tid == 0 && it + 2 < n_iter) load_step(it + 2, (it + 2) % NS);  // step it - 1's buffers

    // dQ = dS K (head dim 128: columns 64 wg .. over the 128 keys; 64: all columns over this
    // warpgroup's 64 keys).
    constexpr int kDqSteps = HDIM == 128 ? BN / 16 : 4;
    const int ks0 = HDIM == 128 ? 0 : wg * 4;
    float dq[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDqSteps; ++kk) {
      ss_tt<T>(dq, ds_desc + dsb * kDsTileU + (ks0 + kk) * kRows16U,
               k_desc + (HDIM == 128 ? wg : 0) * kKvHalfU + (ks0 + kk) * kRows16U, kk > 0);
    }
    wgmma_commit();
    if constexpr (kTlOrder) {
      wgmma_wait0();  // dV, dK and dQ done: pa and da are free
      keep(pa);
      keep(da);
#pragma unroll
      for (int dh = 0; dh < KH; ++dh) {
        keep(dv[dh]);
        keep(dk[dh]);
      }
    } else {
      wgmma_wait1();  // dV done: pa is free
      keep(pa);
#pragma unroll
      for (int dh = 0; dh < KH; ++dh) keep(dv[dh]);

      issue_dk();  // running under dQ's stores
      wgmma_wait1();  // dQ done
    }
    keep(dq);

    const int dq_row = static_cast<int>(h * p.rows + s.ws_row) + r0 + warp * 16;
    stage_dq(dq);
    if constexpr (!kTlDeferDq) reduce_dq(dq_row);
    row_prev = dq_row;
    wgmma_wait0();  // dK done: da is free
    keep(da);
#pragma unroll
    for (int dh = 0; dh < KH; ++dh) keep(dk[dh]);
    if (++m_block == m_total) {
      m_block = m_first;
      ++h;
    }
  }

  if (kTlDeferDq && n_iter > 0) reduce_dq(row_prev);
  bulk_wait_all();  // shared memory stays valid until the reductions end

  const float scale = p.softmax_scale;
  T* gdK = static_cast<T*>(p.dk) + s.dk + kv_head * p.dk_head_stride;
  T* gdV = static_cast<T*>(p.dv) + s.dv + kv_head * p.dv_head_stride;
  if (kTlEpilogue &&
      ((reinterpret_cast<uintptr_t>(gdK) | reinterpret_cast<uintptr_t>(gdV) |
        static_cast<uintptr_t>(p.dk_row_stride * 2) | static_cast<uintptr_t>(p.dv_row_stride * 2)) &
       15) == 0) {
    __syncthreads();  // every wgmma reading K and V has completed (the other warpgroup's too)
    // dK (scaled) and dV into the K and V tiles, in their swizzled layout: 8x8 matrix (j, r) of a
    // 64-column half is rows key_l + 8 r (this warp's), columns 8 j ..; x4 call c: j = 2 c + i / 2,
    // r = i % 2 for matrix i (lane l addresses row l % 8 of matrix l / 8).
    const int mi = lane / 8, row = lane % 8;
    const uint32_t krow = (wg * 64 + warp * 16 + 8 * (mi % 2) + row) * 128;
#pragma unroll
    for (int dh = 0; dh < KH; ++dh) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint32_t off = dh * S::kKvHalf + krow + (((2 * c + mi / 2) ^ row) << 4);
        uint32_t rk[4], rv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 2 * c + i / 2, r = i % 2;
          rk[i] = Mma<T>::pack(dk[dh][4 * j + 2 * r] * scale, dk[dh][4 * j + 2 * r + 1] * scale);
          rv[i] = Mma<T>::pack(dv[dh][4 * j + 2 * r], dv[dh][4 * j + 2 * r + 1]);
        }
        sm90tma::stmatrix_x4(sK + off, rk[0], rk[1], rk[2], rk[3]);
        sm90tma::stmatrix_x4(sV + off, rv[0], rv[1], rv[2], rv[3]);
      }
    }
    __syncthreads();
    // Rows out, 16 bytes a thread and row (load_swz's walk, backwards).
    constexpr int kChunks = HDIM / 8;
    constexpr int kRowsPerPass = kThreads / kChunks;
    const int cc = tid % kChunks;
    const int r0e = tid / kChunks;
#pragma unroll
    for (int i = 0; i < BN / kRowsPerPass; ++i) {
      const int r = r0e + i * kRowsPerPass;
      if (n0 + r < sk) {
        const uint32_t src = (cc / 8) * S::kKvHalf + r * 128 + (((cc % 8) ^ (r % 8)) << 4);
        const int64_t key = n0 + r;
        *reinterpret_cast<float4*>(gdK + key * p.dk_row_stride + cc * 8) = ld_shared_f32x4(sK + src);
        *reinterpret_cast<float4*>(gdV + key * p.dv_row_stride + cc * 8) = ld_shared_f32x4(sV + src);
      }
    }
    return;
  }
  store_dkdv<T, KH>(dk, dv, gdK, gdV, p.dk_row_stride, p.dv_row_stride, n0 + key_l, sk, t, scale);
#endif  // KFORGE_FMHA_HAS_SM90_BODY
}

// KFORGE_FMHA_BWD_SM90_LOADS: fmha_bwd_sm90_loads.h.
inline bool tl_off() { return bwd_sm90_loads_is("cpasync"); }
inline bool tl_required() { return bwd_sm90_loads_is("tma"); }

// A {seqlen_q, batch, heads} fp32 map over a workspace array ([heads][rows], rows = batch x
// seqlen_q), {64} boxes, out-of-range rows read as zeros. False when seqlen_q % 4 != 0 (TMA's
// 16-byte strides) or the driver refuses.
inline bool encode_ws_map(CUtensorMap* map, const float* ws, int seqlen_q, int batch, int heads,
                          int64_t rows) {
  const tma_host::EncodeTiledFn fn = tma_host::encode_tiled();
  if (fn == nullptr || seqlen_q < 1 || batch < 1 || heads < 1 || seqlen_q % 4 != 0) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(seqlen_q), static_cast<cuuint64_t>(batch),
                              static_cast<cuuint64_t>(heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(seqlen_q) * 4,
                                 static_cast<cuuint64_t>(rows) * 4};
  const cuuint32_t box[3] = {64, 1, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(ws), dims, strides, box,
            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Launches the TL kernel; cudaErrorNotSupported, with nothing launched, when this call cannot take
// it (varlen, KFORGE_FMHA_BWD_SM90_LOADS=cpasync, or a map the driver refuses).
template <typename T, int HDIM, bool CAUSAL>
cudaError_t launch_main_tl(const BwdParams& p, int n_ctas, cudaStream_t stream) {
  if (p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr || tl_off()) return cudaErrorNotSupported;
  BwdTlMaps maps{};
  const int64_t ws_rows = static_cast<int64_t>(p.num_heads) * p.rows;
  if (!encode_dq_map(&maps.dq, p.dq_accum, ws_rows, HDIM) ||
      !tma_host::encode<T, HDIM>(&maps.q, p.q, p.seqlen_q, p.num_heads, p.batch, p.q_row_stride,
                                 p.q_head_stride, p.q_batch_stride, kBlockM) ||
      !tma_host::encode<T, HDIM>(&maps.dout, p.dout, p.seqlen_q, p.num_heads, p.batch,
                                 p.do_row_stride, p.do_head_stride, p.do_batch_stride, kBlockM) ||
      !encode_ws_map(&maps.lse, p.lse_log2, p.seqlen_q, p.batch, p.num_heads, p.rows) ||
      !encode_ws_map(&maps.dpsum, p.dpsum, p.seqlen_q, p.batch, p.num_heads, p.rows)) {
    return cudaErrorNotSupported;
  }
  constexpr int kSmem = TlShape<HDIM>::kSmemBytes;
  cudaError_t err = detail::raise_smem_limit_once<fmha_bwd_sm90_kernel_tl<T, HDIM, CAUSAL>>(kSmem);
  if (err != cudaSuccess) return err;
  fmha_bwd_sm90_kernel_tl<T, HDIM, CAUSAL>
      <<<dim3(n_ctas, p.num_heads_k, p.batch), kThreads, kSmem, stream>>>(p, maps);
  return cudaGetLastError();
}

}  // namespace sm90bwd
}  // namespace kforge_fmha
