// Hopper (sm_90a) forward attention for head dim 128: wgmma for both products.
//
// Selected at run time (fmha_api.cpp) when the GPU is compute capability 9.0, the library holds
// sm_90a code and KFORGE_FMHA_SM90 is not 0; every other case runs fmha_fwd_kernel.cuh. The
// kernel body exists only in the sm_90a compile pass (__CUDA_ARCH_FEAT_SM90_ALL); the other
// passes compile an empty stub that is never launched.
//
// One CTA = 2 warpgroups = 128 query rows (64 per warpgroup) of one (head, batch) pair.
// Q, K and V tiles live in shared memory in the wgmma 128-byte-swizzle layout: a [rows][128]
// tile is stored as two [rows][64] halves, each row 128 bytes, 16-byte chunk c of row r at
// chunk c ^ (r % 8). K and V tiles of 128 keys are double-buffered and loaded with cp.async by
// all 256 threads one step ahead. S = Q K^T is wgmma m64n128k16 with both operands in shared
// memory (K-major); O += P V is wgmma m64n64k16 with P taken straight from the S accumulators
// as the register A operand and V read MN-major (transposed) from shared memory. Each step
// issues Q K^T first, then the cp.async loads of the next tile, then waits. The softmax
// (stale max, exp2 domain) and the masking rules follow fmha_fwd_kernel.cuh; the tile setup
// (GQA, varlen, causal key range) and the row epilogue are its detail::setup_tile and finish_row.
// The compile-time options below (ping-pong, n128 P V, load order) were measured on an H200;
// docs/benchmarks.md has the numbers.
#pragma once

#include "fmha_fwd_kernel.cuh"

