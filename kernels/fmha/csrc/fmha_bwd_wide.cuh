// The portable backward's wide-step kernel for (128, 128) (KFORGE_FMHA_BWD_128_WIDE=1): 8 warps,
// 64 keys a CTA, 64 queries a step, every product split over all 8 warps. Included by
// fmha_bwd_kernel.cuh (namespace kforge_fmha), which launches it from launch_bwd for fixed-length
// and varlen calls that are not deterministic (the deterministic mode keeps fmha_bwd_kernel: its
// semaphores count that kernel's query blocks).
//
// The step structure is FlashAttention-2's small-shared-memory tile's (benchmarks/fa2_bwd_tiles.py
// measured FlashAttention-2 at this shape under sm_120's 99 KiB at 1.09-1.16x the warp pairs),
// written anew on this file's own primitives:
//   A  S = Q K^T and dP = dO V^T, warp (wm, wn) = (warp % 4, warp / 4): 16 queries x 32 keys;
//      P = exp2(S log2e scale - LSE log2e), dS = P (dP - D), both to shared memory as [query][key]
//      tiles in the input dtype (rows padded by 8 elements: conflict-free ldmatrix).
//   B  dV += P^T dO and dK += dS^T Q, warp (wk, wd) = (warp % 2, warp / 2): 32 keys x 32 columns,
//      P^T and dS^T read with ldmatrix.trans from the [query][key] tiles.
//   C  dQ = dS K, warp (wk, wd): 32 queries x 32 columns, added to the fp32 accumulator.
// (B and C in the order KFORGE_FMHA_BWD_WIDE_ORDER says.) Three barriers a step: the step's tiles are
// in (and the step before is done with P, dS and the other Q buffer), P and dS are written, every
// warp is done with dO (its one buffer is refilled for the next step under dK and dQ). Shared memory
// (2-byte elements): K, V, two Q buffers, one dO buffer, P and dS, LSE and D of two steps: exactly
// sm_120's 101,376 bytes at head dim 128. KFORGE_FMHA_BWD_WIDE_VREG=2 moves V to registers, P and dS
// into its place and gives dO a second buffer instead (two barriers a step; the same bytes).
// Measured (H200, 2026-11-28): correct (252 portable cases), 0.91-0.97x the warp pairs at best, so off
// (docs/benchmarks/fmha-bwd.md, "Eighth run").
#pragma once

template <int HDIM>
struct BwdWide {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockN = 64;
  static constexpr int kBlockM = 64;
  static constexpr int kPStride = kBlockN + 8;  // P and dS rows: 9 16-byte chunks (odd)
  static constexpr int kTile = 64 * HDIM * 2;   // bytes of one 64-row tile
  // KFORGE_FMHA_BWD_WIDE_VREG 2: V lives in registers, P and dS take its place (their 18,432 bytes
  // reach past V's 16,384), and dO has two buffers like Q.
  static constexpr bool kOverlay = KFORGE_FMHA_BWD_WIDE_VREG == 2;
  static constexpr int kDoBufs = kOverlay ? 2 : 1;
  static constexpr int kPBytes = kBlockM * kPStride * 2;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kTile;
  static constexpr int kOffP = kOverlay ? kOffV : kOffV + kTile + 2 * kTile + kTile;
  static constexpr int kOffDs = kOffP + kPBytes;
  static constexpr int kOffQ = kOverlay ? kOffDs + kPBytes : kOffV + kTile;  // two buffers
  static constexpr int kOffDo = kOffQ + 2 * kTile;                              // kDoBufs buffers
  static constexpr int kOffLse = kOverlay ? kOffDo + 2 * kTile : kOffDs + kPBytes;  // two buffers
  static constexpr int kOffD = kOffLse + 2 * kBlockM * 4;
  static constexpr int kSmemBytes = kOffD + 2 * kBlockM * 4;
  static_assert(HDIM % 64 == 0, "wide step: 32-column warp slices");
};
static_assert(BwdWide<128>::kSmemBytes <= 101376, "the wide step fits sm_120's 99 KiB");
static_assert(!BwdWide<128>::kOverlay || BwdWide<128>::kOffQ >= BwdWide<128>::kOffV + BwdWide<128>::kTile,
              "P and dS over V's place");

// The launch manifest's bytes for a pair's unit: the wide kernel exists at (128, 128) only.
constexpr unsigned bwd_wide_smem(int head_dim_qk, int head_dim_v) {
  return head_dim_qk == 128 && head_dim_v == 128 ? BwdWide<128>::kSmemBytes : 0u;
}

