// Hopper (sm_90a) forward attention on TMA + mbarriers with a producer warp (head dims 64 and 128).
//
// Selected at run time by KFORGE_FMHA_SM90_PATH (fmha_api.cpp); unset, the default on sm_90a is
// one path per shape (fmha_api.cpp's default_tma_path). Fixed-length batches only (varlen falls back to the wgmma kernel of
// fmha_fwd_sm90.cuh at hdim 128, the mma.sync kernel at hdim 64).
//
// One CTA = 3 warpgroups and 128 query rows of one (head, batch) pair (the base variant):
//   warpgroup 0 (producer): gives registers away (setmaxnreg.dec to 24); one thread issues the
//     TMA loads (cp.async.bulk.tensor.4d, 128-byte swizzle): Q once, then K and V tiles of 128
//     keys into a ring of kStages buffers each. A "full" mbarrier per buffer completes when the
//     bytes have landed (expect_tx); an "empty" mbarrier per buffer completes when the 8
//     consumer warps have read it, and the producer waits on it before refilling.
//   warpgroups 1 and 2 (consumers, 64 query rows each): take registers (setmaxnreg.inc to 240)
//     and run S = Q K^T (wgmma m64n128k16, both operands in shared memory) and O += P V (wgmma
//     m64n64k16, P from the S registers, V MN-major from shared memory), with the stale-max
//     online softmax of fmha_fwd_kernel.cuh.
// The smem tile layout is the one of fmha_fwd_sm90.cuh ([hdim/64 halves][rows][64], 128-byte
// rows, 16-byte chunk c of row r at c ^ (r % 8)), which is exactly what TMA's 128B swizzle
// writes for a {64, rows} box at a 1024-byte aligned address.
//
// MODE (a template parameter, so one library holds all three and a process can compare them):
//   0 "tma-basic":   per key tile: wait K, Q K^T, softmax, wait V, P V (no overlap).
//   1 "tma-overlap": intra-warpgroup pipelining: Q K^T of tile i+1 and P V of tile i are issued
//                    together; the softmax of tile i+1 runs while P V of tile i is on the
//                    tensor cores (O's rescale waits for P V to finish).
//   2 "tma":         mode 1 plus ping-pong: the two consumer warpgroups take turns issuing
//                    their products (named barriers 4 and 5), so one's softmax hides under the
//                    other's GEMMs.
// VAR (a template parameter too: tuning variants that one GPU run compares, see Var below):
//   0 base: grid (m blocks, heads, batch), heavy causal m blocks first within each head.
//   1 "lpt": a 1-D grid in longest-processing-time order over L2-sized sections of
//     (batch, head) pairs (FlashAttention-3's section rule: as many pairs as fit their K and V
//     in 32 MiB, a power of 2): all pairs of a section run their heaviest m block first, then
//     the next, so the causal tail ends with the lightest CTAs of the whole grid.
//   2 "stages": one more K/V stage in the ring (hdim 128: 3 stages, 225 KiB of smem; hdim 64: 4).
//   3 "m192": three consumer warpgroups (192 query rows per CTA, setmaxnreg 160; hdim 64 only,
//     mode 1 only): more consumer warps per scheduler to hide the softmax.
//   4 "m192-lpt": 3 and 1 together.
//   5 "persist": mode 1 only; a persistent grid (one CTA per SM) walks the "lpt" tile order
//     with a static stride. Q is double-buffered (a full and an empty mbarrier per buffer), and
//     the K/V ring runs on across tiles, so the producer loads the next tile's Q, K and V while
//     the consumers finish this one (its last P V and the O epilogue).
//   6 "n176": 176-key tiles (hdim 128 only): Q K^T is one wgmma m64n176k16 per k-step and P V
//     11 k-steps, so the per-tile costs (barrier waits, row max shuffles, the wgmma fences and
//     waits) are spread over 37% more keys (FlashAttention-3's non-causal hdim-128 tile).
//   7 "dyn": persistent like 5, in modes 1 and 2 (ping-pong), but scheduled dynamically: each
//     CTA starts on tile blockIdx.x, then its producer takes the next tile index from a global
//     counter (atomicAdd) and hands it to the consumers in shared memory next to the Q buffer
//     it loads (-1: no tiles left). Tiles run in the "lpt" order when causal, else m block
//     within head. The last producer to finish resets the counter, so a launch leaves it 0
//     for the next launch on its stream (one counter per device and stream, launch_fwd_sm90_tma).
//   8 "dyn-xt": 7 in mode 1, with the tile boundary overlapped: right after issuing a tile's last
//     P V, each consumer warpgroup issues the next tile's first Q K^T (its Q and K are loaded by
//     then), and only then waits for P V and runs the epilogue (normalise, LSE, O stores), so the
//     epilogue runs under the next tile's first product instead of in front of it.
//   9 "dyn-n176": 7 with the 176-key tiles of 6 (hdim 128 only). Two Q buffers and two stages of
//     176-key K and V do not fit in 227 KiB, so Q has one buffer: each consumer warp releases
//     it as soon as its warpgroup's last Q K^T of the tile has completed (the producer then
//     loads the next tile's Q under the last softmax, P V and the epilogue), and the epilogue
//     writes O from registers straight to global memory instead of staging it in Q's buffer.
//   10, 11: 9 in mode 1, non-causal only, with each tile's first product (its partial last key
//     tile) computed 64 (10) or 112 (11) keys wide; the launcher picks one from seqlen_k.
//   13 "dyn-fe": 7 with a shorter epilogue: O goes to the staging buffer with stmatrix (8 stores
//     of four 8x8 matrices per thread instead of 32 4-byte stores), and a full tile's O stores go
//     out without a per-row bound check, so its 8 loads from the staging buffer are issued
//     together. (An approximate 1 / sum was tried too: it made the output differ in bits from
//     the static kernel that a graph capture falls back to.)
//   14 "dyn-ts": 13 with a TMA store of O and a tile start without divisions. Each consumer warp
//     stages its 16 rows with stmatrix as in 13, then one lane issues a TMA store of them (rows
//     past the end are clipped by the tensor map) and the warp goes on to its next tile: the
//     Q buffer is handed back after that tile's first Q K^T, once the store has read it. The
//     producer writes the tile's (m block, head, batch) next to its index, so the consumers do
//     not divide by the m-block and head counts at every tile.
//   15 "dyn-fs": 14 with a lighter first key tile: its softmax starts from an empty row (no
//     rescale test, no alpha, no O rescale), and its P V overwrites O (wgmma with D not read)
//     instead of adding to an O zeroed beforehand.
//   (16 "dyn-tm": 15 with each row's max as a tree instead of a chain; run 24: no faster, removed.)
//   (12: the split tail of tuning runs 13-14, measured slower and removed.)
// The producer's load order is a run-time flag (TmaMaps::kv_skew): K(i), V(i) or K(i), V(i - 1).
#pragma once

#include <algorithm>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda.h>  // CUtensorMap and its enums (types only: the driver is reached through cudart)

#include "fmha_fwd_sm90.cuh"
#include "fmha_paths.h"