namespace kforge_fmha {
namespace sm90 {

constexpr int kBlockM = 128;
constexpr int kBlockN = 128;
constexpr int kHdim = 128;
constexpr int kThreads = 256;
constexpr int kTileBytes = 128 * 128 * 2;       // one [128][128] 16-bit tile
constexpr int kHalfBytes = kTileBytes / 2;      // one [128][64] swizzled half
// Ping-pong: warpgroup 1 runs half a step behind warpgroup 0 (softmax and P V of the previous
// key tile, then Q K^T of this one), so one warpgroup's softmax overlaps the other's products.
// V then needs a third buffer, since warpgroup 1 still reads the previous tile's V.
#ifndef KFORGE_FMHA_SM90_PINGPONG
#define KFORGE_FMHA_SM90_PINGPONG 0
#endif
constexpr bool kPingPong = KFORGE_FMHA_SM90_PINGPONG != 0;
// P V as one m64n128k16 per 16 keys (V's two 64-column halves through the descriptor's LBO)
// instead of two m64n64k16.
#ifndef KFORGE_FMHA_SM90_PV_N128
#define KFORGE_FMHA_SM90_PV_N128 0
#endif
constexpr bool kPvN128 = KFORGE_FMHA_SM90_PV_N128 != 0;
// Issue Q K^T before the next tile's cp.async loads instead of after them.
#ifndef KFORGE_FMHA_SM90_LOAD_AFTER_QK
#define KFORGE_FMHA_SM90_LOAD_AFTER_QK 1
#endif
constexpr bool kLoadAfterQk = KFORGE_FMHA_SM90_LOAD_AFTER_QK != 0;
constexpr int kVStages = kPingPong ? 3 : 2;
// Q, 2 x K, kVStages x V, 1024-byte alignment slack.
constexpr int kSmemBytes = (3 + kVStages) * kTileBytes + 1024;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KFORGE_FMHA_HAS_SM90_BODY 1

// Shared-memory matrix descriptor: start address, LBO and SBO (both 1024 bytes: the stride of
// 8-row groups; LBO is unused by the K-major operands and by the one-atom-wide V operand), and
// the 128-byte swizzle mode. Offsets are added later in 16-byte units to the low field.
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr) {
  uint64_t d = static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4);
  d |= static_cast<uint64_t>(1024 >> 4) << 16;
  d |= static_cast<uint64_t>(1024 >> 4) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait1() {
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
// Named barriers (id 0 is __syncthreads'); count threads, a multiple of 32.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void keep(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void keep(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

__device__ __forceinline__ void wgmma_ss_bf16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,"
      "%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,"
      "%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,"
      "%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,"
      "%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_rs_bf16(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                              int accumulate = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,"
      "%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,"
      "%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss_f16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,"
      "%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,"
      "%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,"
      "%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,"
      "%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_rs_f16(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                              int accumulate = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,"
      "%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,"
      "%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}


__device__ __forceinline__ void wgmma_rs128_bf16(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,"
      "%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,"
      "%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,"
      "%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,"
      "%56,%57,%58,%59,%60,%61,%62,%63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

__device__ __forceinline__ void wgmma_rs128_f16(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,"
      "%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,"
      "%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,"
      "%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,"
      "%56,%57,%58,%59,%60,%61,%62,%63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// m64nNk16 Q K^T (both operands from shared memory) at the widths the TMA kernel's 176-key tiles
// use: 176 (FlashAttention-3's non-causal hdim-128 tile width), and 64 and 112 for a tile's
// partial last key tile (its first product), so that keys past the end cost no tensor-core time.
// One function per (width, type), from one macro; NREG = N / 2 accumulators per thread, the first
// NREG of d (an array of at least NREG: the narrow widths write the first entries of S in place,
// where a cast to a shorter array would put S in local memory).
#define KFORGE_FMHA_O8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
    "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define KFORGE_FMHA_OUTS32 KFORGE_FMHA_O8(0), KFORGE_FMHA_O8(8), KFORGE_FMHA_O8(16), KFORGE_FMHA_O8(24)
#define KFORGE_FMHA_OUTS56 KFORGE_FMHA_OUTS32, KFORGE_FMHA_O8(32), KFORGE_FMHA_O8(40), KFORGE_FMHA_O8(48)
#define KFORGE_FMHA_OUTS64 KFORGE_FMHA_OUTS56, KFORGE_FMHA_O8(56)
#define KFORGE_FMHA_OUTS88 KFORGE_FMHA_OUTS64, KFORGE_FMHA_O8(64), KFORGE_FMHA_O8(72), KFORGE_FMHA_O8(80)
#define KFORGE_FMHA_REGS32 "%0,%1,%2,%3,%4,%5,%6,%7," "%8,%9,%10,%11,%12,%13,%14,%15," "%16,%17,%18,%19,%20,%21,%22,%23," "%24,%25,%26,%27,%28,%29,%30,%31"
#define KFORGE_FMHA_REGS56 KFORGE_FMHA_REGS32 ","  "%32,%33,%34,%35,%36,%37,%38,%39," "%40,%41,%42,%43,%44,%45,%46,%47," "%48,%49,%50,%51,%52,%53,%54,%55"
#define KFORGE_FMHA_REGS64 KFORGE_FMHA_REGS56 "," "%56,%57,%58,%59,%60,%61,%62,%63"
#define KFORGE_FMHA_REGS88 KFORGE_FMHA_REGS64 "," "%64,%65,%66,%67,%68,%69,%70,%71," "%72,%73,%74,%75,%76,%77,%78,%79," "%80,%81,%82,%83,%84,%85,%86,%87"
// SHAPE: "m64nNk16"; ARGS: "%NREG, %NREG+1" (the descriptors); PRED: "%NREG+2" (accumulate).
#define KFORGE_FMHA_WGMMA_SS(NAME, NREG, SHAPE, PTX_TYPE, ARGS, PRED)                          \
  template <int M>                                                                             \
  __device__ __forceinline__ void NAME(float (&d)[M], uint64_t da, uint64_t db, int accumulate) { \
    static_assert(M >= NREG, "the accumulator array is too short");                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                             \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." PTX_TYPE "." PTX_TYPE " "      \
                 "{" KFORGE_FMHA_REGS##NREG "}, " ARGS ", p, 1, 1, 0, 0;\n}\n"                  \
                 : KFORGE_FMHA_OUTS##NREG                                                      \
                 : "l"(da), "l"(db), "r"(accumulate));                                          \
  }
KFORGE_FMHA_WGMMA_SS(wgmma_ss176_bf16, 88, "m64n176k16", "bf16", "%88, %89", "%90")
KFORGE_FMHA_WGMMA_SS(wgmma_ss176_f16, 88, "m64n176k16", "f16", "%88, %89", "%90")
KFORGE_FMHA_WGMMA_SS(wgmma_ss112_bf16, 56, "m64n112k16", "bf16", "%56, %57", "%58")
KFORGE_FMHA_WGMMA_SS(wgmma_ss112_f16, 56, "m64n112k16", "f16", "%56, %57", "%58")
KFORGE_FMHA_WGMMA_SS(wgmma_ss64_bf16, 32, "m64n64k16", "bf16", "%32, %33", "%34")
KFORGE_FMHA_WGMMA_SS(wgmma_ss64_f16, 32, "m64n64k16", "f16", "%32, %33", "%34")
KFORGE_FMHA_WGMMA_SS(wgmma_ss128w_bf16, 64, "m64n128k16", "bf16", "%64, %65", "%66")
KFORGE_FMHA_WGMMA_SS(wgmma_ss128w_f16, 64, "m64n128k16", "f16", "%64, %65", "%66")
#undef KFORGE_FMHA_WGMMA_SS
#undef KFORGE_FMHA_REGS88
#undef KFORGE_FMHA_REGS64
#undef KFORGE_FMHA_REGS56
#undef KFORGE_FMHA_REGS32
#undef KFORGE_FMHA_OUTS88
#undef KFORGE_FMHA_OUTS64
#undef KFORGE_FMHA_OUTS56
#undef KFORGE_FMHA_OUTS32
#undef KFORGE_FMHA_O8

// Wgmma<T>::ss_first<N>(d, ...): the first N / 2 entries of S (keys 0 .. N - 1), N of 64, 112,
// 128 or 176; SUF is the type's suffix of the functions above.
#define KFORGE_FMHA_SS_FIRST(SUF)                                                                  \
  template <int N, int M>                                                                          \
  static __device__ __forceinline__ void ss_first(float (&d)[M], uint64_t da, uint64_t db, int acc) { \
    static_assert(N == 64 || N == 112 || N == 128 || N == 176, "width 64, 112, 128 or 176");      \
    if constexpr (N == 64) wgmma_ss64_##SUF(d, da, db, acc);                                       \
    if constexpr (N == 112) wgmma_ss112_##SUF(d, da, db, acc);                                     \
    if constexpr (N == 128) wgmma_ss128w_##SUF(d, da, db, acc);                                    \
    if constexpr (N == 176) wgmma_ss176_##SUF(d, da, db, acc);                                     \
  }
template <typename T>
struct Wgmma;
template <>
struct Wgmma<__nv_bfloat16> {
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t da, uint64_t db, int acc) {
    wgmma_ss_bf16(d, da, db, acc);
  }
  static __device__ __forceinline__ void ss(float (&d)[88], uint64_t da, uint64_t db, int acc) {
    wgmma_ss176_bf16(d, da, db, acc);
  }
  KFORGE_FMHA_SS_FIRST(bf16)
  // accumulate 0: D = A B (D's old values are not read)
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                            int accumulate = 1) {
    wgmma_rs_bf16(d, a, db, accumulate);
  }
  static __device__ __forceinline__ void rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    wgmma_rs128_bf16(d, a, db);
  }
};
template <>
struct Wgmma<__half> {
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t da, uint64_t db, int acc) {
    wgmma_ss_f16(d, da, db, acc);
  }
  static __device__ __forceinline__ void ss(float (&d)[88], uint64_t da, uint64_t db, int acc) {
    wgmma_ss176_f16(d, da, db, acc);
  }
  KFORGE_FMHA_SS_FIRST(f16)
  // accumulate 0: D = A B (D's old values are not read)
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                            int accumulate = 1) {
    wgmma_rs_f16(d, a, db, accumulate);
  }
  static __device__ __forceinline__ void rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    wgmma_rs128_f16(d, a, db);
  }
};

