// kforge's harness, not FlashAttention-2's code: it launches FlashAttention-2's backward kernels
// (from a flash-attention source tree on the include path, built by benchmarks/fa2_bwd_tiles.py)
// with a tile chosen by the caller, so that one GPU can time the tile FlashAttention-2 runs on an
// H100 / A100 and the one it runs where a block gets less shared memory (sm_86, sm_89, sm_120:
// 99 KiB). The tiles are the ones flash_bwd_launch_template.h picks (run_mha_bwd_hdim64 / 128 / 192);
// the launch sequence is run_flash_bwd_seqk_parallel's without its switches (no dropout, ALiBi,
// softcap or local window; even K), bf16 only. C entry points, called through ctypes.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "namespace_config.h"
#include "flash.h"
#include "flash_bwd_launch_template.h"

namespace F = FLASH_NAMESPACE;
using T = cutlass::bfloat16_t;

template <int D, bool SMALL>
struct Fa2Tile;
// head dim 64: 144 KiB and more per block / less (flash_bwd_launch_template.h)
template <> struct Fa2Tile<64, false> { using K = ::Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 4, 4, false, false, T>; };
template <> struct Fa2Tile<64, true> { using K = ::Flash_bwd_kernel_traits<64, 64, 128, 8, 2, 4, 4, true, false, T>; };
// head dim 128: the same
template <> struct Fa2Tile<128, false> { using K = ::Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, T>; };
template <> struct Fa2Tile<128, true> { using K = ::Flash_bwd_kernel_traits<128, 64, 64, 8, 4, 2, 2, true, false, T>; };
// head dim 192: 136 KiB and more / less
template <> struct Fa2Tile<192, false> { using K = ::Flash_bwd_kernel_traits<192, 64, 64, 8, 4, 2, 2, false, false, T>; };
template <> struct Fa2Tile<192, true> { using K = ::Flash_bwd_kernel_traits<192, 64, 64, 8, 4, 2, 2, true, true, T>; };

template <class KT, bool CAUSAL>
static int launch(F::Flash_bwd_params& p, cudaStream_t s) {
  const int num_m = (p.seqlen_q + KT::kBlockM - 1) / KT::kBlockM;
  const int num_n = (p.seqlen_k + KT::kBlockN - 1) / KT::kBlockN;
  const dim3 grid_m(num_m, p.b, p.h), grid_n(num_n, p.b, p.h);
  F::flash_bwd_dot_do_o_kernel<true, KT><<<grid_m, KT::kNThreads, 0, s>>>(p);
  // Even M and N (the caller's sequences are multiples of 128) only up to head dim 128, as upstream.
  constexpr bool kEvenMN = KT::kHeadDim <= 128;
  auto kernel = &F::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<KT, false, CAUSAL, false, false,
                                                                 kEvenMN, true, false>;
  constexpr int smem = KT::kSmemSize1colblock;
  if (smem >= 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  kernel<<<grid_n, KT::kNThreads, smem, s>>>(p);
  auto convert = &F::flash_bwd_convert_dq_kernel<KT>;
  if (KT::kSmemdQSize >= 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(convert, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         KT::kSmemdQSize);
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  convert<<<grid_m, KT::kNThreads, KT::kSmemdQSize, s>>>(p, 1);
  return static_cast<int>(cudaGetLastError());
}

template <int D, bool SMALL>
static int run(F::Flash_bwd_params& p, bool causal, cudaStream_t s) {
  using KT = typename Fa2Tile<D, SMALL>::K;
  return causal ? launch<KT, true>(p, s) : launch<KT, false>(p, s);
}

extern "C" {

// Dynamic shared memory of the main kernel of a tile, in bytes (-1: no such tile).
int fa2t_smem(int d, int small) {
  if (d == 64) return small ? Fa2Tile<64, true>::K::kSmemSize1colblock : Fa2Tile<64, false>::K::kSmemSize1colblock;
  if (d == 128) return small ? Fa2Tile<128, true>::K::kSmemSize1colblock : Fa2Tile<128, false>::K::kSmemSize1colblock;
  if (d == 192) return small ? Fa2Tile<192, true>::K::kSmemSize1colblock : Fa2Tile<192, false>::K::kSmemSize1colblock;
  return -1;
}

// The backward of softmax(scale Q K^T) V for contiguous (b, s, h, d) bf16 tensors; lse (b, h, sq)
// fp32 (natural log, as FlashAttention-2's forward returns it); dq_accum (b, sq_rounded, h, d)
// fp32 and dsum (b, h, sq_rounded) fp32 scratch, sq_rounded = sq rounded up to 128. Returns a
// cudaError_t (0: launched), or -1 for a head dim without a tile here.
int fa2t_bwd(int d, int small, int causal, void* q, void* k, void* v, void* o, void* dout,
             void* lse, void* dq, void* dk, void* dv, void* dq_accum, void* dsum, int b, int sq,
             int sk, int h, int h_k, float scale, void* stream) {
  if (d != 64 && d != 128 && d != 192) return -1;
  F::Flash_bwd_params p;
  std::memset(&p, 0, sizeof(p));
  const int64_t row_q = int64_t(h) * d, row_k = int64_t(h_k) * d;
  p.is_bf16 = true;
  p.q_ptr = q; p.k_ptr = k; p.v_ptr = v; p.o_ptr = o;
  p.q_row_stride = row_q; p.k_row_stride = row_k; p.v_row_stride = row_k; p.o_row_stride = row_q;
  p.q_head_stride = d; p.k_head_stride = d; p.v_head_stride = d; p.o_head_stride = d;
  p.q_batch_stride = row_q * sq; p.k_batch_stride = row_k * sk; p.v_batch_stride = row_k * sk;
  p.o_batch_stride = row_q * sq;
  p.do_ptr = dout; p.do_row_stride = row_q; p.do_head_stride = d; p.do_batch_stride = row_q * sq;
  p.dq_ptr = dq; p.dq_row_stride = row_q; p.dq_head_stride = d; p.dq_batch_stride = row_q * sq;
  p.dk_ptr = dk; p.dk_row_stride = row_k; p.dk_head_stride = d; p.dk_batch_stride = row_k * sk;
  p.dv_ptr = dv; p.dv_row_stride = row_k; p.dv_head_stride = d; p.dv_batch_stride = row_k * sk;
  p.softmax_lse_ptr = lse;
  p.dq_accum_ptr = dq_accum;
  p.dsoftmax_sum = dsum;
  p.b = b; p.h = h; p.h_k = h_k; p.h_h_k_ratio = h / h_k;
  p.seqlen_q = sq; p.seqlen_k = sk; p.total_q = b * sq;
  p.seqlen_q_rounded = (sq + 127) / 128 * 128; p.seqlen_k_rounded = (sk + 127) / 128 * 128;
  p.d = d; p.d_rounded = d;
  p.scale_softmax = scale; p.scale_softmax_log2 = scale * float(M_LOG2E);
  p.p_dropout = 1.f; p.p_dropout_in_uint8_t = 255; p.rp_dropout = 1.f;
  p.scale_softmax_rp_dropout = scale;
  p.is_causal = causal != 0;
  p.window_size_left = -1; p.window_size_right = causal ? 0 : -1;
  p.is_seqlens_k_cumulative = true;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (d == 64) return small ? run<64, true>(p, causal, s) : run<64, false>(p, causal, s);
  if (d == 128) return small ? run<128, true>(p, causal, s) : run<128, false>(p, causal, s);
  return small ? run<192, true>(p, causal, s) : run<192, false>(p, causal, s);
}

}  // extern "C"