namespace kforge_fmha {

// The three tensor maps of one call (Q, K, V), passed by value as a __grid_constant__ kernel
// parameter.
struct TmaMaps {
  CUtensorMap q, k, v;
  int m_blocks;     // query blocks per (batch, head) pair (the "lpt" order's 1-D grid)
  int lpt_section;  // (batch, head) pairs per L2 section of the "lpt" order
  int* sched;       // the "dyn" variant: {next tile - gridDim.x, producers done}, 0 between launches
  int kv_skew;      // the producer's load order (FwdParams::kv_skew)
  CUtensorMap o;    // VAR 14, 15: O, {64, 16} boxes (one consumer warp's rows); last, so that
                    // the other fields keep their offsets
};

namespace sm90tma {

// The tuning variants (VAR): what each one changes.
template <int VAR>
struct Var {
  static_assert(VAR >= 0 && VAR <= 15 && VAR != 12, "variant 0..11, 13..15");
  static constexpr bool kCrossTile = VAR == 8;
  // stmatrix staging; 13: unchecked full-tile stores, 14: a TMA store
  static constexpr bool kFastEpilogue = VAR >= 13;
  static constexpr bool kTmaStore = VAR >= 14;
  static constexpr bool kProducerCoords = VAR >= 14;  // the slot holds the tile's coordinates too
  static constexpr bool kLeanFirst = VAR == 15;       // the first key tile's softmax and P V
  static constexpr bool kDynamic = VAR == 7 || kCrossTile || VAR >= 9;
  static constexpr bool kPersist = VAR == 5 || kDynamic;
  static constexpr bool kLpt = VAR == 1 || VAR == 4 || VAR == 5;  // VAR 7: lpt when causal
  static constexpr bool kWideN = VAR == 6 || (VAR >= 9 && VAR <= 11);
  // One Q buffer released after the tile's last Q K^T, O stored from registers (VAR 9-11).
  static constexpr bool kSingleQ = VAR >= 9 && VAR <= 11;
  // Keys of each tile's first product (its last key tile) in VAR 10 and 11 (non-causal, where
  // every tile has the same partial last key tile; 0: the whole tile). A 128-key first product
  // made ptxas serialise the wgmmas (C7511), so a last key tile of 113-176 keys is computed whole.
  static constexpr int kFirstN = VAR == 10 ? 64 : VAR == 11 ? 112 : 0;
  static constexpr int kExtraStages = VAR == 2 ? 1 : 0;
  static constexpr int kConsumers = (VAR == 3 || VAR == 4) ? 3 : 2;
};

template <int HDIM, int VAR = 0>
struct Cfg {
  static_assert(HDIM == 64 || HDIM == 128, "head dim 64 or 128");
  static constexpr int kConsumers = Var<VAR>::kConsumers;  // consumer warpgroups, 64 rows each
  static_assert(kConsumers == 2 || HDIM == 64, "three consumer warpgroups only at head dim 64");
  static constexpr int kBlockM = 64 * kConsumers;
  static_assert(!Var<VAR>::kWideN || HDIM == 128, "176-key tiles only at head dim 128");
  static constexpr int kBlockN = Var<VAR>::kWideN ? 176 : 128;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kHalves = HDIM / 64;             // 64-column, 128-byte-row halves
  static constexpr int kHalfBytes = kBlockN * 128;      // K/V: [kBlockN rows][64] 16-bit
  static_assert(kHalfBytes % 1024 == 0, "K/V halves must stay 1024-byte aligned (128B swizzle)");
  static constexpr int kTileBytes = kHalves * kHalfBytes;
  static constexpr int kQHalfBytes = kBlockM * 128;     // Q (and O staging): [kBlockM rows][64]
  static constexpr int kQBytes = kHalves * kQHalfBytes;
  static constexpr int kStages = (HDIM == 128 ? 2 : 3) + Var<VAR>::kExtraStages;  // K/V ring
  static constexpr int kQBufs = Var<VAR>::kPersist && !Var<VAR>::kSingleQ ? 2 : 1;
  static constexpr int kBarOffset = kQBufs * kQBytes + 2 * kStages * kTileBytes;
  static constexpr int kNumBars = 2 * kQBufs + 4 * kStages;
  static constexpr int kSlotOffset = kBarOffset + 8 * kNumBars;  // dynamic: tile index per Q buffer
  // Ints per slot: the tile index, then (VAR 14, 15) its m block, head and batch.
  static constexpr int kSlotInts = Var<VAR>::kProducerCoords ? 4 : 1;
  static constexpr int kSmemBytes = kSlotOffset + 4 * kSlotInts * kQBufs + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 232448, "more shared memory than an sm_90 CTA can have");
  static_assert(kQHalfBytes % 1024 == 0, "Q halves must stay 1024-byte aligned (128B swizzle)");
  static constexpr int kProducerRegs = 24;
  // All 65536 registers: 128 x 24 for the producer warpgroup, the rest for the consumers
  // (a multiple of 8).
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "register file");
};

// The (batch, head) pairs per L2 section of the "lpt" order: as many as fit their K and V in
// 32 MiB (at least 1), rounded down to a power of 2 (FlashAttention-3's rule), times the GQA
// ratio (query heads of one K/V head share it).
inline int lpt_section(int seqlen_k, int hdim, int head_ratio) {
  const int64_t per_pair = static_cast<int64_t>(seqlen_k) * hdim * 2 * 2;  // K and V, 16-bit
  const int64_t l2 = int64_t{32} << 20;
  int s = 1;
  while (per_pair > 0 && static_cast<int64_t>(s) * 2 * per_pair <= l2 && s < (1 << 20)) s *= 2;
  return s * (head_ratio > 0 ? head_ratio : 1);
}

#if defined(KFORGE_FMHA_HAS_SM90_BODY)

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// One 4-D TMA tile load {c0 (columns), c1 (rows), c2 (head), c3 (batch)} into shared memory,
// completing `bytes` on the mbarrier.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// One 4-D TMA tile store from shared memory (the box of the map at {c0, c1, c2, c3}; rows past the
// tensor's end are not written), in this thread's current bulk group.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// This thread's bulk groups have read their shared memory (it may be overwritten).
__device__ __forceinline__ void bulk_wait_read0() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// This thread's bulk groups are complete (their writes done).
__device__ __forceinline__ void bulk_wait0() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Four 8x8 16-bit matrices to shared memory: lane l gives the address of row l % 8 of matrix
// l / 8; register i holds this lane's two elements of matrix i (the mma accumulator layout).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

#endif  // KFORGE_FMHA_HAS_SM90_BODY

// The tile scheduler: which (m block, head, batch) tiles a CTA computes, and in which order.
//  - one tile per CTA (VAR 0, 2, 3, 6): grid (m blocks, heads, batch), heavy causal m blocks first;
//  - lpt (Var::kLpt): a 1-D grid in longest-first order over L2 sections of (batch, head) pairs;
//  - persistent (Var::kPersist): a CTA walks tiles blockIdx.x, + gridDim.x, ... of that order;
//  - dynamic (Var::kDynamic): the producer claims each next tile from a global counter
//    (maps.sched) and hands it to the consumers through its Q buffer's slot; lpt order when
//    causal, a head's m blocks one after another when not.
// A tile index ti (0 .. total() - 1 when persistent) maps to a linear tile lin(ti), and coords()
// turns that into the tile.
template <bool CAUSAL, int VAR>
struct TileScheduler {
  static constexpr bool kPersist = Var<VAR>::kPersist;
  static constexpr bool kDynamic = Var<VAR>::kDynamic;
  const FwdParams& p;
  const TmaMaps& maps;