// cp.async of a [128][128] tile into the swizzled layout; rows >= valid_rows are zero-filled.
// Thread t copies chunk t % 16 of rows t / 16 + 16 i, so row % 8 is the same for every i.
template <typename T>
__device__ __forceinline__ void load_tile(uint32_t sbase, const T* g, int64_t stride,
                                          int valid_rows, int tid) {
  const int c = tid & 15;
  const int r = tid >> 4;
  const uint32_t dst = sbase + (c >> 3) * kHalfBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
  const T* src = g + static_cast<int64_t>(r) * stride + c * 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const bool valid = r + 16 * i < valid_rows;
    detail::cp_async16(dst + i * 16 * 128, valid ? src + i * 16 * stride : g, valid);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <typename T, bool CAUSAL>
__global__ void __launch_bounds__(kThreads, 1) fmha_fwd_sm90_kernel(const FwdParams p) {
#if defined(KFORGE_FMHA_HAS_SM90_BODY)
  using namespace detail;
  constexpr float kNegInf = -__builtin_huge_valf();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = (1024u - (raw_addr & 1023u)) & 1023u;
  unsigned char* base = smem_raw + pad;
  const uint32_t sQ = raw_addr + pad;
  const uint32_t sK = sQ + kTileBytes;      // 2 buffers
  const uint32_t sV = sQ + 3 * kTileBytes;  // kVStages buffers

  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid % 128) / 32;
  const int lane = tid % 32;

  TileSetup<T> tile;
  if (!setup_tile<T, CAUSAL>(p, m_block, head, b, kBlockM, kBlockN, tile)) return;
  const int sq = tile.sq, sk = tile.sk, row0 = tile.row0, n_blocks = tile.n_blocks;
  const int64_t lse_off = tile.lse_off;
  const T* gQ = tile.q;
  const T* gK = tile.k;
  const T* gV = tile.v;
  T* gO = tile.o;

  auto load_kv = [&](int n, int kbuf, int vbuf) {
    const int64_t koff = static_cast<int64_t>(n) * kBlockN;
    load_tile<T>(sK + kbuf * kTileBytes, gK + koff * p.k_row_stride, p.k_row_stride,
                 sk - n * kBlockN, tid);
    load_tile<T>(sV + vbuf * kTileBytes, gV + koff * p.v_row_stride, p.v_row_stride,
                 sk - n * kBlockN, tid);
  };

  load_tile<T>(sQ, gQ, p.q_row_stride, sq - row0, tid);
  if (n_blocks > 0) load_kv(n_blocks - 1, 0, 0);  // step i = 0 uses buffers 0
  cp_async_commit();

  float o[2][32];
#pragma unroll
  for (int d = 0; d < 2; ++d) {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[d][i] = 0.f;
  }
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.f, 0.f};
  const float scale_log2 = p.scale_log2;

  // Descriptors: this warpgroup's 64 rows of Q; K and V buffer 0 (buffer 1 is +kTileBytes).
  const uint64_t q_desc = make_desc(sQ + wg * 64 * 128);
  const uint64_t k_desc = make_desc(sK);
  const uint64_t v_desc = make_desc(sV);
  // n128 variant of P V: the two 64-column halves of V are one operand, LBO = their distance.
  const uint64_t v_desc128 = (v_desc & ~(static_cast<uint64_t>(0x3FFF) << 16)) |
                             (static_cast<uint64_t>(kHalfBytes >> 4) << 16);
  constexpr uint64_t kTileUnits = kTileBytes >> 4;
  constexpr uint64_t kHalfUnits = kHalfBytes >> 4;

  const int g = lane / 4;
  const int t = lane % 4;
  const int wrow = wg * 64 + warp * 16 + g;  // this thread's first row inside the block (+8)

  auto needs_mask = [&](int n) {
    return (n + 1) * kBlockN > sk || (CAUSAL && n * kBlockN + kBlockN - 1 > row0 + sk - sq);
  };

  // The scores of one key tile; in ping-pong mode warpgroup 1 keeps them across the barrier.
  float s[64];

  // S = Q K^T for the key tile in K buffer kbuf.
  auto qk_issue = [&](int kbuf) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint64_t koff = (kk / 4) * kHalfUnits + (kk % 4) * 2;  // 32 bytes per k16
      Wgmma<T>::ss(s, q_desc + koff, k_desc + kbuf * kTileUnits + koff, kk > 0);
    }
    wgmma_commit();
  };
  auto qk_wait = [&]() {
    wgmma_wait0();
    keep(s);
  };
  auto qk = [&](int kbuf) {
    qk_issue(kbuf);
    qk_wait();
  };

  // Masks S for key tile n (end of the keys, causal diagonal).
  auto mask = [&](int n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + wrow + 8 * r;
      const int limit = CAUSAL ? min(sk, row + sk - sq + 1) : sk;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n * kBlockN + 8 * j + 2 * t + e;
          if (col >= limit) s[4 * j + 2 * r + e] = kNegInf;
        }
      }
    }
  };

  // Softmax of S, then O += P V with V buffer vbuf.
  auto softmax_pv = [&](int vbuf) {
    // Online softmax with a stale reference max (see fmha_fwd_kernel.cuh).
    float mx[2];
    bool grow = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int j = 0; j < 16; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      mx[r] = m;
      grow |= (m - row_max[r]) * scale_log2 > 8.f;
    }
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_scaled = (mx[r] == kNegInf) ? 0.f : mx[r] * scale_log2;
        const float alpha = fast_exp2(row_max[r] * scale_log2 - m_scaled);
        row_max[r] = mx[r];
        row_sum[r] *= alpha;