template <typename T, int HDIM, bool CAUSAL>
__global__ void __launch_bounds__(BwdWide<HDIM>::kThreads, 1)
    fmha_bwd_wide_kernel(const BwdParams p) {
  using namespace detail;
  using W = BwdWide<HDIM>;
  constexpr int NT = W::kThreads, BN = W::kBlockN, BM = W::kBlockM, PS = W::kPStride;
  constexpr int KD = HDIM / 16;  // k-steps over the head dim
  constexpr int ES = static_cast<int>(sizeof(T));
  constexpr uint32_t kQBuf = BM * HDIM * ES;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw + W::kOffK);
  T* sV = reinterpret_cast<T*>(smem_raw + W::kOffV);
  T* sQ = reinterpret_cast<T*>(smem_raw + W::kOffQ);
  T* sDo = reinterpret_cast<T*>(smem_raw + W::kOffDo);
  T* sP = reinterpret_cast<T*>(smem_raw + W::kOffP);
  T* sDs = reinterpret_cast<T*>(smem_raw + W::kOffDs);
  float* sLse = reinterpret_cast<float*>(smem_raw + W::kOffLse);
  float* sD = reinterpret_cast<float*>(smem_raw + W::kOffD);

  const int n_block = blockIdx.x, kv_head = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const BwdSeq s = bwd_seq(p, b);
  const int sq = s.sq, sk = s.sk;
  const int n0 = n_block * BN;
  if (n0 >= sk) return;

  // The query blocks that see this key block (causal: from the block of the first row that sees
  // key n0), for each query head of the group.
  const int m_total = (sq + BM - 1) / BM;
  const int m_first = bwd_first_query_block<CAUSAL>(n0, sq, sk, BM, m_total);
  const int n_iter = (m_total - m_first) * p.head_ratio;
  const int h_first = kv_head * p.head_ratio;

  load_kv_block<BN, HDIM, HDIM, NT>(sK, sV, p, s, kv_head, n0, tid);
  cp_async_commit();

  // Q, LSE log2e and D of a step into buffer `buf`; dO into its one buffer. Rows past the sequence
  // are zero-filled (S = dP = D = LSE = 0 there: P = 1 meets dO = 0 and dS = 0, so nothing of
  // them reaches dK, dV or dQ).
  auto load_q = [&](int h, int r0, int buf) {
    const T* gQ = static_cast<const T*>(p.q) + s.q + h * p.q_head_stride +
                  static_cast<int64_t>(r0) * p.q_row_stride;
    load_query_tile<BM, HDIM, NT>(sQ + buf * BM * HDIM, gQ, p.q_row_stride, sq - r0, tid);
    load_lse_d<BM>(sLse + buf * BM, sD + buf * BM, p, s, h, r0, tid);
  };
  auto load_do = [&](int h, int r0, int buf) {
    const T* gDo = static_cast<const T*>(p.dout) + s.dout + h * p.do_head_stride +
                   static_cast<int64_t>(r0) * p.do_row_stride;
    load_query_tile<BM, HDIM, NT>(sDo + buf * BM * HDIM, gDo, p.do_row_stride, sq - r0, tid);
  };
  if (n_iter > 0) {
    load_q(h_first, m_first * BM, 0);
    load_do(h_first, m_first * BM, 0);
  }
  cp_async_commit();

  const int wm = warp % 4, wn = warp / 4;  // phase A
  const int wk = warp % 2, wd = warp / 2;  // phases B and C
  // A operands from [row][d] tiles (Q, dO): rows wm 16 + lane % 16, chunk 2 kk + lane / 16.
  const uint32_t q_a = smem_addr(sQ + (wm * 16 + lane % 16) * HDIM);
  const uint32_t do_a = smem_addr(sDo + (wm * 16 + lane % 16) * HDIM);
  const SwzCols a_cols((lane / 16) ^ (lane % 8));
  // B operands from [key][d] tiles (K, V: S = Q K^T, dP = dO V^T): rows wn 32 + (lane / 16) 8 +
  // lane % 8, chunk 2 kk + (lane / 8) % 2; one ldmatrix.x4 gives two 8-key n-tiles.
  const uint32_t k_b = smem_addr(sK + (wn * 32 + (lane / 16) * 8 + lane % 8) * HDIM);
  const uint32_t v_b = smem_addr(sV + (wn * 32 + (lane / 16) * 8 + lane % 8) * HDIM);
  const SwzCols b_cols(((lane / 8) % 2) ^ (lane % 8));
  // B operands from [k][n] tiles, transposed (dO, Q as [query][d]; K as [key][d]): row lane % 16,
  // chunk 2 dd + lane / 16; one ldmatrix.x4.trans gives two 8-column n-tiles.
  const uint32_t q_t = smem_addr(sQ + (lane % 16) * HDIM);
  const uint32_t do_t = smem_addr(sDo + (lane % 16) * HDIM);
  const uint32_t k_t = smem_addr(sK + (lane % 16) * HDIM);
  const SwzCols t_cols((lane / 16) ^ (lane % 8));
  // A operands P^T, dS^T (keys x queries) from the [query][key] tiles, transposed: lanes 0-7 give
  // queries 0-7 at key column 0, lanes 8-15 the same queries at key 8, lanes 16-31 queries 8-15.
  const uint32_t p_at = smem_addr(sP + ((lane % 8) + 8 * (lane / 16)) * PS + 8 * ((lane / 8) % 2));
  const uint32_t ds_at = smem_addr(sDs + ((lane % 8) + 8 * (lane / 16)) * PS + 8 * ((lane / 8) % 2));
  // A operand dS (queries x keys) from its [query][key] tile: row lane % 16, column 8 (lane / 16).
  const uint32_t ds_a = smem_addr(sDs + (lane % 16) * PS + 8 * (lane / 16));

  // KFORGE_FMHA_BWD_WIDE_VREG: this warp's V fragments for dP = dO V^T (32 keys x HDIM, 64
  // registers at 128) loaded once, as FlashAttention-2's small tile keeps V in registers.
  constexpr bool kVReg = KFORGE_FMHA_BWD_WIDE_VREG != 0;
  constexpr bool kDo2 = W::kDoBufs == 2;
  uint32_t vreg[kVReg ? KD : 1][2][4];
  if constexpr (kVReg) {
    cp_async_wait<1>();  // K and V are in (the first step's group may still be in flight)
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
#pragma unroll
      for (int np = 0; np < 2; ++np) ldsm_x4(vreg[kk][np], v_b + np * 16 * HDIM * ES + b_cols.at(kk));
    }
  }

  const float scale_log2 = p.scale_log2;
  float dv[2][4][4], dk[2][4][4];  // keys wk 32 + 16 mt .., columns wd 32 + 8 nt ..
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dv[mt][nt][e] = dk[mt][nt][e] = 0.f;
    }
  }

  int h = h_first, m_block = m_first;  // step it's query head and query block
  for (int it = 0; it < n_iter; ++it) {
    const int buf = it & 1;
    const bool wrap = m_block + 1 == m_total;
    const int h_next = wrap ? h + 1 : h;
    const int m_next = wrap ? m_first : m_block + 1;
    cp_async_wait<0>();
    __syncthreads();  // step it's Q, dO, LSE, D are in; step it - 1 is done with P, dS, Q[buf ^ 1]
    if (it + 1 < n_iter) {
      load_q(h_next, m_next * BM, buf ^ 1);
      if constexpr (kDo2) load_do(h_next, m_next * BM, buf ^ 1);
    }
    cp_async_commit();
    const int r0 = m_block * BM;
    const uint32_t do_off = kDo2 ? buf * kQBuf : 0u;
    const float* lse_s = sLse + buf * BM;
    const float* d_s = sD + buf * BM;

    // A: S and dP, 16 queries x 32 keys.
    float sa[4][4], pa[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sa[nt][e] = pa[nt][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t qf[4], of[4];
      ldsm_x4(qf, q_a + buf * kQBuf + a_cols.at(kk));
      ldsm_x4(of, do_a + do_off + a_cols.at(kk));
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t kb[4], vb[4];
        ldsm_x4(kb, k_b + np * 16 * HDIM * ES + b_cols.at(kk));
        if constexpr (kVReg) {
#pragma unroll
          for (int e = 0; e < 4; ++e) vb[e] = vreg[kk][np][e];
        } else {
          ldsm_x4(vb, v_b + np * 16 * HDIM * ES + b_cols.at(kk));
        }
        Mma<T>::run(sa[2 * np], qf, kb[0], kb[1]);
        Mma<T>::run(sa[2 * np + 1], qf, kb[2], kb[3]);
        Mma<T>::run(pa[2 * np], of, vb[0], vb[1]);
        Mma<T>::run(pa[2 * np + 1], of, vb[2], vb[3]);
      }
    }
    // P and dS to shared memory; masked where the block holds the end of the keys or crosses the
    // causal diagonal (bottom-right aligned).
    const bool masked = n0 + BN > sk || (CAUSAL && n0 + BN - 1 > r0 + sk - sq);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int ql = wm * 16 + lane / 4 + 8 * r;
      const float l = lse_s[ql];
      const float dd = d_s[ql];
      const int row = r0 + ql;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int kl = wn * 32 + nt * 8 + 2 * (lane % 4);
        float p0 = fast_exp2(fmaf(sa[nt][2 * r], scale_log2, -l));
        float p1 = fast_exp2(fmaf(sa[nt][2 * r + 1], scale_log2, -l));
        if (masked) {
          const int key = n0 + kl;
          if (key >= sk || (CAUSAL && key > row + sk - sq)) p0 = 0.f;
          if (key + 1 >= sk || (CAUSAL && key + 1 > row + sk - sq)) p1 = 0.f;
        }
        *reinterpret_cast<uint32_t*>(sP + ql * PS + kl) = Mma<T>::pack(p0, p1);
        *reinterpret_cast<uint32_t*>(sDs + ql * PS + kl) =
            Mma<T>::pack(p0 * (pa[nt][2 * r] - dd), p1 * (pa[nt][2 * r + 1] - dd));
      }
    }
    __syncthreads();  // P and dS of the step are in shared memory

    // B: dV += P^T dO (which 0) or dK += dS^T Q (which 1) over the step's 64 queries, 32 keys x
    // 32 columns.
    auto product_b = [&](auto which_c) {
      constexpr int which = decltype(which_c)::value;
#pragma unroll
      for (int ks = 0; ks < BM / 16; ++ks) {
        uint32_t af[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          ldsm_x4_t(af[mt], (which ? ds_at : p_at) + (ks * 16 * PS + wk * 32 + mt * 16) * ES);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t bf[4];
          ldsm_x4_t(bf, (which ? q_t + buf * kQBuf : do_t + do_off) + ks * 16 * HDIM * ES +
                            t_cols.at_dyn(wd * 2 + j));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            float(&acc)[4][4] = which ? dk[mt] : dv[mt];
            Mma<T>::run(acc[2 * j], af[mt], bf[0], bf[1]);
            Mma<T>::run(acc[2 * j + 1], af[mt], bf[2], bf[3]);
          }
        }
      }
    };
    // C: dQ = dS K, 32 queries x 32 columns, added to the fp32 accumulator.
    auto product_c = [&]() {
      float qa[2][4][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[mt][nt][e] = 0.f;
        }
      }
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks) {
        uint32_t af[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          ldsm_x4(af[mt], ds_a + ((wk * 32 + mt * 16) * PS + ks * 16) * ES);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t kb[4];
          ldsm_x4_t(kb, k_t + ks * 16 * HDIM * ES + t_cols.at_dyn(wd * 2 + j));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            Mma<T>::run(qa[mt][2 * j], af[mt], kb[0], kb[1]);
            Mma<T>::run(qa[mt][2 * j + 1], af[mt], kb[2], kb[3]);
          }
        }
      }
      float* dq_w = p.dq_accum + (h * p.rows + s.ws_row + r0 + wk * 32 + lane / 4) * HDIM + wd * 32 +
                    2 * (lane % 4);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (r0 + wk * 32 + mt * 16 + lane / 4 + 8 * r < sq) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              atomic_add2(dq_w + (mt * 16 + 8 * r) * HDIM + nt * 8, qa[mt][nt][2 * r],
                          qa[mt][nt][2 * r + 1]);
            }
          }
        }
      }
    };

    // KFORGE_FMHA_BWD_WIDE_ORDER: 0 dV, dK, dQ; 1 dQ (its adds first), dV, dK; 2 dV, dQ, dK.
    if constexpr (KFORGE_FMHA_BWD_WIDE_ORDER == 1) product_c();
    product_b(std::integral_constant<int, 0>{});
    if constexpr (!kDo2) {
      __syncthreads();  // every warp is done with dO: the next step's loads under dK and dQ
      if (it + 1 < n_iter) load_do(h_next, m_next * BM, 0);
      cp_async_commit();
    }
    if constexpr (KFORGE_FMHA_BWD_WIDE_ORDER == 2) product_c();
    product_b(std::integral_constant<int, 1>{});
    if constexpr (KFORGE_FMHA_BWD_WIDE_ORDER == 0) product_c();
    h = h_next;
    m_block = m_next;
  }

  // dK (scaled) and dV of this warp's 32 keys x 32 columns, in the input dtype.
  const float scale = p.softmax_scale;
  T* gdK = static_cast<T*>(p.dk) + s.dk + kv_head * p.dk_head_stride;
  T* gdV = static_cast<T*>(p.dv) + s.dv + kv_head * p.dv_head_stride;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = n0 + wk * 32 + mt * 16 + lane / 4 + 8 * r;
      if (key < sk) {
        T* rk = gdK + static_cast<int64_t>(key) * p.dk_row_stride + wd * 32 + 2 * (lane % 4);
        T* rv = gdV + static_cast<int64_t>(key) * p.dv_row_stride + wd * 32 + 2 * (lane % 4);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          *reinterpret_cast<uint32_t*>(rk + nt * 8) =
              Mma<T>::pack(dk[mt][nt][2 * r] * scale, dk[mt][nt][2 * r + 1] * scale);
          *reinterpret_cast<uint32_t*>(rv + nt * 8) = Mma<T>::pack(dv[mt][nt][2 * r], dv[mt][nt][2 * r + 1]);
        }
      }
    }
  }
}