  __device__ __forceinline__ int total() const {
    return kPersist ? maps.m_blocks * p.num_heads * p.batch : 1;
  }
  __device__ __forceinline__ int stride() const { return kPersist ? static_cast<int>(gridDim.x) : 1; }
  __device__ __forceinline__ int first() const { return kPersist ? static_cast<int>(blockIdx.x) : 0; }
  __device__ __forceinline__ int lin(int ti) const {
    return kPersist ? ti : static_cast<int>(blockIdx.x);
  }
  // The producer's next tile index: a static stride, or (dynamic) the counter's next one.
  __device__ __forceinline__ int next(int ti) const {
    if constexpr (kDynamic) {
      return static_cast<int>(gridDim.x) + atomicAdd(maps.sched, 1);
    } else {
      return ti + stride();
    }
  }
  // The tile (m block, head, batch) of linear tile index lin.
  __device__ __forceinline__ void coords(int lin, int& m_block, int& head, int& b) const {
    if constexpr (Var<VAR>::kLpt || (kDynamic && CAUSAL)) {
      // Section after section of lpt_section (batch, head) pairs; inside a section, m blocks
      // from the last (heaviest when causal) to the first, all pairs of the section at each.
      const int mb = maps.m_blocks;
      const int pairs = p.num_heads * p.batch;
      const int per_sec = maps.lpt_section * mb;
      const int sec = lin / per_sec;
      const int first = sec * maps.lpt_section;
      const int in_sec = min(maps.lpt_section, pairs - first);
      const int r = lin - sec * per_sec;
      m_block = mb - 1 - r / in_sec;
      const int hb = first + r % in_sec;
      head = hb % p.num_heads;
      b = hb / p.num_heads;
    } else if constexpr (kDynamic) {  // non-causal: the m blocks of a head one after another
      const int mb = maps.m_blocks;
      m_block = mb - 1 - lin % mb;
      const int hb = lin / mb;
      head = hb % p.num_heads;
      b = hb / p.num_heads;
    } else {
      m_block = gridDim.x - 1 - blockIdx.x;  // heavy (late) causal blocks first
      head = blockIdx.y;
      b = blockIdx.z;
    }
  }
};