#pragma unroll
        for (int d = 0; d < 2; ++d) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            o[d][4 * j + 2 * r] *= alpha;
            o[d][4 * j + 2 * r + 1] *= alpha;
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_scaled = (row_max[r] == kNegInf) ? 0.f : row_max[r] * scale_log2;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = fast_exp2(fmaf(s[4 * j + 2 * r + e], scale_log2, -m_scaled));
          s[4 * j + 2 * r + e] = x;
          sum += x;
        }
      }
      row_sum[r] += sum;
    }

    // P as the register A operand: k-step kk covers keys 16 kk .. 16 kk + 15, i.e. the
    // accumulator n-tiles 2 kk and 2 kk + 1 (the mma.m16n8k16 A-fragment order).
    uint32_t pa[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      pa[kk][0] = Mma<T>::pack(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = Mma<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = Mma<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = Mma<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      if constexpr (kPvN128) {
        Wgmma<T>::rs128(reinterpret_cast<float(&)[64]>(o), pa[kk],
                        v_desc128 + vbuf * kTileUnits + kk * (16 * 128 >> 4));
      } else {
#pragma unroll
        for (int d = 0; d < 2; ++d) {
          Wgmma<T>::rs(o[d], pa[kk], v_desc + vbuf * kTileUnits + d * kHalfUnits + kk * (16 * 128 >> 4));
        }
      }
    }
    wgmma_commit();
    wgmma_wait0();
    keep(o[0]);
    keep(o[1]);
    keep(pa);
  };

  // Step i handles key tile n = n_blocks - 1 - i: K in buffer i % 2, V in buffer i % kVStages.
  auto step = [&](int i, int n, auto masked) {
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (kLoadAfterQk && (!kPingPong || wg == 0)) {
      qk_issue(i & 1);  // the next tile's cp.async is issued while the tensor cores work
      if (n > 0) load_kv(n - 1, (i + 1) & 1, (i + 1) % kVStages);
      cp_async_commit();
      qk_wait();
      if constexpr (decltype(masked)::value) mask(n);
      softmax_pv(i % kVStages);
      return;
    }
    if (n > 0) load_kv(n - 1, (i + 1) & 1, (i + 1) % kVStages);
    cp_async_commit();
    if (!kPingPong || wg == 0) {
      qk(i & 1);
      if constexpr (decltype(masked)::value) mask(n);
      softmax_pv(i % kVStages);
    } else {
      if (i > 0) softmax_pv((i - 1) % kVStages);
      qk(i & 1);
      if constexpr (decltype(masked)::value) mask(n);
    }
  };

  int i = 0;
  int n = n_blocks - 1;
  for (; n >= 0 && needs_mask(n); --n, ++i) step(i, n, std::true_type{});
  for (; n >= 0; --n, ++i) step(i, n, std::false_type{});
  // Warpgroup 1 is half a step behind: the last tile's softmax and P V (no loads are pending,
  // so its V buffer is intact).
  if (kPingPong && wg == 1 && n_blocks > 0) softmax_pv((n_blocks - 1) % kVStages);

  // Epilogue: normalise, write the LSE, stage O through this warp's own rows of sQ.
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int lrow = wrow + 8 * r;
    const int row = row0 + lrow;
    const float inv = finish_row(p, row_sum[r], row_max[r], scale_log2,
                                 lse_off + head * p.lse_head_stride + row, t == 0 && row < sq);
#pragma unroll
    for (int d = 0; d < 2; ++d) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t v = Mma<T>::pack(o[d][4 * j + 2 * r] * inv, o[d][4 * j + 2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(base + d * kHalfBytes + lrow * 128 + ((j ^ (lrow & 7)) << 4) +
                                     t * 4) = v;
      }
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int idx = i * 32 + lane;
    const int lrow = wg * 64 + warp * 16 + idx / 16;
    const int c = idx % 16;
    if (row0 + lrow < sq) {
      *reinterpret_cast<uint4*>(gO + static_cast<int64_t>(lrow) * p.o_row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(base + (c >> 3) * kHalfBytes + lrow * 128 +
                                          (((c & 7) ^ (lrow & 7)) << 4));
    }
  }
#endif  // KFORGE_FMHA_HAS_SM90_BODY
}

}  // namespace sm90

// True when this library's code for the current device holds the sm_90a kernel body (checked
// once per device: the build's arch list names 90a and the kernel's binary is sm_90).
template <typename T, bool CAUSAL>
bool sm90_available() {
  static int state[64] = {};  // 0: unknown, 1: yes, 2: no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev < 64) {
    const int s = __atomic_load_n(&state[dev], __ATOMIC_ACQUIRE);
    if (s != 0) return s == 1;
  }
  cudaFuncAttributes attr;
  const bool yes = cudaFuncGetAttributes(&attr, sm90::fmha_fwd_sm90_kernel<T, CAUSAL>) == cudaSuccess &&
                   attr.binaryVersion == 90;
  if (dev < 64) __atomic_store_n(&state[dev], yes ? 1 : 2, __ATOMIC_RELEASE);
  return yes;
}