template <typename T, int HDIM, bool CAUSAL, int MODE, int VAR>
__global__ void __launch_bounds__(Cfg<HDIM, VAR>::kThreads, 1)
    fmha_fwd_sm90_tma_kernel(const __grid_constant__ FwdParams p,
                             const __grid_constant__ TmaMaps maps) {
#if defined(KFORGE_FMHA_HAS_SM90_BODY)
  using namespace detail;
  using namespace sm90;
  using C = Cfg<HDIM, VAR>;
  constexpr int kStages = C::kStages;
  constexpr int kHalves = C::kHalves;
  constexpr bool kOverlap = MODE >= 1;
  constexpr bool kPingPong = MODE >= 2;
  static_assert(!kPingPong || C::kConsumers == 2, "ping-pong takes two consumer warpgroups");
  constexpr bool kPersist = Var<VAR>::kPersist;
  constexpr bool kDynamic = Var<VAR>::kDynamic;
  constexpr bool kCrossTile = Var<VAR>::kCrossTile;
  static_assert(!kCrossTile || MODE == 1, "the cross-tile variant is of mode 1");
  static_assert(!kCrossTile || C::kBlockN == 128, "the stand-in product reads a V tile as K");
  static_assert(!kPersist || MODE == 1 || kDynamic, "the static persistent variant is of mode 1");
  constexpr int kBlockN = C::kBlockN;
  constexpr int kNT = kBlockN / 8;   // 8-key accumulator column groups of S
  constexpr int kKP = kBlockN / 16;  // k-steps of P V
  constexpr int kQBufs = C::kQBufs;
  constexpr bool kSingleQ = Var<VAR>::kSingleQ;
  static_assert(!kSingleQ || (kPersist && kQBufs == 1), "single-Q: a persistent kernel, one buffer");
  constexpr float kNegInf = -__builtin_huge_valf();

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = (1024u - (raw_addr & 1023u)) & 1023u;
  unsigned char* base = smem_raw + pad;
  const uint32_t sQ = raw_addr + pad;
  const uint32_t sK = sQ + kQBufs * C::kQBytes;     // kStages buffers
  const uint32_t sV = sK + kStages * C::kTileBytes;  // kStages buffers
  const uint32_t bars = sQ + C::kBarOffset;
  auto q_full = [&](int j) { return bars + 8u * j; };
  auto q_empty = [&](int j) { return bars + 8u * (kQBufs + j); };  // persistent variant only
  const uint32_t ring = bars + 8u * 2 * kQBufs;
  auto k_full = [&](int s) { return ring + 8u * s; };
  auto k_empty = [&](int s) { return ring + 8u * (kStages + s); };
  auto v_full = [&](int s) { return ring + 8u * (2 * kStages + s); };
  auto v_empty = [&](int s) { return ring + 8u * (3 * kStages + s); };
  // The dynamic variant's tile index per Q buffer, written by the producer before it arms the
  // buffer's full barrier (release), read by the consumers after waiting on it (acquire).
  volatile int* const slots = reinterpret_cast<volatile int*>(base + C::kSlotOffset);

  const TileScheduler<CAUSAL, VAR> sched{p, maps};
  const int total_tiles = sched.total();
  const int tile_stride = sched.stride();
  const int first_tile = sched.first();
  const int tid = threadIdx.x;
  const int wg = tid / 128;

  if constexpr (!kPersist) {  // a CTA with nothing to do leaves before any barrier
    int m_block, head, b;
    sched.coords(sched.lin(0), m_block, head, b);
    TileSetup<T> tile;
    if (!setup_tile<T, CAUSAL>(p, m_block, head, b, C::kBlockM, C::kBlockN, tile)) return;
  }

  if (tid == 0) {
#pragma unroll
    for (int j = 0; j < kQBufs; ++j) {
      mbar_init(q_full(j), 1);
      mbar_init(q_empty(j), 4 * C::kConsumers);  // one arrival per consumer warp
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 4 * C::kConsumers);  // one arrival per consumer warp
      mbar_init(v_empty(s), 4 * C::kConsumers);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<C::kProducerRegs>();
    if (tid == 0) {
      prefetch_map(&maps.q);
      prefetch_map(&maps.k);
      prefetch_map(&maps.v);
      if constexpr (Var<VAR>::kTmaStore) prefetch_map(&maps.o);
      int it = 0;  // K/V tiles loaded so far (the ring runs on across tiles)
      int qi = 0;  // tiles so far (the Q buffer ring)
      for (int ti = first_tile; ti < total_tiles; ti = sched.next(ti)) {
        int m_block, head, b;
        sched.coords(sched.lin(ti), m_block, head, b);
        TileSetup<T> tile;
        if (!setup_tile<T, CAUSAL, !Var<VAR>::kProducerCoords>(p, m_block, head, b, C::kBlockM,
                                                               C::kBlockN, tile)) {
          continue;
        }
        const int row0 = tile.row0, n_blocks = tile.n_blocks;
        const int kv_head = head / p.head_ratio;
        const int qb = qi % kQBufs;
        if (qi >= kQBufs) mbar_wait(q_empty(qb), ((qi / kQBufs) + 1) & 1);
        if constexpr (kDynamic) slots[qb * C::kSlotInts] = ti;
        if constexpr (Var<VAR>::kProducerCoords) {
          slots[qb * C::kSlotInts + 1] = m_block;
          slots[qb * C::kSlotInts + 2] = head;
          slots[qb * C::kSlotInts + 3] = b;
        }
        mbar_expect_tx(q_full(qb), C::kQBytes);
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          tma_load_4d(sQ + qb * C::kQBytes + h * C::kQHalfBytes, &maps.q, 64 * h, row0, head, b,
                      q_full(qb));
        }
        // Key tile i (keys run from the last tile to the first) of this tile into ring slot
        // it + i: K, or V.
        auto load_kv = [&](int i, bool is_v) {
          const int n = n_blocks - 1 - i;
          const int g = it + i;
          const int s = g % kStages;
          const uint32_t full = is_v ? v_full(s) : k_full(s);
          if (g >= kStages) mbar_wait(is_v ? v_empty(s) : k_empty(s), ((g / kStages) + 1) & 1);
          mbar_expect_tx(full, C::kTileBytes);
#pragma unroll
          for (int h = 0; h < kHalves; ++h) {
            tma_load_4d((is_v ? sV : sK) + s * C::kTileBytes + h * C::kHalfBytes,
                        is_v ? &maps.v : &maps.k, 64 * h, n * C::kBlockN, kv_head, b, full);
          }
        };
        // The consumers take K(i) and V(i - 1) together (Q K^T(i) and P V(i - 1)). The base order
        // is K(i), V(i); skewed, K(i), V(i - 1), so that K(i + 1) is not held behind V(i), whose
        // slot frees last (after P V(i - 2)).
        for (int i = 0; i < n_blocks; ++i) {
          load_kv(i, false);
          if (!maps.kv_skew) {
            load_kv(i, true);
          } else if (i > 0) {
            load_kv(i - 1, true);
          }
        }
        if (maps.kv_skew && n_blocks > 0) load_kv(n_blocks - 1, true);
        it += n_blocks;
        ++qi;
      }
      if constexpr (kDynamic) {
        // No tiles left: hand the consumers -1 through the next Q buffer's slot.
        const int qb = qi % kQBufs;
        if (qi >= kQBufs) mbar_wait(q_empty(qb), ((qi / kQBufs) + 1) & 1);
        slots[qb * C::kSlotInts] = -1;
        mbar_arrive(q_full(qb));
        // The last producer to get here resets the counter for the next launch: every other
        // producer has made its last atomicAdd on it (ordered before its "done" by the fence).
        __threadfence();
        if (atomicAdd(maps.sched + 1, 1) == static_cast<int>(gridDim.x) - 1) {
          __threadfence();
          atomicExch(maps.sched, 0);
          atomicExch(maps.sched + 1, 0);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<C::kConsumerRegs>();
  const int cw = wg - 1;  // consumer warpgroup 0 .. kConsumers - 1: rows 64 cw .. 64 cw + 63
  const int warp = (tid % 128) / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wrow = cw * 64 + warp * 16 + g;  // this thread's first row inside the block (+8)
  const float scale_log2 = p.scale_log2;

  constexpr uint64_t kTileUnits = C::kTileBytes >> 4;
  constexpr uint64_t kHalfUnits = C::kHalfBytes >> 4;
  constexpr uint64_t kQHalfUnits = C::kQHalfBytes >> 4;
  const uint64_t k_desc = make_desc(sK);
  const uint64_t v_desc = make_desc(sV);

  int it = 0;  // K/V tiles consumed so far (persistent: the ring runs on across tiles)
  int qi = 0;  // tiles so far
  constexpr bool kContinuousTurns = kPingPong && kDynamic;  // ping-pong turns across tiles
  if constexpr (kContinuousTurns) {
    if (cw == 1) named_arrive(4, 256);  // warpgroup 0 takes the first turn
  }
  // S and P live across tiles: the cross-tile variant issues a tile's first Q K^T into s during
  // the previous tile ("carried").
  float s[kBlockN / 2];
  uint32_t pa[kKP][4];
  bool carried = false;
  // VAR 14, 15: the Q buffer whose O a TMA store of this warp may still be reading (-1: none). It is
  // handed back to the producer early in the next tile (flush_o), once the store has read it.
  constexpr bool kTmaStore = Var<VAR>::kTmaStore;
  static_assert(!kTmaStore || (MODE == 1 && kDynamic), "the TMA store of O: dynamic, mode 1");
  int pending_q = -1;
  auto flush_o = [&]() {
    if constexpr (kTmaStore) {
      if (pending_q >= 0) {
        if (lane == 0) {
          bulk_wait_read0();
          mbar_arrive(q_empty(pending_q));
        }
        pending_q = -1;
      }
    }
  };
  for (int ti = first_tile; kDynamic || ti < total_tiles; ti += tile_stride) {
  int lin = sched.lin(ti);
  if constexpr (kDynamic) {  // the tile the producer loaded into the next Q buffer, or -1
    mbar_wait(q_full(qi % kQBufs), (qi / kQBufs) & 1);
    lin = slots[(qi % kQBufs) * C::kSlotInts];
    if (lin < 0) break;
  }
  int m_block, head, b;
  if constexpr (Var<VAR>::kProducerCoords) {
    const int sl = (qi % kQBufs) * C::kSlotInts;
    m_block = slots[sl + 1];
    head = slots[sl + 2];
    b = slots[sl + 3];
  } else {
    sched.coords(lin, m_block, head, b);
  }
  TileSetup<T> tile;
  // (VAR 14, 15 leave out setup_tile's varlen branches: the launcher takes fixed-length calls only.)
  if (!setup_tile<T, CAUSAL, !Var<VAR>::kProducerCoords>(p, m_block, head, b, C::kBlockM,
                                                         C::kBlockN, tile)) {
    continue;
  }
  const int sq = tile.sq, sk = tile.sk, row0 = tile.row0, n_blocks = tile.n_blocks;
  const int it0 = kPersist ? it : 0;  // a constant 0 unless persistent
  const int qb = kPersist ? qi % kQBufs : 0;
  const uint32_t q_parity = kPersist ? (qi / kQBufs) & 1 : 0;
  unsigned char* const qbase = base + qb * C::kQBytes;
  const uint64_t q_desc = make_desc(sQ + qb * C::kQBytes + cw * 64 * 128);

  // O is zeroed once no product is in flight: in the overlap modes after tile 0's Q K^T has
  // completed (the cross-tile variant issues that product during the previous tile, and ptxas
  // serialises every wgmma when an accumulator is written between a product's issue and wait).
  float o[kHalves][32];
  auto zero_o = [&]() {
#pragma unroll
    for (int d = 0; d < kHalves; ++d) {
#pragma unroll
      for (int i = 0; i < 32; ++i) o[d][i] = 0.f;
    }
  };
  if (!kOverlap || n_blocks == 0) zero_o();
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.f, 0.f};

  // Ping-pong turn-taking: warpgroup cw waits on barrier 4 + cw before issuing its products and
  // then lets the other one go (bar.arrive on 4 + (1 - cw)); both sides count 256 threads.
  // Warpgroup 1 opens with one arrive for warpgroup 0 and skips its own last arrive, so the
  // arrivals and waits match exactly. The dynamic (persistent) variant takes turns across tiles
  // instead: warpgroup 1 opens once before its first tile and never skips an arrive, so
  // warpgroup 0 starts its next tile's Q K^T as soon as warpgroup 1 has issued its last P V,
  // not after its epilogue; warpgroup 0 takes the one arrive left over when both are done.
  int turns_left = n_blocks + 1;  // product-issue points: Q K^T(0), n_blocks - 1 pairs, P V(last)
  auto turn_begin = [&]() {
    if constexpr (kPingPong) named_sync(4 + cw, 256);
  };
  auto turn_end = [&]() {
    if constexpr (kPingPong) {
      --turns_left;
      if (kContinuousTurns || !(cw == 1 && turns_left == 0)) named_arrive(4 + (1 - cw), 256);
    }
  };
  if (kPingPong && !kContinuousTurns && cw == 1 && n_blocks > 0) named_arrive(4, 256);

  auto needs_mask = [&](int n) {
    return (n + 1) * C::kBlockN > sk || (CAUSAL && n * C::kBlockN + C::kBlockN - 1 > row0 + sk - sq);
  };
  // VAR 10, 11: each tile's first product is its last key tile, partial, and is computed kW0
  // keys wide (64 or 112: the launcher picks the narrowest that covers sk), so keys past
  // the end cost no tensor-core time. S's entries past kW0 are set to -inf once it has completed.
  constexpr int kW0 = Var<VAR>::kFirstN > 0 ? Var<VAR>::kFirstN : kBlockN;
  // (No device-side check of the launcher's choice: a __trap() here made ptxas spill S.)
  static_assert(kW0 == kBlockN || (!CAUSAL && MODE == 1), "narrow first products: mode 1, non-causal");
  // S (or, first: its first kW0 keys) = Q K^T from descriptors of this warpgroup's Q rows and of
  // a K tile.
  auto qk_issue_w = [&](uint64_t qd, uint64_t kd, auto first) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HDIM / 16; ++kk) {
      const uint64_t kin = (kk % 4) * 2;  // 32 bytes per k16 inside a 64-column half
      const uint64_t a = qd + (kk / 4) * kQHalfUnits + kin, b = kd + (kk / 4) * kHalfUnits + kin;
      if constexpr (decltype(first)::value) {
        Wgmma<T>::template ss_first<kW0>(s, a, b, kk > 0);
      } else {
        Wgmma<T>::ss(s, a, b, kk > 0);
      }
    }
    wgmma_commit();
  };
  auto qk_issue_desc = [&](uint64_t qd, uint64_t kd) { qk_issue_w(qd, kd, std::false_type()); };
  auto qk_issue = [&](int stage) { qk_issue_desc(q_desc, k_desc + stage * kTileUnits); };
  // The tile's first product, kW0 keys wide.
  auto qk_issue_first = [&](int stage) {
    qk_issue_w(q_desc, k_desc + stage * kTileUnits, std::bool_constant<(kW0 < kBlockN)>());
  };
  // O += P V over the first KS k-steps (16 keys each) of a V tile.
  // overwrite (VAR 15, the tile's first P V): the first k-step writes O instead of adding to it.
  auto pv_issue_k = [&](int stage, auto ks, bool overwrite = false) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < decltype(ks)::value; ++kk) {
#pragma unroll
      for (int d = 0; d < kHalves; ++d) {
        Wgmma<T>::rs(o[d], pa[kk], v_desc + stage * kTileUnits + d * kHalfUnits + kk * (16 * 128 >> 4),
                     kk > 0 || !overwrite);
      }
    }
    wgmma_commit();
  };
  auto pv_issue = [&](int stage, bool overwrite = false) {
    pv_issue_k(stage, std::integral_constant<int, kKP>(), overwrite);
  };
  // P V of the tile's first key tile (kW0 keys wide; P is 0 past them).
  auto pv_issue_first = [&](int stage) {
    pv_issue_k(stage, std::integral_constant<int, kW0 / 16>());
  };
  auto mask = [&](int n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + wrow + 8 * r;
      const int limit = CAUSAL ? min(sk, row + sk - sq + 1) : sk;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n * C::kBlockN + 8 * j + 2 * t + e;
          if (col >= limit) s[4 * j + 2 * r + e] = kNegInf;
        }
      }
    }
  };
  // The max of `start` and this thread's entries of s in row half r.
  auto tile_max = [&](int r, float start) {
    float m = start;
#pragma unroll
    for (int j = 0; j < kNT; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    return m;
  };
  // This thread's entries of s in row half r become exp2(s scale - m_scaled); returns their sum.
  auto exp_row = [&](int r, float m_scaled) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = fast_exp2(fmaf(s[4 * j + 2 * r + e], scale_log2, -m_scaled));
        s[4 * j + 2 * r + e] = x;
        sum += x;
      }
    }
    return sum;
  };
  // Online softmax of s (stale max, exp2 domain): s becomes P (unnormalised). Returns whether O
  // must be rescaled by alpha[] (done by the caller, after any P V in flight has finished).
  auto softmax = [&](float (&alpha)[2]) -> bool {
    float mx[2];
    bool grow = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = tile_max(r, row_max[r]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      mx[r] = m;
      grow |= (m - row_max[r]) * scale_log2 > 8.f;  // -inf reference: inf > 8
    }
    const bool rescale = __any_sync(0xffffffffu, grow);
    if (rescale) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_scaled = (mx[r] == kNegInf) ? 0.f : mx[r] * scale_log2;
        alpha[r] = fast_exp2(row_max[r] * scale_log2 - m_scaled);
        row_max[r] = mx[r];
        row_sum[r] *= alpha[r];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_scaled = (row_max[r] == kNegInf) ? 0.f : row_max[r] * scale_log2;
      row_sum[r] += exp_row(r, m_scaled);
    }
    return rescale;
  };
  // VAR 15: the softmax of a tile's first key tile, whose rows have no max and no sum yet (what
  // softmax() computes from row_max -inf and row_sum 0, without its rescale of sum and O).
  auto softmax_first = [&]() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = tile_max(r, kNegInf);
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      row_max[r] = m;
      row_sum[r] = exp_row(r, (m == kNegInf) ? 0.f : m * scale_log2);
    }
  };
  auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int d = 0; d < kHalves; ++d) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          o[d][4 * j + 2 * r] *= alpha[r];
          o[d][4 * j + 2 * r + 1] *= alpha[r];
        }
      }
    }
  };
  // P as the register A operand: k-step kk covers keys 16 kk .. 16 kk + 15, i.e. the
  // accumulator n-tiles 2 kk and 2 kk + 1 (the mma.m16n8k16 A-fragment order).
  auto pack_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kKP; ++kk) {
      pa[kk][0] = Mma<T>::pack(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = Mma<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = Mma<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = Mma<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  // This warp is done reading a K or V buffer: one arrival per warp on its empty barrier.
  auto release = [&](uint32_t bar) {
    if (lane == 0) mbar_arrive(bar);
  };
  // Single-Q variant: this warp's last read of the Q buffer (its warpgroup's last Q K^T, which
  // the caller has waited for) is done, so the producer may load the next tile's Q into it. Only
  // the tensor cores read Q (the async proxy, like the TMA write): no proxy fence is needed.
  bool q_released = false;
  auto release_q_after = [&](bool last_qk) {
    if constexpr (kSingleQ) {
      if (last_qk) {
        release(q_empty(qb));
        q_released = true;
      }
    }
  };

  mbar_wait(q_full(qb), q_parity);

  if constexpr (!kOverlap) {
    for (int i = 0; i < n_blocks; ++i) {
      const int n = n_blocks - 1 - i;
      const int st = (it0 + i) % kStages;
      const uint32_t ph = ((it0 + i) / kStages) & 1;
      mbar_wait(k_full(st), ph);
      qk_issue(st);
      wgmma_wait0();
      keep(s);
      release(k_empty(st));
      release_q_after(i == n_blocks - 1);
      if (needs_mask(n)) mask(n);
      float alpha[2];
      if (softmax(alpha)) rescale_o(alpha);
      pack_p();
      mbar_wait(v_full(st), ph);
      pv_issue(st);
      wgmma_wait0();
      keep(o[0]);
      if constexpr (kHalves > 1) keep(o[kHalves - 1]);
      keep(pa);
      release(v_empty(st));
    }
  } else if (n_blocks > 0) {
    // Tile 0: Q K^T alone (cross-tile variant: already issued by the previous tile, if any).
    {
      const int n = n_blocks - 1;
      if (!(kCrossTile && carried)) {  // carried: issued and completed in the previous tile
        mbar_wait(k_full(it0 % kStages), (it0 / kStages) & 1);
        turn_begin();
        qk_issue_first(it0 % kStages);
        turn_end();
        wgmma_wait0();
      }
      keep(s);
      if constexpr (kW0 < kBlockN) {  // keys past kW0: -inf (the old values need no keeping)
#pragma unroll
        for (int j = kW0 / 2; j < kBlockN / 2; ++j) s[j] = kNegInf;
      }
      // VAR 15: O is not zeroed: the tile's first P V overwrites it.
      if constexpr (!Var<VAR>::kLeanFirst) zero_o();
      if constexpr (kW0 < kBlockN) {
        // O opaque: its own P V path (n_blocks 1) would otherwise see O as constant zeros and
        // feed one register to several accumulators (ptxas then serialises every wgmma).
#pragma unroll
        for (int d = 0; d < kHalves; ++d) keep(o[d]);
      }
      release(k_empty(it0 % kStages));
      flush_o();  // the previous tile's O store has long read its Q buffer
      release_q_after(n_blocks == 1);
      if (needs_mask(n)) mask(n);
      if constexpr (Var<VAR>::kLeanFirst) {
        softmax_first();
      } else {
        float alpha[2];
        if (softmax(alpha)) rescale_o(alpha);  // O is still 0: harmless
      }
      pack_p();
    }
    // Tile i: Q K^T(i) and P V(i - 1) in flight together; softmax(i) under P V(i - 1). With a
    // narrow first key tile (kW0 < kBlockN), step 1 (its P V) is a copy of its own, so that no
    // branch sits between a product's issue and its wait (ptxas would serialise every wgmma).
    auto step = [&](int i, auto first_pv) {
      const int n = n_blocks - 1 - i;
      const int st = (it0 + i) % kStages;
      const uint32_t ph = ((it0 + i) / kStages) & 1;
      const int pst = (it0 + i - 1) % kStages;
      const uint32_t pph = ((it0 + i - 1) / kStages) & 1;
      mbar_wait(k_full(st), ph);
      mbar_wait(v_full(pst), pph);
      turn_begin();
      qk_issue(st);
      if constexpr (decltype(first_pv)::value) {
        pv_issue_first(pst);
      } else {
        pv_issue(pst, Var<VAR>::kLeanFirst && i == 1);
      }
      turn_end();
      wgmma_wait1();  // Q K^T(i) done, P V(i - 1) may still run
      keep(s);
      release(k_empty(st));
      release_q_after(i == n_blocks - 1);
      if (needs_mask(n)) mask(n);
      float alpha[2];
      const bool rescale = softmax(alpha);
      // ptxas would sink the exponentials below the wait (next to the packing into pa, which
      // must wait for P V), and nothing would overlap P V. A warp-uniform branch on their sum
      // makes them come first; both sides only wait.
      if (__any_sync(0xffffffffu, __float_as_uint(row_sum[0] + row_sum[1]) == 0xffffffffu)) {
        asm volatile("wgmma.wait_group.sync.aligned 0; // rare side\n" ::: "memory");
      } else {
        wgmma_wait0();  // P V(i - 1) done: O and P's registers are free
      }
      keep(o[0]);
      if constexpr (kHalves > 1) keep(o[kHalves - 1]);
      keep(pa);
      release(v_empty(pst));
      if (rescale) rescale_o(alpha);
      pack_p();
    };
    constexpr bool kPeel = kW0 < kBlockN;
    if (kPeel && n_blocks > 1) step(1, std::true_type());
    for (int i = kPeel ? 2 : 1; i < n_blocks; ++i) step(i, std::false_type());
    // Last tile's P V.
    {
      const int st = (it0 + n_blocks - 1) % kStages;
      const uint32_t ph = ((it0 + n_blocks - 1) / kStages) & 1;
      mbar_wait(v_full(st), ph);
      turn_begin();
      if (kW0 < kBlockN && n_blocks == 1) {
        pv_issue_first(st);
      } else {
        pv_issue(st, Var<VAR>::kLeanFirst && n_blocks == 1);
      }
      turn_end();
      bool issued_next = false;
      if constexpr (kCrossTile) {
        // The next tile's first Q K^T goes out before this P V is waited for: its Q buffer and
        // first K tile are the next ones the producer loads (it needs no release of ours).
        // The product is issued on every path, so that ptxas sees one group after P V whatever
        // the branch (it serialises every wgmma when a path could read O with P V pending):
        // with no next tile, or one without key tiles, it multiplies this warpgroup's rows of
        // the next Q buffer by this tile's last V tile, both stable until that product is
        // waited for (V is released after it), and s is not used.
        const int nq = qi + 1;
        const int nqb = nq % kQBufs;
        mbar_wait(q_full(nqb), (nq / kQBufs) & 1);
        const int nlin = slots[nqb * C::kSlotInts];
        const uint32_t nq_base = sQ + nqb * C::kQBytes;
        uint64_t kd = v_desc + st * kTileUnits;
        if (nlin >= 0) {
          int nm, nh, nb;
          sched.coords(nlin, nm, nh, nb);
          TileSetup<T> nt;
          if (setup_tile<T, CAUSAL>(p, nm, nh, nb, C::kBlockM, C::kBlockN, nt) && nt.n_blocks > 0) {
            const int g = it0 + n_blocks;  // the ring index of its first K tile
            mbar_wait(k_full(g % kStages), (g / kStages) & 1);
            kd = k_desc + (g % kStages) * kTileUnits;
            issued_next = true;
          }
        }
        qk_issue_desc(make_desc(nq_base + cw * 64 * 128), kd);
        wgmma_wait1();  // this P V done; the next tile's Q K^T may still run
        if (!issued_next) wgmma_wait0();  // the stand-in product read V: done before V's release
      } else {
        wgmma_wait0();
      }
      keep(o[0]);
      if constexpr (kHalves > 1) keep(o[kHalves - 1]);
      keep(pa);
      release(v_empty(st));
      carried = issued_next;
    }
  } else {
    carried = false;
    flush_o();
  }

  // Epilogue: normalise, write the LSE, stage O through this warp's own 16 rows of sQ (every
  // Q K^T of this warpgroup has completed, and the other warpgroup only reads its own rows),
  // then 16-byte stores. The single-Q variant has handed Q's buffer back already: it stores O
  // from registers, 4 bytes per thread and store (4 threads cover 16 bytes of a row).
  T* gO = tile.o;
  const int64_t lse_off = tile.lse_off;
  constexpr bool kFastEpilogue = Var<VAR>::kFastEpilogue;
  static_assert(!kFastEpilogue || !kSingleQ, "the fast epilogue stages O in the Q buffer");
  float lse_val[2];  // VAR 14, 15: the rows' LSE, written after O's store has gone out
  if constexpr (kFastEpilogue) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + wrow + 8 * r;
      if constexpr (kTmaStore) {
        const float sum = quad_sum(row_sum[r]);
        lse_val[r] = row_lse(sum, row_max[r], scale_log2);
        inv[r] = !(sum > 0.f) ? 0.f : 1.f / sum;
      } else {
        inv[r] = finish_row(p, row_sum[r], row_max[r], scale_log2,
                            lse_off + head * p.lse_head_stride + row, t == 0 && row < sq);
      }
    }
    // One stmatrix per pair of 8-column groups (j = 2 jp, 2 jp + 1) of a 64-column half: its
    // matrix i = 2 (j - 2 jp) + r holds rows 8 r .. 8 r + 7 of this warp's 16 and the 8 columns
    // of group j; lane l gives the address of row l % 8 of matrix m = l / 8.
    const int m = lane / 8;
    const int lrow = cw * 64 + warp * 16 + 8 * (m % 2) + lane % 8;
    const uint32_t row_addr = sQ + qb * C::kQBytes + lrow * 128;
#pragma unroll
    for (int d = 0; d < kHalves; ++d) {
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 2 * jp + i / 2, r = i % 2;
          v[i] = Mma<T>::pack(o[d][4 * j + 2 * r] * inv[r], o[d][4 * j + 2 * r + 1] * inv[r]);
        }
        const int jj = 2 * jp + m / 2;
        stmatrix_x4(row_addr + d * C::kQHalfBytes + ((jj ^ (lrow & 7)) << 4), v[0], v[1], v[2], v[3]);
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int lrow = wrow + 8 * r;
      const int row = row0 + lrow;
      const float inv = finish_row(p, row_sum[r], row_max[r], scale_log2,
                                   lse_off + head * p.lse_head_stride + row, t == 0 && row < sq);
#pragma unroll
      for (int d = 0; d < kHalves; ++d) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t v = Mma<T>::pack(o[d][4 * j + 2 * r] * inv, o[d][4 * j + 2 * r + 1] * inv);
          if constexpr (kSingleQ) {
            if (row < sq) {
              *reinterpret_cast<uint32_t*>(gO + static_cast<int64_t>(lrow) * p.o_row_stride +
                                           d * 64 + 8 * j + 2 * t) = v;
            }
          } else {
            *reinterpret_cast<uint32_t*>(qbase + d * C::kQHalfBytes + lrow * 128 +
                                         ((j ^ (lrow & 7)) << 4) + t * 4) = v;
          }
        }
      }
    }
  }
  if constexpr (kSingleQ) {
    if (!q_released) release(q_empty(qb));  // a tile without key tiles never read Q
  } else if constexpr (kTmaStore) {
    // This warp's 16 rows, staged: one lane stores them with TMA (each thread's stmatrix writes
    // made visible to the async proxy first). The store runs on while the warp starts its next
    // tile; flush_o hands the buffer back.
    fence_proxy_async();
    __syncwarp();
    if (lane == 0) {
      const int wrow0 = cw * 64 + warp * 16;
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        tma_store_4d(&maps.o, sQ + qb * C::kQBytes + h * C::kQHalfBytes + wrow0 * 128, 64 * h,
                     row0 + wrow0, head, b);
      }
      bulk_commit();
    }
    pending_q = qb;
    // The LSE stores come after the fence above, which would otherwise wait for them.
    if (p.lse != nullptr && t == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + wrow + 8 * r;
        if (row < sq) p.lse[lse_off + head * p.lse_head_stride + row] = lse_val[r];
      }
    }
  } else {
    __syncwarp();
    constexpr int kChunks = HDIM / 8;  // 16-byte chunks per row
    if constexpr (kFastEpilogue) {
      auto store_chunk = [&](int i) {
        const int idx = i * 32 + lane;
        const int lrow = cw * 64 + warp * 16 + idx / kChunks;
        const int c = idx % kChunks;
        *reinterpret_cast<uint4*>(gO + static_cast<int64_t>(lrow) * p.o_row_stride + c * 8) =
            *reinterpret_cast<const uint4*>(qbase + (c >> 3) * C::kQHalfBytes + lrow * 128 +
                                            (((c & 7) ^ (lrow & 7)) << 4));
      };
      if (row0 + C::kBlockM <= sq) {  // a full tile: no row past the end, no check
#pragma unroll
        for (int i = 0; i < 16 * kChunks / 32; ++i) store_chunk(i);
      } else {
#pragma unroll
        for (int i = 0; i < 16 * kChunks / 32; ++i) {
          if (row0 + cw * 64 + warp * 16 + (i * 32 + lane) / kChunks < sq) store_chunk(i);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16 * kChunks / 32; ++i) {
        const int idx = i * 32 + lane;
        const int lrow = cw * 64 + warp * 16 + idx / kChunks;
        const int c = idx % kChunks;
        if (row0 + lrow < sq) {
          *reinterpret_cast<uint4*>(gO + static_cast<int64_t>(lrow) * p.o_row_stride + c * 8) =
              *reinterpret_cast<const uint4*>(qbase + (c >> 3) * C::kQHalfBytes + lrow * 128 +
                                              (((c & 7) ^ (lrow & 7)) << 4));
        }
      }
    }
    if constexpr (kPersist) {
      // This warp's staging reads of the Q buffer are done: let the producer's TMA refill it
      // (generic-proxy accesses ordered before the async-proxy write).
      fence_proxy_async();
      __syncwarp();
      release(q_empty(qb));
    }
  }
  if constexpr (kCrossTile) {
    // The next tile's first Q K^T ran under this epilogue: wait for it here, so that no product
    // is in flight across the loop's back edge (ptxas would serialise every wgmma).
    wgmma_wait0();
    keep(s);
  }
  it += n_blocks;
  ++qi;
  }  // tiles
  if constexpr (kTmaStore) {
    flush_o();
    if (lane == 0) bulk_wait0();  // the last O stores are done before the CTA's memory goes
  }
  if constexpr (kContinuousTurns) {
    if (cw == 0) named_sync(4, 256);  // warpgroup 1's arrive after its last turn
  }
#endif  // KFORGE_FMHA_HAS_SM90_BODY
}

}  // namespace sm90tma

namespace tma_host {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link), looked up
// once; null when the driver does not have it.
inline EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// A {hdim, rows, heads, batch} tensor map with a {64, box_rows, 1, 1} box and 128-byte swizzle. A
// size-1 dimension gets a harmless stride (its own may be 0). False when the driver refuses it.
template <typename T, int HDIM>
bool encode(CUtensorMap* map, const void* ptr, int rows, int heads, int batch, int64_t row_stride,
            int64_t head_stride, int64_t batch_stride, int box_rows) {
  const EncodeTiledFn fn = encode_tiled();
  if (fn == nullptr || rows < 1 || heads < 1 || batch < 1) return false;
  constexpr int64_t kElem = 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(HDIM), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  int64_t st[3] = {row_stride * kElem, head_stride * kElem, batch_stride * kElem};
  int64_t span = HDIM * kElem;
  for (int i = 0; i < 3; ++i) {
    if (dims[i + 1] == 1 && st[i] <= 0) st[i] = span;
    if (st[i] <= 0 || st[i] % 16 != 0 || st[i] >= (int64_t{1} << 40)) return false;
    span = st[i] * static_cast<int64_t>(dims[i + 1]);
  }
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(st[0]), static_cast<cuuint64_t>(st[1]),
                                 static_cast<cuuint64_t>(st[2])};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt = std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return fn(map, dt, 4, const_cast<void*>(ptr), dims, strides, box, elem_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The dynamic scheduler's counter pair of one device and stream ({next, done}, cudaMalloc'ed and
// zeroed on first use by a memset on that stream, so in stream order before its first launch;
// each launch leaves it zero). A plain cudaMemset runs on the legacy default stream, which a
// non-blocking stream (every torch.cuda.Stream) does not wait for: queued behind other work there,
// it landed while the new stream's launches ran and reset the pair under one of them, and the
// launches after it skipped tiles (H200, 2026-11-28: 4 of 14 test processes with that memset, 0 of
// 14 with this one; tests/test_gpu.py, test_dynamic_path_zeroes_a_new_streams_counter_in_its_order
// and the two-stream test). A launch on another stream gets its own pair, so launches that may
// run at the same time never share one; cudaStreamPerThread is told apart by thread. Null when
// none can be had: the stream is being captured into a graph (a graph could be replayed on any
// stream, beside a launch that uses the same pair), or cudaMalloc failed. The caller then runs a
// kernel with a static schedule.
inline int* sched_counter(int dev, cudaStream_t stream) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (cap != cudaStreamCaptureStatusNone) return nullptr;
  struct Key {
    int dev;
    cudaStream_t stream;
    std::thread::id thread;
    bool operator==(const Key& o) const {
      return dev == o.dev && stream == o.stream && thread == o.thread;
    }
  };
  struct Entry {
    Key key;
    int* counter;
  };
  static std::mutex mu;
  static std::vector<Entry> table;  // few streams: a linear search
  const Key key{dev, stream,
                stream == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id()};
  std::lock_guard<std::mutex> lock(mu);
  for (const Entry& e : table) {
    if (e.key == key) return e.counter;
  }
  if (table.size() >= 1024) return nullptr;
  int* c = nullptr;
  if (cudaMalloc(&c, 2 * sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (cudaMemsetAsync(c, 0, 2 * sizeof(int), stream) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(c);
    return nullptr;
  }
  table.push_back(Entry{key, c});
  return c;
}

}  // namespace tma_host

// True when this library's code for the current device holds the sm_90a body of the TMA kernel.
template <typename T, int HDIM, bool CAUSAL, int MODE, int VAR>
bool sm90_tma_available() {
  static int state[64] = {};  // 0: unknown, 1: yes, 2: no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev < 64) {
    const int s = __atomic_load_n(&state[dev], __ATOMIC_ACQUIRE);
    if (s != 0) return s == 1;
  }
  cudaFuncAttributes attr;
  const bool yes =
      cudaFuncGetAttributes(&attr,
                            sm90tma::fmha_fwd_sm90_tma_kernel<T, HDIM, CAUSAL, MODE, VAR>) ==
          cudaSuccess &&
      attr.binaryVersion == 90 && tma_host::encode_tiled() != nullptr;
  if (!yes) cudaGetLastError();
  if (dev < 64) __atomic_store_n(&state[dev], yes ? 1 : 2, __ATOMIC_RELEASE);
  return yes;
}