template <typename T, bool CAUSAL>
cudaError_t launch_fwd_sm90(const FwdParams& params, cudaStream_t stream) {
  auto kernel = sm90::fmha_fwd_sm90_kernel<T, CAUSAL>;
  static int configured[64] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 64 || !__atomic_load_n(&configured[dev], __ATOMIC_ACQUIRE)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSmemBytes);
    if (err != cudaSuccess) return err;
    if (dev < 64) __atomic_store_n(&configured[dev], 1, __ATOMIC_RELEASE);
  }
  const dim3 grid((params.seqlen_q + sm90::kBlockM - 1) / sm90::kBlockM, params.num_heads,
                  params.batch);
  kernel<<<grid, sm90::kThreads, sm90::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace kforge_fmha

#define KFORGE_FMHA_INSTANTIATE_SM90(T)                                                        \
  template bool kforge_fmha::sm90_available<T, false>();                                     \
  template bool kforge_fmha::sm90_available<T, true>();                                      \
  template cudaError_t kforge_fmha::launch_fwd_sm90<T, false>(const kforge_fmha::FwdParams&, \
                                                              cudaStream_t);                 \
  template cudaError_t kforge_fmha::launch_fwd_sm90<T, true>(const kforge_fmha::FwdParams&,  \
                                                             cudaStream_t);