// Launches the TMA kernel and returns its launch status, or returns cudaErrorNotSupported
// without launching anything when this call cannot take the TMA path (varlen, or tensor maps
// the driver refuses); the caller then runs another kernel.
template <typename T, int HDIM, bool CAUSAL, int MODE, int VAR>
cudaError_t launch_fwd_sm90_tma(const FwdParams& params, cudaStream_t stream) {
  using C = sm90tma::Cfg<HDIM, VAR>;
  if (params.cu_seqlens_q != nullptr || params.cu_seqlens_k != nullptr) return cudaErrorNotSupported;
  TmaMaps maps;
  if (!tma_host::encode<T, HDIM>(&maps.q, params.q, params.seqlen_q, params.num_heads,
                                 params.batch, params.q_row_stride, params.q_head_stride,
                                 params.q_batch_stride, C::kBlockM) ||
      !tma_host::encode<T, HDIM>(&maps.k, params.k, params.seqlen_k, params.num_heads_k,
                                 params.batch, params.k_row_stride, params.k_head_stride,
                                 params.k_batch_stride, C::kBlockN) ||
      !tma_host::encode<T, HDIM>(&maps.v, params.v, params.seqlen_k, params.num_heads_k,
                                 params.batch, params.v_row_stride, params.v_head_stride,
                                 params.v_batch_stride, C::kBlockN)) {
    return cudaErrorNotSupported;
  }
  if (sm90tma::Var<VAR>::kTmaStore &&
      !tma_host::encode<T, HDIM>(&maps.o, params.o, params.seqlen_q, params.num_heads,
                                 params.batch, params.o_row_stride, params.o_head_stride,
                                 params.o_batch_stride, 16)) {
    return cudaErrorNotSupported;
  }
  const int m_blocks = (params.seqlen_q + C::kBlockM - 1) / C::kBlockM;
  maps.m_blocks = m_blocks;
  maps.lpt_section = std::min(params.lpt_section > 0
                                  ? params.lpt_section
                                  : sm90tma::lpt_section(params.seqlen_k, HDIM, params.head_ratio),
                              params.num_heads * params.batch);
  auto kernel = sm90tma::fmha_fwd_sm90_tma_kernel<T, HDIM, CAUSAL, MODE, VAR>;
  static int configured[64] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 64 || !__atomic_load_n(&configured[dev], __ATOMIC_ACQUIRE)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
    if (err != cudaSuccess) return err;
    if (dev < 64) __atomic_store_n(&configured[dev], 1, __ATOMIC_RELEASE);
  }
  dim3 grid(m_blocks, params.num_heads, params.batch);
  if (sm90tma::Var<VAR>::kLpt) {
    const int64_t ctas = static_cast<int64_t>(m_blocks) * params.num_heads * params.batch;
    if (ctas > 0x7fffffff) return cudaErrorNotSupported;  // the base order's grid takes it
    grid = dim3(static_cast<unsigned>(ctas), 1, 1);
  }
  if (sm90tma::Var<VAR>::kPersist) {  // one CTA per SM (at most one fits)
    const int64_t ctas = static_cast<int64_t>(m_blocks) * params.num_heads * params.batch;
    if (ctas > 0x7fffffff) return cudaErrorNotSupported;
    int sms = 0;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    grid = dim3(static_cast<unsigned>(std::min<int64_t>(ctas, sms > 0 ? sms : 1)), 1, 1);
  }
  maps.sched = nullptr;
  maps.kv_skew = params.kv_skew;
  if (sm90tma::Var<VAR>::kDynamic) {
    maps.sched = tma_host::sched_counter(dev, stream);
    if (maps.sched == nullptr) return cudaErrorNotSupported;  // the caller runs a static order
  }
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(params, maps);
  return cudaGetLastError();
}

}  // namespace kforge_fmha

// The kernels this build compiles, found by (causal, mode, var) at run time: fmha_paths.h's
// kernel_built decides, per head dim and mask, from the table of fmha_paths.def (the shipped
// build: what the default rule and its fallbacks reach; KFORGE_FMHA_TUNING_PATHS: every path).
// A kernel is compiled exactly when its functions' addresses are taken below.
namespace kforge_fmha {
namespace sm90tma {

template <typename T, int HDIM, bool CAUSAL, int MODE, int VAR>
TmaKernelFns kernel_fns() {
  if constexpr (paths::kernel_built(HDIM, CAUSAL, MODE, VAR)) {
    return {&sm90_tma_available<T, HDIM, CAUSAL, MODE, VAR>,
            &launch_fwd_sm90_tma<T, HDIM, CAUSAL, MODE, VAR>};
  } else {
    return {nullptr, nullptr};
  }
}

template <typename T, int HDIM, bool CAUSAL, int MODE, int... VARS>
TmaKernelFns kernel_by_var(int var, std::integer_sequence<int, VARS...>) {
  TmaKernelFns fns{nullptr, nullptr};
  (void)((var == VARS ? (fns = kernel_fns<T, HDIM, CAUSAL, MODE, VARS>(), true) : false) || ...);
  return fns;
}

template <typename T, int HDIM, bool CAUSAL>
TmaKernelFns kernel_by_mode(int mode, int var) {
  using Vars = std::make_integer_sequence<int, paths::kMaxVar>;
  switch (mode) {
    case 0: return kernel_by_var<T, HDIM, CAUSAL, 0>(var, Vars{});
    case 1: return kernel_by_var<T, HDIM, CAUSAL, 1>(var, Vars{});
    case 2: return kernel_by_var<T, HDIM, CAUSAL, 2>(var, Vars{});
    default: return {nullptr, nullptr};
  }
}

}  // namespace sm90tma

template <typename T, int HDIM>
TmaKernelFns sm90_tma_kernel(bool causal, int mode, int var) {
  return causal ? sm90tma::kernel_by_mode<T, HDIM, true>(mode, var)
                : sm90tma::kernel_by_mode<T, HDIM, false>(mode, var);
}

}  // namespace kforge_fmha

#define KFORGE_FMHA_INSTANTIATE_SM90_TMA(T, HDIM) \
  template kforge_fmha::TmaKernelFns kforge_fmha::sm90_tma_kernel<T, HDIM>(bool, int, int);
